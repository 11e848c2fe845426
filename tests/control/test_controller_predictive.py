"""The predictive controller (``controller.policy: predictive``): the replay model, the forecast, and its
decisions on small scenarios with exact expected operations, run on the real pool over the sim data plane.

Calibrated H200 profile (configs/profiles/qwen3-30b-a3b-h200.yaml): a 4K-token prefill takes ~0.11 s on CP4
and ~0.13 s on CP8; a 64K one 1.85 s on CP4 and 1.28 s on CP8. 5-s windows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, replace
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vertumnus.config import DEFAULT_PROFILE, REPO_ROOT, config_from_dict
from vertumnus.controller.forecast import ArrivalLog
from vertumnus.controller.replay import ReplayArrivals, ReplayWorkers, replay_mean_ttft
from vertumnus.controller.scoring import observed_stress, observed_switch
from vertumnus.cost_model import CostModel
from vertumnus.sim.runner import DecisionDelay, SimHook, Simulation
from vertumnus.sim.workload import TraceRecord, build_requests
from vertumnus.types import ReconfigKind

COST = CostModel.from_file(REPO_ROOT / DEFAULT_PROFILE)


def cfg(nodes: int, pool: dict[str, Any] | None = None, **predictive: Any) -> Any:
    """A predictive pool of ``nodes`` 8-GPU nodes (``predictive``: keys of ``controller.predictive``)."""
    return config_from_dict(
        {
            "pool": {"nodes": nodes, "gpus_per_node": 8, "degrees": [4, 8], "engine": "sim",
                     "max_model_len": 131072, "kv_capacity_blocks_per_rank": 1024, **(pool or {})},
            "controller": {"policy": "predictive", "window_s": 5.0, "predictive": predictive},
            "cache": {"replication": False},
            "slo": {"base_s": 1.0, "per_token_s": 0.00004},
        }
    )  # fmt: skip


def requests(config: Any, times: list[float], length: int) -> list[Any]:
    """Requests of ``length`` tokens with unique blocks (no cache hits) arriving at ``times``."""
    blocks = length // 512
    recs = [
        TraceRecord(i + 1, t, length, 1, tuple(range(i * blocks + 1, (i + 1) * blocks + 1)))
        for i, t in enumerate(times)
    ]
    return build_requests(recs, config, origin_s=0.0)


def sim(config: Any, reqs: list[Any], start: str, hooks: Sequence[SimHook] = (), **params: Any) -> Simulation:
    """A simulation of the ``vertumnus`` policy with the predictive parameters of ``config`` changed by ``params``
    (the module constants included); split checks every check_interval_s from the start (no start-up checks
    unless a test asks for them)."""
    s = Simulation(reqs, config, COST, "vertumnus", start, hooks=hooks)
    ctl = s.pool.controller
    assert ctl.params is not None
    ctl.use_params(replace(ctl.params, **{"startup_check_interval_s": None, **params}))
    return s


def run(config: Any, reqs: list[Any], start: str, **params: Any) -> Any:
    return sim(config, reqs, start, **params).run()


def began(rec: Any) -> float:
    """When a committed reconfiguration began (records carry the commit instant)."""
    return float(rec.time_s - rec.drain_s - rec.switch_s)


# -- the replay model ---------------------------------------------------------------------------------------
def test_replay_places_by_j_and_counts_queueing_exactly() -> None:
    # one CP4 busy for 1 s, one CP4 idle; three 1-s requests at t = 0, 0, 0.5 (same Ê on both)
    workers = ReplayWorkers({4: [1.0, 0.0]})
    arrivals = ReplayArrivals(np.array([0.0, 0.0, 0.5]), {4: np.array([1.0, 1.0, 1.0])})
    # r0 → idle worker (TTFT 1, frees at 1); r1 → either worker, q = 1 (TTFT 2, frees at 2);
    # r2 at 0.5 → the one freeing at 1: q = 0.5, TTFT 1.5
    assert replay_mean_ttft(workers, arrivals, beta=1.0, lam=0.0) == pytest.approx((1.0 + 2.0 + 1.5) / 3)
    # known TTFTs of queued requests count in the mean
    assert replay_mean_ttft(workers, arrivals, 1.0, 0.0, [3.0]) == pytest.approx((1.0 + 2.0 + 1.5 + 3.0) / 4)


def test_replay_occupancy_cost_keeps_short_requests_off_the_large_degree() -> None:
    # CP4 and CP8 idle; Ê_4 = 1.0, Ê_8 = 0.95: J_8 = 0.95·(1 + λ·1) > 1.0 at λ = 0.1 → CP4 (TTFT 1.0)
    workers = ReplayWorkers({4: [0.0], 8: [0.0]})
    arrivals = ReplayArrivals(np.array([0.0]), {4: np.array([1.0]), 8: np.array([0.95])})
    assert replay_mean_ttft(workers, arrivals, 1.0, 0.1) == pytest.approx(1.0)
    assert replay_mean_ttft(workers, arrivals, 1.0, 0.0) == pytest.approx(0.95)
    assert replay_mean_ttft(ReplayWorkers({4: []}), arrivals, 1.0, 0.0) == float("inf")


def _replay_by_brute_force(
    free_at: dict[int, list[float]], t: list[float], est: dict[int, list[float]], beta: float, lam: float
) -> float:
    """The replay's rule over every worker, no heaps: argmin J, ties to the lower degree (the reference)."""
    free = {c: list(v) for c, v in free_at.items() if v}
    c_min = min(free)
    total = 0.0
    for i, ti in enumerate(t):
        options = [
            (max(0.0, f - ti) + (beta + lam * (c - c_min) / c_min) * est[c][i], c, k)
            for c in sorted(free)
            for k, f in enumerate(free[c])
        ]
        _, c, k = min(options, key=lambda o: (o[0], o[1], free[o[1]][o[2]]))
        ttft = max(0.0, free[c][k] - ti) + est[c][i]
        total += ttft
        free[c][k] = ti + ttft
    return total / len(t)


