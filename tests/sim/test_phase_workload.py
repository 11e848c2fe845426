"""Time-varying workload generator: spec parsing, YAML, determinism, phase shape, shared prefixes."""

from __future__ import annotations

from pathlib import Path

import pytest

from vertumnus.sim.phases import Phase, generate, load_workload, parse_phase_spec

CONFIGS = Path(__file__).resolve().parents[2] / "configs" / "workloads"


def test_spec_parses_phases_and_keys() -> None:
    w = parse_phase_spec("phases:100@20/0.05,50@4/0.5;seed=3;long_groups=5")
    assert w.phases == [Phase(100.0, 20.0, 0.05), Phase(50.0, 4.0, 0.5)]
    assert (w.seed, w.long_groups) == (3, 5)
    assert w.phase_bounds() == [(0.0, 100.0), (100.0, 150.0)]


@pytest.mark.parametrize(
    ("spec", "msg"),
    [
        ("poisson:3", "expected 'phases:"),
        ("phases:100@20", "bad phase"),
        ("phases:100@20/1.5", "long share"),
        ("phases:100@20/0.1;colour=red", "unknown workload key"),
        ("phases:100@20/0.1;seed=x", "bad value"),
    ],
)
def test_bad_specs(spec: str, msg: str) -> None:
    with pytest.raises(ValueError, match=msg):
        parse_phase_spec(spec)


def test_generation_is_seeded_and_follows_phases() -> None:
    w = parse_phase_spec("phases:200@20/0.0,200@5/0.5;seed=11")
    a, b = generate(w), generate(w)
    assert a == b
    first = [r for r in a if r.timestamp_s < 200]
    second = [r for r in a if r.timestamp_s >= 200]
    assert 3400 <= len(first) <= 4600 and 800 <= len(second) <= 1200  # Poisson around 4000 and 1000
    assert all(r.input_len <= 32768 for r in first)
    long_share = sum(r.input_len > 32768 for r in second) / len(second)
    assert 0.4 < long_share < 0.6
    assert all(len(r.hash_ids) == -(-r.input_len // 512) for r in a)
    # shared-prefix groups: many requests start with an already-seen first block
    firsts = [r.hash_ids[0] for r in a]
    assert len(set(firsts)) <= 64 + 24
    assert generate(parse_phase_spec("phases:200@20/0.0,200@5/0.5;seed=12")) != a


def test_yaml_workloads_in_configs_load() -> None:
    files = sorted(CONFIGS.glob("*.yaml"))
    assert files, "configs/workloads/ must hold at least one workload"
    for f in files:
        w = load_workload(str(f))
        assert w.phases and w.name
