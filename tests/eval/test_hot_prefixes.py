"""Hot-prefix workloads and the cache ablation's inputs: prefixes prepended with Zipf popularity, sessions keep
theirs, rates priced with the prefixes, KV capacity from GPU memory, the cache sets disjoint and valid, and the
report's section splice."""

from __future__ import annotations

import re
from collections import Counter

import pytest

from vertumnus.cache.invariants import check_cache
from vertumnus.eval.cache_eval import load_cache_set
from vertumnus.eval.kv_capacity import kv_blocks_per_gpu
from vertumnus.eval.load_patterns import LoadPhase
from vertumnus.eval.protocol import (
    HOT_ID_BASE,
    TRACE_NAMESPACE_BITS,
    HotPrefixes,
    generate,
    generate_records,
    hot_work,
    make_pool,
)
from vertumnus.eval.report import splice
from vertumnus.sim.inputs import load_cost, load_sim_config
from vertumnus.sim.workload import TraceRecord

CFG = load_sim_config(None)
COST = load_cost(CFG)
NS = 1 << TRACE_NAMESPACE_BITS


def _pool():  # type: ignore[no-untyped-def]
    # Sessions: 1-2 share their first block (two turns of one conversation); 3 is a one-off.
    recs = [
        TraceRecord(1, 0.0, 1024, 1, (1, 2)),
        TraceRecord(2, 1.0, 1536, 1, (1, 2, 3)),
        TraceRecord(3, 2.0, 1024, 1, (7, 8)),
        TraceRecord(4, 3.0, 36864, 1, tuple(range(100, 172))),  # a long one (never drawn at long share 0)
    ]
    return make_pool({"hand": recs}, (0.0, 1.0), CFG, COST)


HOT = HotPrefixes(count=4, min_tokens=1024, max_tokens=2048, share=0.75, zipf=1.0, seed=5)


def _split(ids: tuple[int, ...]) -> tuple[int, list[int]]:
    """(prefix index or -1, the rest)."""
    if ids[0] >= HOT_ID_BASE and ids[0] < HOT_ID_BASE + (1 << 40):
        k = (ids[0] - HOT_ID_BASE) >> 20
        n = sum(1 for x in ids if HOT_ID_BASE <= x < HOT_ID_BASE + (1 << 40))
        return k, list(ids[n:])
    return -1, list(ids)


def test_prefixes_are_prepended_with_their_lengths_and_zipf_popularity() -> None:
    blocks = HOT.blocks().tolist()
    assert all(2 <= b <= 4 for b in blocks)
    recs, _ = generate_records([LoadPhase(400.0, 2.0, 0.0)], _pool(), seed=3, hot=HOT)
    chosen = Counter()
    for r in recs:
        k, rest = _split(r.hash_ids)
        base = {1024: 2, 1536: 3}[r.input_len - 512 * (blocks[k] if k >= 0 else 0)]
        assert len(rest) == base  # the source request's own blocks follow the prefix unchanged in count
        chosen[k] += 1
    n = len(recs)
    assert n > 500
    # One-offs draw: share 0.75 with popularity 1 : 1/2 : 1/3 : 1/4 → the first prefix most, the last least.
    with_prefix = [chosen[k] for k in range(4)]
    assert with_prefix[0] > with_prefix[1] > with_prefix[3]


def test_a_session_keeps_one_prefix_so_later_turns_extend_earlier_ones() -> None:
    recs, sources = generate_records([LoadPhase(300.0, 2.0, 0.0)], _pool(), seed=4, hot=HOT)
    by_session = {}
    for r, (_, line) in zip(recs, sources, strict=True):
        if line in (1, 2):  # both turns start with the shared block 1
            k, rest = _split(r.hash_ids)
            assert rest[0] == NS | 1
            by_session.setdefault("s", set()).add(k)
    assert len(by_session["s"]) == 1


def test_rates_price_the_prefixes() -> None:
    pool = _pool()
    priced = hot_work(pool, HOT, COST, list(CFG.pool.degrees))
    assert priced.work_short > pool.work_short  # the same load arrives at a lower rate
    none = hot_work(pool, HOT.model_copy(update={"share": 0.0}), COST, list(CFG.pool.degrees))
    assert none.work_short == pytest.approx(pool.work_short)
    gen = generate("h", [LoadPhase(60.0, 1.0, 0.0)], pool, 1, CFG, HOT, COST)
    assert gen.rates[0][0] == pytest.approx(priced.rate(1.0, 0.0))
    with pytest.raises(ValueError, match="cost model"):
        generate("h", [LoadPhase(60.0, 1.0, 0.0)], pool, 1, CFG, HOT)