@st.composite
def _replay_cases(draw: st.DrawFn) -> tuple[dict[int, list[float]], list[float], dict[int, list[float]]]:
    degrees = draw(st.sampled_from([[4], [4, 8], [2, 4, 8]]))
    seconds = st.floats(0.0, 5.0, allow_nan=False)
    free_at = {c: draw(st.lists(seconds, min_size=1, max_size=4)) for c in degrees}
    n = draw(st.integers(1, 30))
    t = sorted(draw(st.lists(seconds, min_size=n, max_size=n)))
    est = {c: draw(st.lists(st.floats(0.01, 2.0), min_size=n, max_size=n)) for c in degrees}
    return free_at, t, est


@settings(max_examples=300, deadline=None)
@given(_replay_cases())
def test_replay_equals_the_rule_applied_to_every_worker(
    case: tuple[dict[int, list[float]], list[float], dict[int, list[float]]],
) -> None:
    # The heap per degree (and the unrolled two-degree loop) must give what the placement rule over every
    # worker gives, for one, two and three degrees.
    free_at, t, est = case
    arrivals = ReplayArrivals(np.array(t), {c: np.array(v) for c, v in est.items()})
    got = replay_mean_ttft(ReplayWorkers(free_at), arrivals, 1.0, 0.1)
    assert got == pytest.approx(_replay_by_brute_force(free_at, t, est, 1.0, 0.1), rel=1e-9)


def test_forecast_replays_a_busy_span_as_recorded_and_a_quiet_one_at_its_rate() -> None:
    log = ArrivalLog(keep_s=10.0, keep_n=4)
    log.add(50.0, 900, 0)  # the log is older than the span
    for k in range(6):
        log.add(100.0 + 0.5 * k, 1000 + k, 0)  # a burst at 100.0 .. 102.5
    # busy: ≥ 4 arrivals within the last 10 s → their own offsets from now − 10
    assert log.forecast(105.0, 10.0, 4) == [(5.0 + 0.5 * k, 1000 + k, 0) for k in range(6)]
    # quiet: one arrival in the last 10 s → the mix of the last 4 arrivals, one per 10 s
    log.add(118.0, 2000, 512)
    assert log.forecast(120.0, 10.0, 4) == [(0.0, 1003, 0), (10.0, 1004, 0), (20.0, 1005, 0), (30.0, 2000, 512)]
    # idle: none in the span → one per span
    assert [e[0] for e in log.forecast(200.0, 10.0, 4)] == [0.0, 10.0, 20.0, 30.0]


