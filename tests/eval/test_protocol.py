"""Out-of-sample workload generator: determinism, rates and long shares per phase, prefix identity, set split."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from vertumnus.config import REPO_ROOT
from vertumnus.eval.eval_set import load_eval_set
from vertumnus.eval.load_patterns import LoadPhase, build_phases
from vertumnus.eval.protocol import (
    FRESH_ID_BASE,
    TRACE_NAMESPACE_BITS,
    generate,
    generate_records,
    make_pool,
    slice_records,
)
from vertumnus.sim.inputs import load_cost, load_sim_config
from vertumnus.sim.workload import TraceRecord, read_trace

CFG = load_sim_config(None)
COST = load_cost(CFG)
NS = 1 << TRACE_NAMESPACE_BITS  # namespace of the first trace (sorted name order)


def _records() -> list[TraceRecord]:
    """A hand-made source trace: short A, B sharing the prefix [1, 2]; short C with unique ids; long D, E sharing
    [10..79] (70 blocks, 35K tokens), each with a unique tail."""
    long_prefix = tuple(range(10, 80))
    return [
        TraceRecord(1, 0.0, 1536, 1, (1, 2, 3)),
        TraceRecord(2, 1.0, 1536, 1, (1, 2, 4)),
        TraceRecord(3, 2.0, 1024, 1, (5, 6)),
        TraceRecord(4, 3.0, 36864, 1, (*long_prefix, 100, 101)),
        TraceRecord(5, 4.0, 36864, 1, (*long_prefix, 102, 103)),
    ]


def _pool():
    return make_pool({"hand": _records()}, (0.0, 1.0), CFG, COST)


def test_pool_splits_short_and_long_and_prices_load_by_the_cost_model() -> None:
    pool = _pool()
    assert [r.line for r in pool.short] == [1, 2, 3] and [r.line for r in pool.long] == [4, 5]
    # w = min_C C·E_C(L, 0) over degrees 4 and 8 of the pool, averaged per class; λ = load·G / mix.
    w = {L: min(c * COST.predict(c, L, 0) for c in (4, 8)) for L in (1024, 1536, 36864)}
    assert pool.work_short == pytest.approx((2 * w[1536] + w[1024]) / 3)
    assert pool.work_long == pytest.approx(w[36864])
    assert pool.rate(0.5, 0.25) == pytest.approx(0.5 * 40 / (0.75 * pool.work_short + 0.25 * pool.work_long))


def test_generator_is_seeded_and_deterministic() -> None:
    phases = build_phases("steady", {"load": 0.5, "long_share": 0.2, "duration_s": 60})
    a = generate("w", phases, _pool(), 7, CFG)
    b = generate("w", phases, _pool(), 7, CFG)
    c = generate("w", phases, _pool(), 8, CFG)
    key = [(r.request_id, r.arrival_s, r.input_len, r.block_keys) for r in a.requests]
    assert key == [(r.request_id, r.arrival_s, r.input_len, r.block_keys) for r in b.requests]
    assert a.sources == b.sources
    assert key != [(r.request_id, r.arrival_s, r.input_len, r.block_keys) for r in c.requests]


def _within(observed: float, expected: float, sd: float, k: float = 4.0) -> bool:
    return abs(observed - expected) <= k * sd


def test_rates_and_long_shares_per_phase_come_out_as_specified() -> None:
    pool = _pool()
    phases = [
        LoadPhase(300.0, 0.6, 0.05),
        LoadPhase(300.0, 0.2, 0.5),
        LoadPhase(300.0, 0.1, 0.1, load_end=0.7, long_end=0.4),  # linear ramp of both
    ]
    records, _ = generate_records(phases, pool, seed=3)
    ts = np.array([r.timestamp_s for r in records])
    long = np.array([r.input_len > CFG.controller.rules.long_threshold_tokens for r in records])
    for k, ph in enumerate(phases):
        sel = (ts >= 300 * k) & (ts < 300 * (k + 1))
        n = int(sel.sum())
        # Expected count: ∫ λ(t) dt (trapezoid on a fine grid); Poisson, so sd = sqrt(mean); 4 sd tolerance.
        u = np.linspace(0, 1, 2001)
        lam = np.array([pool.rate(*ph.at(x)) for x in u])
        expected = float(np.mean((lam[1:] + lam[:-1]) / 2)) * ph.duration_s
        assert _within(n, expected, math.sqrt(expected)), (k, n, expected)
        # Long share among the phase's arrivals: weighted by the rate when the share moves.
        share = np.array([ph.at(x)[1] for x in u])
        p = float(np.sum(lam * share) / np.sum(lam))
        assert _within(long[sel].sum(), n * p, math.sqrt(n * p * (1 - p))), (k, long[sel].sum(), n * p)


def test_alternating_ramp_spike_sine_patterns_have_the_stated_layout() -> None:
    alt = build_phases("alternating", {"high": {"load": 0.9, "long_share": 0.02}, "low": {"load": 0.3,
                       "long_share": 0.3}, "high_s": 40, "low_s": 60, "phases": 3, "start": "low"})  # fmt: skip
    assert [(p.label, p.duration_s, p.load, p.long_share) for p in alt] == [
        ("low", 60, 0.3, 0.3), ("high", 40, 0.9, 0.02), ("low", 60, 0.3, 0.3)
    ]  # fmt: skip
    ramp = build_phases("ramp", {"from_load": 0.2, "to_load": 1.0, "long_share": 0.1, "ramp_s": 100, "steps": 4,
                                 "hold_after_s": 10})  # fmt: skip
    assert [x for p in ramp[:4] for x in (p.load, p.load_end)] == pytest.approx(
        [0.2, 0.4, 0.4, 0.6, 0.6, 0.8, 0.8, 1.0]
    )
    assert ramp[4].label == "hold" and ramp[4].load == 1.0 and ramp[4].load_end is None
    spike = build_phases("spike", {"base": {"load": 0.4, "long_share": 0.1}, "pulse": {"load": 1.1,
                         "long_share": 0.0}, "before_s": 10, "pulse_s": 5, "after_s": 20, "count": 2})  # fmt: skip
    assert [p.label for p in spike] == ["base", "pulse", "base", "pulse", "base"]
    sine = build_phases("sine", {"mean_load": 0.6, "amplitude": 0.3, "period_s": 100, "half_periods": 2,
                                 "long_at_high": 0.0, "long_at_low": 0.2, "start": "low"})  # fmt: skip
    rising = sine[0]
    assert rising.at(0.0) == pytest.approx((0.3, 0.2)) and rising.at(1.0) == pytest.approx((0.9, 0.0))
    assert rising.at(0.5)[0] == pytest.approx(0.6)  # half-cosine: the mean at mid-phase, like a sine
    assert sine[1].at(1.0) == pytest.approx((0.3, 0.2))


def test_unknown_pattern_and_bad_parameters_are_errors() -> None:
    with pytest.raises(ValueError, match="unknown workload pattern 'zigzag'"):
        build_phases("zigzag", {})
    with pytest.raises(ValueError, match=r"pattern 'steady'.*long_share"):
        build_phases("steady", {"load": 0.5, "long_share": 1.5, "duration_s": 10})
    with pytest.raises(ValueError, match="pattern 'steady': rate: Extra inputs"):
        build_phases("steady", {"load": 0.5, "long_share": 0.1, "duration_s": 10, "rate": 3})


def test_shared_prefixes_stay_shared_and_unique_ids_are_fresh_per_draw() -> None:
    phases = [LoadPhase(200.0, 0.5, 0.3)]
    records, sources = generate_records(phases, _pool(), seed=11)
    by_line: dict[int, list[tuple[int, ...]]] = {}
    for rec, (trace, line) in zip(records, sources, strict=True):
        assert trace == "hand"
        by_line.setdefault(line, []).append(rec.hash_ids)
    assert all(len(v) >= 3 for v in by_line.values()), {k: len(v) for k, v in by_line.items()}
    # A, B: the shared prefix [1, 2] keeps its (namespaced) identity in every draw; the tail is fresh each time.
    for line in (1, 2):
        for ids in by_line[line]:
            assert ids[:2] == (NS | 1, NS | 2) and ids[2] >= FRESH_ID_BASE
    # C: no id is shared in the source, so no two draws share any id (not a free full cache hit).
    # D, E: the 70-block document prefix is shared across both and all their draws.
    for line in (4, 5):
        for ids in by_line[line]:
            assert ids[:70] == tuple(NS | h for h in range(10, 80)) and min(ids[70:]) >= FRESH_ID_BASE
    fresh = [h for ids_list in by_line.values() for ids in ids_list for h in ids if h >= FRESH_ID_BASE]
    assert len(fresh) == len(set(fresh))  # every fresh id is used exactly once in the workload
    # Through the request builder: copies of C share no block key; copies of A share exactly their 2-block prefix.
    gen = generate("w", phases, _pool(), 11, CFG)
    keys = {line: [r.block_keys for r, (_, ln) in zip(gen.requests, gen.sources, strict=True) if ln == line]
            for line in (1, 3)}  # fmt: skip
    assert len({k for ks in keys[3] for k in ks}) == 2 * len(keys[3])
    assert len({ks[:2] for ks in keys[1]}) == 1 and len({ks[2] for ks in keys[1]}) == len(keys[1])


def test_ids_are_shared_only_within_the_source_range() -> None:
    # Requests 1 and 2 share [1, 2]; split at the middle they fall into different halves, so in each half
    # those ids are unique and get fresh ids: nothing carries over from the other half.
    recs = _records()[:2]
    first = make_pool({"hand": recs}, (0.0, 0.5), CFG, COST)
    assert [r.line for r in first.short] == [1] and first.short[0].shared == (False, False, False)


SETS = REPO_ROOT / "configs" / "eval"


def test_tuning_and_test_sets_are_disjoint_in_seeds_requests_and_patterns() -> None:
    tuning, test = load_eval_set(SETS / "tuning.yaml"), load_eval_set(SETS / "test.yaml")
    assert not {w.seed for w in tuning.workloads} & {w.seed for w in test.workloads}
    (a0, a1), (b0, b1) = tuning.requests, test.requests
    assert a1 <= b0 or b1 <= a0  # disjoint fraction ranges
    assert tuning.traces == test.traces
    # Same traces, disjoint source lines.
    for path in tuning.traces.values():
        recs, _ = read_trace(REPO_ROOT / path if not Path(path).is_absolute() else path)
        lines_a = {r.line for r in slice_records(recs, tuning.requests)}
        lines_b = {r.line for r in slice_records(recs, test.requests)}
        assert lines_a and lines_b and not lines_a & lines_b
    # No workload shape (pattern + parameters) appears in both sets.
    shapes = {(w.pattern, repr(sorted(w.params.items()))) for w in tuning.workloads}
    assert not shapes & {(w.pattern, repr(sorted(w.params.items()))) for w in test.workloads}
    # The test set has ≥ 8 time-varying shapes plus steady workloads at several loads.
    varying = [w for w in test.workloads if w.pattern != "steady"]
    steady = sorted(w.params["load"] for w in test.workloads if w.pattern == "steady")
    assert len(varying) >= 8 and len({w.pattern for w in varying}) >= 5 and len(steady) >= 4
    assert steady[0] <= 0.3 and steady[-1] >= 1.1


def test_generated_workloads_draw_only_from_their_sets_range() -> None:
    for name, workload in (("tuning.yaml", "plateau"), ("test.yaml", "long-plateau")):
        es = load_eval_set(SETS / name)
        w = es.workload(workload)
        gen = es.generate(workload, CFG, COST)
        for trace in w.traces:
            recs, _ = read_trace(REPO_ROOT / es.traces[trace])
            allowed = {r.line for r in slice_records(recs, es.requests)}
            used = {line for t, line in gen.sources if t == trace}
            assert used and used <= allowed
