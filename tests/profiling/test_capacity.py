"""κ_C: FCFS recurrence, tie spreading, single-worker prefix cache, the load ladder, monotonicity in the target."""

from __future__ import annotations

import itertools
from functools import partial
from pathlib import Path

import numpy as np
import pytest

from vertumnus.config import load_config
from vertumnus.cost_model import CostModel, CostProfile
from vertumnus.profiling.capacity import (
    CapacityPoint,
    CapacityWorkload,
    cached_prefixes,
    fcfs_finish,
    kappa_from_curve,
    load_workload,
    measure_capacity,
    spread_ties,
)
from vertumnus.profiling.targets import SimTarget


def test_fcfs_finish_matches_the_recurrence() -> None:
    arrivals = np.array([0.0, 1.0, 1.5, 10.0, 10.0])
    service = np.array([2.0, 1.0, 1.0, 1.0, 0.5])
    # f0 = 2; f1 = max(1, 2) + 1 = 3; f2 = max(1.5, 3) + 1 = 4; f3 = max(10, 4) + 1 = 11; f4 = 11 + 0.5
    np.testing.assert_allclose(fcfs_finish(arrivals, service), [2.0, 3.0, 4.0, 11.0, 11.5])
    rng = np.random.default_rng(3)
    a = np.sort(rng.uniform(0, 50, 400))
    s = rng.exponential(0.2, 400)
    f, loop = fcfs_finish(a, s), []
    prev = 0.0
    for ai, si in zip(a, s, strict=True):
        prev = max(ai, prev) + si
        loop.append(prev)
    np.testing.assert_allclose(f, loop, rtol=1e-12)


def test_spread_ties_spaces_quantised_arrivals() -> None:
    got = spread_ties(np.array([5.0, 5.0, 5.0, 8.0, 8.0, 11.0]))
    # runs at 0 (3 requests, gap 3), 3 (2 requests, gap 3) and 6 (last run: median gap 3, 1 request)
    np.testing.assert_allclose(got, [0.0, 1.0, 2.0, 3.0, 4.5, 6.0])
    np.testing.assert_allclose(spread_ties(np.array([0.0, 0.4, 2.0])), [0.0, 0.4, 2.0])  # distinct: unchanged


def test_single_worker_lru_prefix_cache() -> None:
    a, b, c, d = 11, 12, 13, 14  # chained block keys
    work = CapacityWorkload(
        arrivals=np.arange(5, dtype=np.float64),
        lengths=np.array([1100, 1100, 1024, 700, 1600]),
        block_keys=((a, b), (a, b), (a, b), (c,), (a, d, 99)),
        source="hand-made",
        capped=0,
    )
    # capacity 3 blocks: r0 misses; r1 reuses 2 blocks (1024 tokens); r2 is exactly 2 blocks long: reuse is
    # capped at L − 1 = 1023; r3 inserts c (cache a, b, c); r4 reuses a, inserts d and 99 -> evicts b then c.
    np.testing.assert_array_equal(cached_prefixes(work, 3), [0, 1024, 1023, 0, 512])
    np.testing.assert_array_equal(cached_prefixes(work, 0), [0, 0, 0, 0, 0])


def test_kappa_is_the_last_level_before_the_first_miss() -> None:
    pts = [CapacityPoint(u, 10 * u, att, 0.0) for u, att in ((0.1, 0.99), (0.2, 0.95), (0.4, 0.85), (0.8, 0.95))]
    assert kappa_from_curve(pts, 0.9) == pytest.approx(2.0)  # 0.4 misses; the later 0.8 never counts
    assert kappa_from_curve(pts, 0.8) == pytest.approx(8.0)
    assert kappa_from_curve(pts, 0.999) == 0.0


def test_kappa_monotone_in_the_slo_target(planted_config: Path, excerpt: Path) -> None:
    cfg = load_config(planted_config)
    model = CostModel(CostProfile.load(cfg.resolve_path(cfg.cost_model.profile)))
    work = load_workload(excerpt, cfg.pool.max_model_len)
    assert len(work.lengths) == 300 and work.capped > 0 and int(work.lengths.max()) == 65536
    targets = (0.5, 0.7, 0.8, 0.9, 0.95, 0.99)
    for degree in (1, 2, 4):
        kappas = []
        for t in targets:
            cfg.slo.target_attainment = t
            kappas.append(measure_capacity(degree, model, work, cfg).kappa)
        assert all(k1 >= k2 for k1, k2 in itertools.pairwise(kappas)), (degree, kappas)
        assert kappas[0] > kappas[-1] > 0, (degree, kappas)  # the target matters on this trace
        assert kappas[0] <= cfg.controller.window_s


def test_kappa_zero_when_unloaded_worker_misses_the_slo(planted_config: Path, excerpt: Path) -> None:
    cfg = load_config(planted_config, overrides={"slo": {"base_s": 0.0, "per_token_s": 0.0, "t_ext_s": 0.05}})
    model = CostModel(CostProfile.load(cfg.resolve_path(cfg.cost_model.profile)))
    res = measure_capacity(1, model, load_workload(excerpt, 65536, limit=50), cfg)
    assert res.kappa == 0.0 and res.points[0].attainment == 0.0  # TTFT ≥ T_ext > τ = 0 for everyone


def test_real_capacity_engine_with_a_noiseless_target_matches_the_model(planted_config: Path, excerpt: Path) -> None:
    cfg = load_config(planted_config)
    prof = CostProfile.load(cfg.resolve_path(cfg.cost_model.profile))
    work = load_workload(excerpt, 16384, limit=120)
    for degree in (1, 4):
        by_model = measure_capacity(degree, CostModel(prof), work, cfg)
        ticks: list[int] = []
        by_engine = measure_capacity(degree, CostModel(prof), work, cfg, SimTarget(prof), partial(ticks.append, 1))
        assert (by_model.service, by_engine.service) == ("model", "real")
        assert by_engine.points == by_model.points and by_engine.kappa == by_model.kappa > 0
        assert len(ticks) == 120


def test_workload_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="trace file not found"):
        load_workload(tmp_path / "missing.jsonl", 1024)
    one = tmp_path / "one.jsonl"
    one.write_text('{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": []}\n')
    with pytest.raises(ValueError, match="need at least 2 valid requests"):
        load_workload(one, 1024)
    one.write_text(one.read_text() * 3)
    with pytest.raises(ValueError, match="same instant"):
        load_workload(one, 1024)