def test_a_log_younger_than_the_span_repeats_what_it_saw_instead_of_forecasting_an_empty_head() -> None:
    log = ArrivalLog(keep_s=10.0, keep_n=4)
    for k in range(8):
        log.add(0.5 * k, 1000 + k, 0)  # the pool started at 0: 2 req/s for 4 s, seen 0 .. 3.5
    # at 4 s only 4 s are known: tiled with period 4 over the 10-s span (offsets 0..9.5, the cut at 10 drops none
    # of the third copy's first four), not placed at 6..9.5 behind 6 empty seconds
    got = log.forecast(4.0, 10.0, 4)
    assert got == [(0.5 * k + 4.0 * r, 1000 + k, 0) for r in range(3) for k in range(8) if 0.5 * k + 4.0 * r < 10]
    assert len(got) == 20  # 2 req/s over the whole 10-s span
    # once the log covers the span, the span's arrivals at their own offsets (as before)
    for k in range(8, 24):
        log.add(0.5 * k, 1000 + k, 0)
    assert log.forecast(12.0, 10.0, 4) == [(0.5 * k - 2.0, 1000 + k, 0) for k in range(4, 24)]
    # a quiet young log is still forecast as quiet: one arrival at 0.2 s, seen at 1 s
    young = ArrivalLog(keep_s=10.0, keep_n=4)
    young.add(0.2, 500, 0)
    assert young.forecast(1.0, 10.0, 4) == [(0.0, 500, 0)]
    # a busy young log below min_n arrivals is forecast at the rate it has seen: 3 arrivals at 0, 0.25, 0.5 s,
    # seen at 0.5 s → 2 per 0.5 s, one per 0.25 s, the mix repeated over the 10-s span (not 3 over 10 s)
    busy = ArrivalLog(keep_s=10.0, keep_n=8)
    for k in range(3):
        busy.add(0.25 * k, 100 + k, 0)
    assert busy.forecast(0.5, 10.0, 8) == [(0.25 * k, 100 + k % 3, 0) for k in range(40)]


# -- decisions on the real pool (sim data plane) ------------------------------------------------------------
@pytest.mark.parametrize(("check_s", "startup_s", "at"), [(1.0, None, 1.0), (None, None, 5.0), (1.0, 0.1, 0.1)])
def test_overload_after_a_merge_splits_at_the_first_check(
    check_s: float | None, startup_s: float | None, at: float
) -> None:
    # 1 node as 1xCP8; 4K-token requests at 12 req/s ≈ 1.5 s of CP8 work per second: the queue grows from
    # the start. The first split check (1 s; without checks: the first window end, 5 s; with start-up checks
    # every 0.1 s: at 0.1 s, where the second request, in at 0.083 s, waits) splits worker 0 into 2xCP4
    # (workers 1, 2), and nothing merges back while the load lasts.
    c = cfg(1, check_interval_s=check_s)
    times = [k / 12 for k in range(12 * 20)]
    res = run(c, requests(c, times, 4096), "1xCP8", startup_check_interval_s=startup_s)
    assert [(r.kind, r.sources, r.targets) for r in res.reconfigs] == [("split", (0,), (1, 2))]
    assert began(res.reconfigs[0]) == pytest.approx(at)
    assert res.summary["completed"] == len(times) and res.summary["rejected"] == 0