def test_bad_hot_prefix_parameters_are_errors() -> None:
    with pytest.raises(ValueError, match="below min_tokens"):
        HotPrefixes(count=2, min_tokens=4096, max_tokens=1024, share=0.5)
    with pytest.raises(ValueError):
        HotPrefixes(count=0, min_tokens=1024, max_tokens=1024, share=0.5)


def test_kv_capacity_from_gpu_memory() -> None:
    bpb = CFG.cache.bytes_per_block  # Qwen3-30B-A3B bf16: 50.3 MB per 512-token block
    assert kv_blocks_per_gpu(80, 61.0, bpb) == 218  # (72 - 61) GB / 50.3 MB
    assert kv_blocks_per_gpu(141, 61.0, bpb) == 1309
    with pytest.raises(ValueError, match="no room"):
        kv_blocks_per_gpu(64, 61.0, bpb)


def test_cache_sets_are_disjoint_and_sized_from_memory() -> None:
    tune, test = load_cache_set("configs/eval/cache-tuning.yaml"), load_cache_set("configs/eval/cache-test.yaml")
    assert tune.requests[1] <= test.requests[0]  # disjoint source requests
    assert not {w.seed for w in tune.workloads} & {w.seed for w in test.workloads}
    assert not {w.name for w in tune.workloads} & {w.name for w in test.workloads}
    caps = test.capacities(CFG.cache.bytes_per_block)
    assert list(caps.values()) == sorted(caps.values()) and len(caps) >= 2


def test_splice_rewrites_only_the_marked_section() -> None:
    doc = "head\n<!-- section:x -->\nold\n<!-- /section:x -->\ntail\n"
    new = "<!-- section:x -->\nnew\n<!-- /section:x -->\n"
    assert splice(doc, "x", new) == "head\n<!-- section:x -->\nnew\n<!-- /section:x -->\ntail\n"
    assert splice("head\n", "x", new) == "head\n\n" + new


def test_queue_aware_fetches_in_the_simulator_and_loses_nothing() -> None:
    from vertumnus.sim.runner import Simulation

    pool = make_pool(
        {"hand": [TraceRecord(i + 1, float(i), 1024 + 512 * (i % 5), 1, (i, 10_000 + i)) for i in range(40)]
         + [TraceRecord(41, 41.0, 36864, 1, tuple(range(20_000, 20_072)))]},
        (0.0, 1.0), CFG, COST,
    )  # fmt: skip
    hot = HotPrefixes(count=3, min_tokens=8192, max_tokens=16384, share=0.9, zipf=1.0, seed=2)
    gen = generate("h", [LoadPhase(40.0, 0.9, 0.0)], pool, 7, CFG, hot, COST)
    runs = {}
    for policy in ("rules", "queue_aware"):
        cfg = CFG.model_copy(deep=True)
        cfg.controller.enabled = False
        cfg.pool.kv_capacity_blocks_per_rank = 64  # pressure: a CP4 worker holds 256 blocks
        cfg.cache.policy = policy  # type: ignore[assignment]
        sim = Simulation(gen.requests, cfg, COST, "vertumnus", "6xCP4+2xCP8")
        runs[policy] = sim.run().summary
        check_cache(sim.pool.cache)
        if policy == "queue_aware":
            stats = sim.pool.cache.stats()
            assert stats["fetch_ordered"] > 0 and stats["replications_confirmed"] > 0
            # The summary splits ordered copies by kind, as the pool's counters have them.
            s = runs[policy]
            assert (s["fetch_copies"], s["push_copies"]) == (stats["fetch_ordered"], stats["hot_ordered"])
            assert s["scan_copies"] == stats["replications_ordered"]
        else:  # rules: every copy comes from the scan
            assert runs[policy]["fetch_copies"] == runs[policy]["push_copies"] == 0
            assert runs[policy]["scan_copies"] == sim.pool.cache.stats()["replications_ordered"]
    for s in runs.values():
        assert s["completed"] == s["requests"] == len(gen.requests)
        assert s["rejected"] == s["failed"] == s["unfinished"] == 0


