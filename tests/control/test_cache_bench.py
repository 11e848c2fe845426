"""The cache benchmark helpers build the trie they claim and report every figure (timings are printed by the
benchmark command, not asserted here)."""

from __future__ import annotations

from vertumnus.bench import trie as bench
from vertumnus.cache.invariants import check_cache


def test_synthetic_trie_has_the_announced_shape() -> None:
    families, prompts = bench.shape(5000)
    assert (families, prompts) == (5, 151)
    st = bench.build_trie(5000, n_workers=8)
    assert st.manager.trie.n_nodes == families * 32 + prompts * 32
    held = st.manager.lookup(st.prompt(9)).held_blocks
    assert held[9 % 8] == 64  # the worker that stored prompt 9 holds all of it
    assert all(n == 32 for w, n in held.items() if w != 9 % 8)  # others share the family head only
    check_cache(st.manager)


def test_figures_report_every_metric() -> None:
    out = bench.figures(n_nodes=3000, n_workers=4, active=(200, 600), match_repeats=50)
    assert out["trie_nodes"] == 3 * 32 + 90 * 32
    assert out["scan_active_nodes"] >= 200
    for key in (
        "scan_ms",
        "bytes_per_trie_node",
        "peak_bytes_per_trie_node",
        "match_us_p50",
        "match_us_p99",
        "match_record_us_p50",
        "match_record_us_p99",
    ):
        assert out[key] > 0
    assert sum(k.startswith("scan_ms_active_") for k in out) == 2
    assert sum(k.startswith("scan_cpu_ms_active_") for k in out) == 2