def test_no_split_check_runs_once_nothing_can_split() -> None:
    # The overload scenario above: split checks every second while worker 0 (CP8) can split; after its split
    # the pool is 2xCP4 (CP4 is the smallest degree) and a check could only say "stay": none is computed from
    # then on, while the window ends still decide (a merge back is still a move).
    c = cfg(1, check_interval_s=1.0)
    times = [k / 12 for k in range(12 * 20)]
    s = sim(c, requests(c, times, 4096), "1xCP8")
    seen: list[tuple[float, bool]] = []
    s.pool.controller.add_observer(lambda job, d, acted: seen.append((job.now, job.report is None)))
    res = s.run()
    assert [(r.kind, r.sources, r.targets) for r in res.reconfigs] == [("split", (0,), (1, 2))]
    split_at = began(res.reconfigs[0])
    checks = [t for t, check in seen if check]
    windows = [t for t, check in seen if not check]
    assert checks == [pytest.approx(split_at)]  # the check that split; none after it
    assert len(windows) >= 4 and all(t > split_at for t in windows)
    assert res.summary["completed"] == len(times)


@pytest.mark.parametrize(("span_s", "lo", "hi"), [(20.0, 6.2, 7.05), (5.0, 7.0, 7.2)])
def test_start_up_checks_last_their_span_from_the_first_arrival(span_s: float, lo: float, hi: float) -> None:
    # 1 node as 1xCP8; a 4K-token request every 0.5 s from 0 (0.13 s each: nothing waits, no decision on so few
    # arrivals), then from 6.2 s 24 req/s (~3 s of CP8 work per second). Start-up checks every 0.1 s for span_s
    # after the first arrival (0 s), the 1-s checks after it (their grid continues from the last start-up
    # check, ~5.1 s). Within a 20-s start-up the split begins at a 0.1-s check once the replay says it wins
    # (6.9 s), before the 1-s grid's next check; within a 5-s one at that check, ~7.1 s.
    c = cfg(1, check_interval_s=1.0)
    times = [0.5 * k for k in range(13)] + [6.2 + k / 24 for k in range(24 * 10)]
    res = run(c, requests(c, times, 4096), "1xCP8", startup_check_interval_s=0.1, startup_span_s=span_s)
    assert [(r.kind, r.sources, r.targets) for r in res.reconfigs] == [("split", (0,), (1, 2))]
    assert lo < began(res.reconfigs[0]) < hi
    assert res.summary["completed"] == len(times)


def test_light_long_load_after_a_split_merges_only_after_two_windows() -> None:
    # 1 node as 2xCP4; one 64K-token request every 4 s: CP8 serves each in 1.28 s instead of 1.85 s and
    # nothing queues. At 5 s the request of 4 s still runs (to 5.85 s): merging would make the next arrival
    # wait for it plus the switch, so staying is better. From 10 s on the merge pays; it is made after
    # merge_persist_windows (2) windows wanting it, at 15 s.
    c = cfg(1)
    times = [4.0 * k for k in range(10)]
    res = run(c, requests(c, times, 65536), "2xCP4")
    assert [(r.kind, r.sources, r.targets) for r in res.reconfigs] == [("merge", (0, 1), (2,))]
    assert began(res.reconfigs[0]) == pytest.approx(15.0)
    assert res.summary["completed"] == len(times)


def test_a_window_report_and_the_pool_snapshot_carry_the_decisions_trail() -> None:
    # The light long load above: the window end that merges (15 s) recorded the checks that let the merge through
    # (no split can be scored on 2xCP4, the smallest degree); /v1/pool shows the last window's trail.
    c = cfg(1)
    times = [4.0 * k for k in range(10)]
    s = sim(c, requests(c, times, 65536), "2xCP4")
    s.run()
    (acted,) = [r for r in s.pool.controller.reports if r.acted]
    assert [(x.name, x.passed) for x in acted.trail] == [("merge margin", True), ("merge stress", True)]
    assert acted.trail[0].value < acted.trail[0].threshold == pytest.approx(0.95)
    last = s.pool.snapshot().last_window
    assert last is not None
    assert last["trail"] == [asdict(x) for x in s.pool.controller.reports[-1].trail]


def test_the_same_light_load_keeps_the_split_while_merges_must_persist_longer() -> None:
    c = cfg(1, merge_persist_s=500.0)
    times = [4.0 * k for k in range(10)]
    res = run(c, requests(c, times, 65536), "2xCP4")
    assert res.reconfigs == []