def test_cache_ablation_runs_every_policy_and_mode_and_renders_its_section(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from vertumnus.config import REPO_ROOT
    from vertumnus.eval.cache_eval import evaluate_cache, verdicts
    from vertumnus.eval.cache_report import render

    trace = REPO_ROOT.parent / "shared" / "traces" / "conversation_first15min.jsonl"
    spec = tmp_path / "tiny.yaml"
    spec.write_text(
        f"name: tiny\ntraces: {{conversation: {trace}}}\nrequests: [0.0, 0.5]\ncomposition: 6xCP4+2xCP8\n"
        "loads: [0.5]\nmemory: {weights_gb: 61.0, gpus: {H100-80GB: 80}}\n"
        "workloads:\n  - {name: w, seed: 9, traces: [conversation], long_share: 0.1, duration_s: 8,\n"
        "     hot_prefixes: {count: 2, min_tokens: 2048, max_tokens: 4096, share: 0.8}}\n"
    )
    res = evaluate_cache(str(spec), "configs/sim-40gpu.yaml")
    assert len(res.runs) == 10  # 1 workload × 1 load × 1 KV size × 2 modes × 5 policies
    assert res.capacities == {"H100-80GB": 218}
    es = load_cache_set(str(spec))
    vs = verdicts(res, es.loads, ["w"])
    parts = ["rules", "queue_aware", "copies_only", "retention_only"]
    assert [(v.mode, v.policy) for v in vs] == [(m, p) for m in ("fixed", "controller") for p in parts]
    assert all(v.lost == 0 for v in vs)
    for mode in ("fixed", "controller"):  # queue_aware's retention alone orders no fetch or push copy
        alone = res.run("w", "H100-80GB", 0.5, mode, "retention_only")
        assert alone["fetch_copies"] == alone["push_copies"] == 0
    text = render(res, es, None, 1.0, "test")
    assert text.startswith("<!-- section:cache-ablation -->") and text.rstrip().endswith(
        "<!-- /section:cache-ablation -->"
    )
    assert "`rules`" in text and "`queue_aware`" in text and "H100-80GB (218 blocks)" in text
    assert re.search(r"`copies_only` \d of 2; `retention_only` \d of 2", text)
    assert "| ordered: fetch / push / scan |" in text


def test_bad_cache_set_is_a_clear_error(tmp_path) -> None:  # type: ignore[no-untyped-def]
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\ntraces: {c: a.jsonl}\nrequests: [0.5, 0.2]\ncomposition: 6xCP4+2xCP8\nloads: [1]\n"
                   "memory: {weights_gb: 61, gpus: {A: 80}}\nworkloads: []\ncolour: red\n")  # fmt: skip
    with pytest.raises(ValueError) as e:
        load_cache_set(str(bad))
    msg = str(e.value)
    assert "colour: unknown key" in msg and "workloads" in msg


def test_replicates_run_every_policy_on_the_same_streams_and_report_their_means() -> None:
    from vertumnus.eval.cache_eval import CacheEvalResult, CacheTask, replicate_seed, verdicts

    assert replicate_seed(3001, 0) == 3001 and replicate_seed(3001, 2) == 3001002
    res = CacheEvalResult("s", "c", "calibrated", {"G": 10}, 1, 0.9)

    def fig(p90: float, slo: float, lost: int = 0) -> dict[str, float | int]:
        return {"p90_ttft_s": p90, "slo_attainment_token_weighted": slo, "mean_ttft_s": p90 / 2,
                "rejected": lost, "failed": 0, "unfinished": 0}  # fmt: skip

    # two streams: norepl P90 1.0 / 3.0 (mean 2.0), queue_aware 0.8 / 2.4 (mean 1.6): −20% on the means,
    # −20% on each stream; the SLO mean (0.96, 0.86) → 0.91 meets a 0.9 target
    for mode in ("fixed", "controller"):
        for k, (b, a, slo) in enumerate([(1.0, 0.8, 0.96), (3.0, 2.4, 0.86)]):
            res.runs[CacheTask("s", "c", "w", "G", 1.0, mode, "norepl", k)] = fig(b, slo)
            res.runs[CacheTask("s", "c", "w", "G", 1.0, mode, "queue_aware", k)] = fig(a, slo, lost=k)
            res.runs[CacheTask("s", "c", "w", "G", 1.0, mode, "rules", k)] = fig(b * 1.1 if k else b * 0.9, slo)
    mean = res.run("w", "G", 1.0, "fixed", "queue_aware")
    assert mean["p90_ttft_s"] == pytest.approx(1.6) and mean["rejected"] == 1  # lost requests are summed
    assert res.run("w", "G", 1.0, "fixed", "norepl")["slo_attainment_token_weighted"] == pytest.approx(0.91)
    assert res.spread("w", "G", 1.0, "fixed", "queue_aware") == pytest.approx((-0.2, -0.2))
    assert res.spread("w", "G", 1.0, "fixed", "rules") == pytest.approx((-0.1, 0.1))
    qa = next(v for v in verdicts(res, [1.0], ["w"]) if v.policy == "queue_aware" and v.mode == "fixed")
    assert qa.slo_load == 1.0 and qa.p90_at_slo_load == pytest.approx(-0.2) and qa.lost == 1 and not qa.passed
    assert qa.slo_range == pytest.approx((-0.2, -0.2)) and qa.worst_load == 1.0