def test_a_burst_far_above_capacity_splits_two_blocks_at_once() -> None:
    # 2 nodes as 2xCP8; 4K-token requests at 30 req/s ≈ 3.9 s of CP8 work per second (two CP8 serve ~15
    # req/s): one decision (the 1-s check) starts both splits together; they run concurrently under the
    # epoch protocol (two plans in flight) and every request completes.
    c = cfg(2)
    times = [k / 30 for k in range(30 * 15)]
    res = run(c, requests(c, times, 4096), "2xCP8")
    got = [(r.kind, r.sources, r.targets) for r in res.reconfigs]
    assert sorted(got) == [("split", (0,), (2, 3)), ("split", (1,), (4, 5))]
    assert [began(r) for r in res.reconfigs] == pytest.approx([1.0, 1.0])
    assert res.summary["completed"] == len(times) and res.summary["rejected"] == 0


def test_observed_stress_is_the_peak_window_over_the_recent_mean_within_one_and_the_cap() -> None:
    assert observed_stress([10.0, 12.0, 9.0, 11.0], 2, 2.0) == pytest.approx(1.2)  # steady: the noise, 12 / 10
    assert observed_stress([10.0, 40.0, 10.0, 10.0], 2, 2.0) == 2.0  # a burst remembered: the cap
    assert observed_stress([5.0, 10.0, 10.0], 2, 2.0) == 1.0  # rising to its peak now: at least 1
    assert observed_stress([], 2, 2.0) == 2.0 and observed_stress([3.0, 0.0, 0.0], 2, 2.0) == 2.0  # nothing lately


def test_the_switch_price_is_the_mean_switch_observed_or_the_configured_one() -> None:
    assert observed_switch([], 0.8) == 0.8
    assert observed_switch([0.002, 0.004], 0.8) == pytest.approx(0.003)


def test_the_switch_the_engine_took_prices_the_next_move() -> None:
    # The overload of test_overload_after_a_merge_splits_at_the_first_check on an engine whose switch takes 3 s
    # (pool.sim_switch_s) while the controller was configured with 0.8 s: the split at 1 s commits 3 s after its
    # (instant) drain, and from then on a move is priced at the 3 s the engine took.
    c = cfg(1, pool={"sim_switch_s": 3.0}, switch_s=0.8)
    times = [k / 12 for k in range(12 * 20)]
    s = sim(c, requests(c, times, 4096), "1xCP8")
    assert s.pool.controller.switch_estimate() == 0.8  # nothing observed yet: the configured prior
    res = s.run()
    assert [(r.kind, r.sources, r.targets) for r in res.reconfigs] == [("split", (0,), (1, 2))]
    assert res.reconfigs[0].switch_s == pytest.approx(3.0)
    assert s.pool.controller.switch_estimate() == pytest.approx(3.0)
    assert res.summary["completed"] == len(times)


def test_no_decision_on_a_handful_of_first_arrivals() -> None:
    # 2xCP4; ten 4K-token requests 0.6 s apart from 0 (~0.11 s each: nothing ever waits). At the window end at
    # 5 s the pool has seen 9 arrivals, fewer than min_forecast_requests (32), within a forecast span (10 s) of its
    # first, and none waits: no decision (nor at the split checks before).
    c = cfg(1)
    times = [0.6 * k for k in range(10)]
    s = sim(c, requests(c, times, 4096), "2xCP4")
    seen: list[float] = []
    s.pool.controller.add_observer(lambda job, d, acted: seen.append(job.now))
    res = s.run()
    ctl = s.pool.controller
    window = list(ctl.reports)  # the window end at 5 s (the run ends at ~5.5 s)
    assert len(window) == 1 and window[0].trail == ()
    assert seen == [] and ctl.last_decision is None
    assert res.reconfigs == [] and res.summary["completed"] == len(times)


def test_one_operation_per_decision_when_concurrency_is_one() -> None:
    c = cfg(2)
    times = [k / 30 for k in range(30 * 15)]
    res = run(c, requests(c, times, 4096), "2xCP8", max_concurrent_splits=1)
    assert [(r.kind, r.sources) for r in res.reconfigs] == [("split", (0,)), ("split", (1,))]
    assert began(res.reconfigs[1]) == pytest.approx(2.0)  # the next check, not the same decision


def test_no_second_split_is_decided_while_the_first_is_in_flight() -> None:
    # The two-block burst above, one operation per decision and a 3-s switch: the 1-s check splits worker 0
    # (in flight until ~4 s); nothing is decided until that split committed, and worker 1 is split at the next
    # window end (5 s).
    c = cfg(2, pool={"sim_switch_s": 3.0}, switch_s=3.0)
    times = [k / 30 for k in range(30 * 20)]
    res = run(c, requests(c, times, 4096), "2xCP8", max_concurrent_splits=1)
    assert [(r.kind, r.sources, r.targets) for r in res.reconfigs] == [
        ("split", (0,), (2, 3)),
        ("split", (1,), (4, 5)),
    ]
    assert [began(r) for r in res.reconfigs] == pytest.approx([1.0, 5.0])
    assert began(res.reconfigs[1]) > res.reconfigs[0].time_s
    assert res.summary["completed"] == len(times) and res.summary["rejected"] == 0


# -- decisions computed off the pool (the server's thread; the simulator models the delay) --------------------
def test_the_pool_hands_the_decision_its_age_and_a_split_of_one_kind_of_request_holds_on_its_resamples() -> None:
    # The overload scenario above with split_resamples on from 0.5 s: every request is alike, so every resample
    # of the forecast is the forecast itself and the 1-s check splits as before; the check's snapshot carries
    # the pool's age (the first arrival came at 0 s).
    c = cfg(1, check_interval_s=1.0, split_resamples=8)
    times = [k / 12 for k in range(12 * 20)]
    s = sim(c, requests(c, times, 4096), "1xCP8", resample_after_s=0.5)
    ages: list[tuple[float, float]] = []
    checks: list[tuple[str, ...]] = []
    s.pool.controller.add_observer(lambda job, d, acted: ages.append((job.now, job.age_s)))
    s.pool.controller.add_observer(lambda job, d, acted: checks.append(tuple(c.name for c in d.trail if c.passed)))
    res = s.run()
    assert [(r.kind, r.sources, r.targets) for r in res.reconfigs] == [("split", (0,), (1, 2))]
    assert began(res.reconfigs[0]) == pytest.approx(1.0)
    assert ages[0] == (pytest.approx(1.0), pytest.approx(1.0))
    assert checks[0] == ("span-split margin", "span-split resamples")
    assert all(age == pytest.approx(now) for now, age in ages)


def test_a_deferred_decision_acts_when_it_lands() -> None:
    # The overload scenario above with the replay off the pool: the 1-s check's snapshot is acted on 0.4 s later.
    c = cfg(1, check_interval_s=1.0)
    times = [k / 12 for k in range(12 * 20)]
    s = sim(c, requests(c, times, 4096), "1xCP8", hooks=[DecisionDelay(0.4)])
    res = s.run()
    assert [(r.kind, r.sources, r.targets) for r in res.reconfigs] == [("split", (0,), (1, 2))]
    assert began(res.reconfigs[0]) == pytest.approx(1.4)
    assert res.summary["completed"] == len(times)
    assert s.pool.controller.stale_decisions == 0


def test_a_decision_that_lands_after_the_pool_changed_is_dropped() -> None:
    # While the 1-s check's decision is being computed (it lands at 1.4 s), an operator splits worker 0 at
    # 1.2 s: the decision was taken on 1xCP8 and is dropped as stale; the pool keeps the operator's split.
    from vertumnus.engines.sim.events import EventKind

    c = cfg(1, check_interval_s=1.0)
    times = [k / 12 for k in range(12 * 20)]
    s = sim(c, requests(c, times, 4096), "1xCP8", hooks=[DecisionDelay(0.4)])
    s.loop.push(1.2, EventKind.TIMER, lambda: s.pool.reconfigure(ReconfigKind.SPLIT, 0))
    res = s.run()
    assert s.pool.controller.stale_decisions == 1
    assert [(r.kind, r.sources, r.targets) for r in res.reconfigs] == [("split", (0,), (1, 2))]
    assert began(res.reconfigs[0]) == pytest.approx(1.2)
    assert res.summary["completed"] == len(times) and res.summary["rejected"] == 0
