"""The predictive controller (``controller.policy: predictive``): the replay model, the forecast, and its
decisions on small scenarios with exact expected operations, run on the real pool over the sim data plane.

Calibrated H200 profile (configs/profiles/qwen3-30b-a3b-h200.yaml): a 4K-token prefill takes ~0.11 s on CP4
and ~0.13 s on CP8; a 64K one 1.85 s on CP4 and 1.28 s on CP8. 5-s windows.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vertumnus.config import DEFAULT_PROFILE, REPO_ROOT, config_from_dict
from vertumnus.controller.lattice import Lattice
from vertumnus.controller.predictive import ArrivalLog, PredictiveModel, WorkerNow, observed_stress, observed_switch
from vertumnus.controller.replay import ReplayArrivals, ReplayWorkers, replay_mean_ttft
from vertumnus.cost_model import CostModel
from vertumnus.sim.runner import Simulation
from vertumnus.sim.workload import TraceRecord, build_requests
from vertumnus.types import ReconfigKind

COST = CostModel.from_file(REPO_ROOT / DEFAULT_PROFILE)


def cfg(nodes: int, pool: dict[str, Any] | None = None, **controller: Any) -> Any:
    """A predictive pool of ``nodes`` 8-GPU nodes; split checks every check_interval_s from the start (no
    start-up checks unless a test asks for them)."""
    controller = {"startup_check_interval_s": None, **controller}
    return config_from_dict(
        {
            "pool": {"nodes": nodes, "gpus_per_node": 8, "degrees": [4, 8], "engine": "sim",
                     "max_model_len": 131072, "kv_capacity_blocks_per_rank": 1024, **(pool or {})},
            "controller": {"policy": "predictive", "window_s": 5.0, "theta_low": 0.3, "theta_up": 0.8,
                           **controller},
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


def run(config: Any, reqs: list[Any], start: str) -> Any:
    return Simulation(reqs, config, COST, "vertumnus", start).run()


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
    c = cfg(1, check_interval_s=check_s, startup_check_interval_s=startup_s)
    times = [k / 12 for k in range(12 * 20)]
    res = run(c, requests(c, times, 4096), "1xCP8")
    assert [(r.kind, r.sources, r.targets) for r in res.reconfigs] == [("split", (0,), (1, 2))]
    assert began(res.reconfigs[0]) == pytest.approx(at)
    assert res.summary["completed"] == len(times) and res.summary["rejected"] == 0


def test_no_split_check_runs_once_nothing_can_split() -> None:
    # The overload scenario above: split checks every second while worker 0 (CP8) can split; after its split
    # the pool is 2xCP4 (CP4 is the smallest degree) and a check could only say "stay": none is computed from
    # then on, while the window ends still decide (a merge back is still a move).
    c = cfg(1, check_interval_s=1.0)
    times = [k / 12 for k in range(12 * 20)]
    sim = Simulation(requests(c, times, 4096), c, COST, "vertumnus", "1xCP8")
    seen: list[tuple[float, bool]] = []
    sim.pool.controller.decision_listeners.append(lambda job, d, acted: seen.append((job.now, job.report is None)))
    res = sim.run()
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
    c = cfg(1, check_interval_s=1.0, startup_check_interval_s=0.1, startup_span_s=span_s)
    times = [0.5 * k for k in range(13)] + [6.2 + k / 24 for k in range(24 * 10)]
    res = run(c, requests(c, times, 4096), "1xCP8")
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


def test_the_same_light_load_keeps_the_split_while_merges_must_persist_longer() -> None:
    c = cfg(1, merge_persist_windows=100)
    times = [4.0 * k for k in range(10)]
    res = run(c, requests(c, times, 65536), "2xCP4")
    assert res.reconfigs == []


@pytest.mark.parametrize(
    ("patient", "windows", "at"), [(None, 4, None), (0.01, 4, 25.0), (0.01, 6, 35.0), (0.01, 7, None)]
)
def test_a_merge_below_the_margin_waits_its_patient_windows(
    patient: float | None, windows: int, at: float | None
) -> None:
    # The light long load above, with merge_margin 0.5: the merge (CP8 1.28 s per request against 1.85 s on a
    # CP4) falls short of that margin. As a patient merge (more than 1%) it is wanted from the 10-s
    # window end on and taken at the fourth window in a row that wants it, 25 s (at the sixth, 35 s); never without
    # the patient margin, nor when it must be wanted for 7 windows: the run ends when the last request (in at 36 s)
    # is served at ~37.9 s, so 35 s is the last window end and the sixth to want the merge.
    c = cfg(1, merge_margin=0.5, merge_patient_margin=patient, merge_patient_windows=windows)
    times = [4.0 * k for k in range(10)]
    res = run(c, requests(c, times, 65536), "2xCP4")
    if at is None:
        assert res.reconfigs == []
    else:
        assert [(r.kind, r.sources, r.targets) for r in res.reconfigs] == [("merge", (0, 1), (2,))]
        assert began(res.reconfigs[0]) == pytest.approx(at)
    assert res.summary["completed"] == len(times)


@pytest.mark.parametrize(
    ("e8", "patient", "want", "flag"),
    [
        (1.16, None, None, False),
        (1.16, 0.01, ReconfigKind.MERGE, True),
        (1.16, 0.04, None, False),
        (1.0, 0.01, ReconfigKind.MERGE, False),
    ],
)
def test_a_merge_won_by_less_than_the_margin_is_a_patient_one(
    e8: float, patient: float | None, want: ReconfigKind | None, flag: bool
) -> None:
    # Two idle CP4 (Ê_4 = 1.2 s) or one CP8 ready after the 0.8-s switch; three requests 1.5 s apart from 2 s,
    # each served before the next arrives. At Ê_8 = 1.16 s the merge predicts 1.16 s against 1.2 s: 3.3% better,
    # below the 5% merge margin and above a 1% patient margin (not a 4% one); at Ê_8 = 1.0 s it clears the margin
    # and is an ordinary merge. The stress test (×1) passes in every case.
    lattice = Lattice(1, 8, [4, 8])
    a, b = lattice.build({4: 2})
    model = PredictiveModel(COST, [4, 8], 1.0, 0.1, 0.8, 4, 0.02, 0.05, 1.0, patient_margin=patient)
    ops = {ReconfigKind.MERGE: lattice.ops(ReconfigKind.MERGE)}
    workers = [WorkerNow(a.worker_id, 4, 0.0, 0.0, []), WorkerNow(b.worker_id, 4, 0.0, 0.0, [])]
    three = ReplayArrivals(np.array([2.0, 3.5, 5.0]), {4: np.full(3, 1.2), 8: np.full(3, e8)})
    d = model.decide(workers, three, ops)
    assert d.stay.objective == pytest.approx(1.2)
    assert d.best_merge is not None and d.best_merge.objective == pytest.approx(e8)
    assert (d.want, d.patient) == (want, flag)
    if flag:
        assert d.reason.endswith(", by less than 5%: a patient merge")
    elif want is None:
        assert d.reason == "stay is best (1.200 s)"


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


@pytest.mark.parametrize(
    ("burst_margin", "full_slack", "want"),
    [(0.02, None, ReconfigKind.SPLIT), (0.1, None, None), (0.02, 0.02, None), (0.02, 1.0, ReconfigKind.SPLIT)],
)
def test_a_split_won_on_the_burst_forecast_answers_to_the_burst_margin_and_the_span(
    burst_margin: float, full_slack: float | None, want: ReconfigKind | None
) -> None:
    # One idle CP8 (Ê_8 = 1.0 s) or, after the split, two CP4 ready after the 0.8-s switch (Ê_4 = 1.2 s).
    # The window's forecast, one request: stay 1.0 s < split 2.0 s. The burst forecast, six requests at once:
    # stay (1+2+…+6)/6 = 3.5 s; split, pairs done at 0.8 + 1.2·k: 0.8 + 0.6·4 = 3.2 s, an 8.6% gain — above
    # a 2% margin, below 10%. With the span check (burst_full_slack) the split must also predict at most
    # (1 + slack) × stay on the window's forecast: 2.0 s > 1.02 × 1.0 s refuses it (a cluster of six at a load
    # the span calls light), 2.0 s ≤ 2 × 1.0 s lets it through.
    lattice = Lattice(1, 8, [4, 8])
    (cp8,) = lattice.build({8: 1})
    model = PredictiveModel(
        COST, [4, 8], 1.0, 0.1, 0.8, 4, 0.02, 0.05, 2.0, burst_split_margin=burst_margin, burst_full_slack=full_slack
    )
    ops = {ReconfigKind.SPLIT: lattice.ops(ReconfigKind.SPLIT)}
    workers = [WorkerNow(cp8.worker_id, 8, 0.0, 0.0, [])]
    one = ReplayArrivals(np.array([0.0]), {4: np.array([1.2]), 8: np.array([1.0])})
    six = ReplayArrivals(np.zeros(6), {4: np.full(6, 1.2), 8: np.full(6, 1.0)})
    assert model.decide(workers, one, ops).want is None  # the window's forecast alone: stay
    d = model.decide(workers, one, ops, burst=six)
    assert d.want == want
    if want is not None:
        assert d.best_split is not None and [o.kind for o in d.best_split.ops] == [ReconfigKind.SPLIT]
    elif full_slack is not None:
        assert "not on the span (2.000 s vs 1.000 s)" in d.reason


def test_observed_stress_is_the_peak_window_over_the_recent_mean_within_one_and_the_cap() -> None:
    assert observed_stress([10.0, 12.0, 9.0, 11.0], 2, 2.0) == pytest.approx(1.2)  # steady: the noise, 12 / 10
    assert observed_stress([10.0, 40.0, 10.0, 10.0], 2, 2.0) == 2.0  # a burst remembered: the cap
    assert observed_stress([5.0, 10.0, 10.0], 2, 2.0) == 1.0  # rising to its peak now: at least 1
    assert observed_stress([], 2, 2.0) == 2.0 and observed_stress([3.0, 0.0, 0.0], 2, 2.0) == 2.0  # nothing lately


@pytest.mark.parametrize(("stress", "want"), [(None, None), (1.3, ReconfigKind.MERGE)])
def test_a_merge_answers_to_the_stress_it_is_given(stress: float | None, want: ReconfigKind | None) -> None:
    # Two idle CP4 (Ê_4 = 1.2 s) or one CP8 ready after the 0.8-s switch (Ê_8 = 1.0 s); three requests 1.5 s
    # apart. Nominal: the CP8 serves each before the next arrives, 1.0 s < 1.2 s. At 2× the rate (the configured
    # merge_stress) they come 0.75 s apart and queue on the CP8: (1.0 + 1.25 + 1.5) / 3 = 1.25 s > 1.2 s, a
    # veto; at 1.3× (a steady load's observed swing) they are 1.15 s apart and the merge still wins.
    lattice = Lattice(1, 8, [4, 8])
    a, b = lattice.build({4: 2})
    model = PredictiveModel(COST, [4, 8], 1.0, 0.1, 0.8, 4, 0.02, 0.05, 2.0)
    ops = {ReconfigKind.MERGE: lattice.ops(ReconfigKind.MERGE)}
    workers = [WorkerNow(a.worker_id, 4, 0.0, 0.0, []), WorkerNow(b.worker_id, 4, 0.0, 0.0, [])]
    three = ReplayArrivals(np.array([2.0, 3.5, 5.0]), {4: np.full(3, 1.2), 8: np.full(3, 1.0)})
    d = model.decide(workers, three, ops, merge_stress=stress)
    assert d.best_merge is not None and d.best_merge.objective == pytest.approx(1.0)
    assert d.stay.objective == pytest.approx(1.2)
    assert d.want == want
    assert d.best_merge.stressed == pytest.approx(1.25 if stress is None else 1.0)


@pytest.mark.parametrize(("max_merges", "n_ops", "objective"), [(1, 1, 1.1), (2, 2, 1.0)])
def test_merges_go_one_per_decision_unless_configured_otherwise(max_merges: int, n_ops: int, objective: float) -> None:
    # Four idle CP4 on two nodes (Ê_4 = 1.2 s; a CP8, ready after the 0.8-s switch, Ê_8 = 1.0 s); two requests
    # at 2 s. Stay: 1.2 s. One merge: one request on the CP8, the other on a CP4 (waiting for the CP8 would end
    # at 3.0 s): (1.0 + 1.2) / 2 = 1.1 s, which wins the 5% merge margin. Both merges: 1.0 s — better, but with
    # max_concurrent_merges 1 (the default) capacity goes a block per decision.
    lattice = Lattice(2, 8, [4, 8])
    quads = lattice.build({4: 4})
    model = PredictiveModel(COST, [4, 8], 1.0, 0.1, 0.8, 4, 0.02, 0.05, 1.0, max_merges=max_merges)
    ops = {ReconfigKind.MERGE: lattice.ops(ReconfigKind.MERGE)}
    workers = [WorkerNow(g.worker_id, 4, 0.0, 0.0, []) for g in quads]
    two = ReplayArrivals(np.array([2.0, 2.0]), {4: np.full(2, 1.2), 8: np.full(2, 1.0)})
    d = model.decide(workers, two, ops)
    assert d.want == ReconfigKind.MERGE and d.stay.objective == pytest.approx(1.2)
    assert d.best_merge is not None and len(d.best_merge.ops) == n_ops
    assert d.best_merge.objective == pytest.approx(objective)


def test_the_switch_price_is_the_mean_switch_observed_or_the_configured_one() -> None:
    assert observed_switch([], 0.8) == 0.8
    assert observed_switch([0.002, 0.004], 0.8) == pytest.approx(0.003)


@pytest.mark.parametrize(("switch_s", "want", "merged"), [(None, None, 1.2), (0.003, ReconfigKind.MERGE, 1.1)])
def test_a_merge_that_loses_at_the_configured_switch_wins_at_the_engines(
    switch_s: float | None, want: ReconfigKind | None, merged: float
) -> None:
    # Four idle CP4 (Ê_4 = 1.2 s; a merged CP8 Ê_8 = 1.0 s, J = q + 1.1 with λ 0.1); two requests at 0.3 s.
    # Charged the configured 0.8-s switch the CP8 is free at 0.8 s: J = 0.5 + 1.1 > 1.2, both go to the CP4 left
    # (1.2 s, as staying). At the 3-ms switch the engine took, the CP8 is free when they arrive: the first goes
    # there (TTFT 1.0), the second to a CP4 (the CP8's queue would make J 2.1): (1.0 + 1.2) / 2 = 1.1, past the
    # 5% margin.
    lattice = Lattice(2, 8, [4, 8])
    quads = lattice.build({4: 4})
    model = PredictiveModel(COST, [4, 8], 1.0, 0.1, 0.8, 4, 0.02, 0.05, 1.0, max_merges=1)
    ops = {ReconfigKind.MERGE: lattice.ops(ReconfigKind.MERGE)}
    workers = [WorkerNow(g.worker_id, 4, 0.0, 0.0, []) for g in quads]
    two = ReplayArrivals(np.array([0.3, 0.3]), {4: np.full(2, 1.2), 8: np.full(2, 1.0)})
    d = model.decide(workers, two, ops, switch_s=switch_s)
    assert d.want == want and d.stay.objective == pytest.approx(1.2)
    assert d.best_merge is not None and d.best_merge.objective == pytest.approx(merged)


@pytest.mark.parametrize(("observed", "price"), [(True, 3.0), (False, 0.8)])
def test_the_switch_the_engine_took_prices_the_next_move(observed: bool, price: float) -> None:
    # The overload of test_overload_after_a_merge_splits_at_the_first_check on an engine whose switch takes 3 s
    # (pool.sim_switch_s) while the controller was configured with 0.8 s: the split at 1 s commits 3 s after its
    # (instant) drain, and from then on a move is priced at the 3 s the engine took — or, with
    # switch_from_observed off, still at the configured 0.8 s.
    c = cfg(1, pool={"sim_switch_s": 3.0}, switch_s=0.8, switch_from_observed=observed)
    times = [k / 12 for k in range(12 * 20)]
    sim = Simulation(requests(c, times, 4096), c, COST, "vertumnus", "1xCP8")
    assert sim.pool.controller.switch_estimate() == 0.8  # nothing observed yet: the configured prior
    res = sim.run()
    assert [(r.kind, r.sources, r.targets) for r in res.reconfigs] == [("split", (0,), (1, 2))]
    assert res.reconfigs[0].switch_s == pytest.approx(3.0)
    assert sim.pool.controller.switch_estimate() == pytest.approx(price)
    assert res.summary["completed"] == len(times)


@pytest.mark.parametrize(
    ("gap", "spread", "want", "stay"),
    [(1.1, 0.0, None, 1.0), (1.1, 0.2, ReconfigKind.SPLIT, (1.0 + 1.0 + 2.625) / 3), (1.2, 0.2, None, 1.0)],
)
def test_the_objective_prices_the_forecasts_rate_spread(
    gap: float, spread: float, want: ReconfigKind | None, stay: float
) -> None:
    # One idle CP8 (Ê_8 = 1.0 s) or two CP4 ready after the 0.8-s switch (Ê_4 = 1.2 s); 40 requests `gap` s
    # apart. At the forecast's rate the CP8 serves each before the next arrives (TTFT 1.0 < the split's ~1.22).
    # With a 20% spread the objective also replays them 1.2× faster: 1.1 s apart → 0.917 s, and the CP8 falls
    # behind by 0.083 s a request: mean TTFT 1 + 0.083 · 19.5 = 2.625 there, (1 + 1 + 2.625) / 3 on average, while
    # the two CP4 keep up at every rate → split. 1.2 s apart → 1.0 s at 1.2×: the CP8 still keeps up → stay.
    lattice = Lattice(1, 8, [4, 8])
    (w,) = lattice.build({8: 1})
    model = PredictiveModel(COST, [4, 8], 1.0, 0.0, 0.8, 4, 0.02, 0.05, 2.0, rate_spread=spread)
    ops = {ReconfigKind.SPLIT: lattice.ops(ReconfigKind.SPLIT)}
    forty = ReplayArrivals(np.arange(40) * gap, {4: np.full(40, 1.2), 8: np.full(40, 1.0)})
    d = model.decide([WorkerNow(w.worker_id, 8, 0.0, 0.0, [])], forty, ops)
    assert d.want == want
    assert d.stay.objective == pytest.approx(stay)
    assert d.best_split is not None and d.best_split.objective < 1.25


@pytest.mark.parametrize(
    ("resamples", "age_s", "mix", "want"),
    [
        (0, 60.0, "AB", ReconfigKind.SPLIT),  # off: the forecast alone decides
        (16, 60.0, "AB", None),  # half the resamples put the light request first: the split does not hold
        (16, 5.0, "AB", ReconfigKind.SPLIT),  # the start-up (age < split_resample_after_s): margins only
        (16, 60.0, "AA", ReconfigKind.SPLIT),  # a mix of one kind resamples to itself: the split holds
    ],
)
def test_a_span_split_must_hold_on_resamples_of_the_forecasts_mix(
    resamples: int, age_s: float, mix: str, want: ReconfigKind | None
) -> None:
    # One idle CP8, or two CP4 ready after the 0.8-s switch; two requests at t = 0, placed in forecast order.
    # A is long (Ê_8 4.0 s, Ê_4 4.4 s), B short (0.2 s on both). Forecast A, B: stay (4.0 + 4.2) / 2 = 4.1 s,
    # split (5.2 + 1.0) / 2 = 3.1 s — a 24% gain. A resample draws the two with replacement: B, A gives stay
    # (0.2 + 4.2) / 2 = 2.2 < 3.1 and B, B stay 0.3 < 1.0 — the split loses on half the draws, so it holds on
    # all 16 with probability 2^-16 (the generator is seeded: the outcome is fixed). A, A resamples only to
    # itself: stay 6.0, split 5.2 on every draw.
    lattice = Lattice(1, 8, [4, 8])
    (cp8,) = lattice.build({8: 1})
    model = PredictiveModel(
        COST, [4, 8], 1.0, 0.1, 0.8, 4, 0.02, 0.05, 2.0, split_resamples=resamples, resample_after_s=15.0
    )
    ops = {ReconfigKind.SPLIT: lattice.ops(ReconfigKind.SPLIT)}
    e8 = {"A": 4.0, "B": 0.2}
    e4 = {"A": 4.4, "B": 0.2}
    two = ReplayArrivals(np.zeros(2), {4: np.array([e4[k] for k in mix]), 8: np.array([e8[k] for k in mix])})
    d = model.decide([WorkerNow(cp8.worker_id, 8, 0.0, 0.0, [])], two, ops, age_s=age_s)
    assert d.stay.objective == pytest.approx(4.1 if mix == "AB" else 6.0)
    assert d.best_split is not None and d.best_split.objective == pytest.approx(3.1 if mix == "AB" else 5.2)
    assert d.want == want
    if want is None:
        assert "wins on the forecast (3.100 s vs stay 4.100 s) but not on all 16 resamples" in d.reason


@pytest.mark.parametrize(
    ("slack", "age_s", "want"),
    [
        (None, 60.0, ReconfigKind.SPLIT),  # off: the burst and the span forecast itself decide
        (0.05, 60.0, None),  # a resample of the span's mix has the split lose by more than 5%: refused
        (0.05, 5.0, ReconfigKind.SPLIT),  # the start-up (age < split_resample_after_s): not checked
        (1.0, 60.0, ReconfigKind.SPLIT),  # no resample of this mix has the split twice as slow as stay
    ],
)
def test_a_burst_split_must_hold_within_the_slack_on_resamples_of_the_spans_mix(
    slack: float | None, age_s: float, want: ReconfigKind | None
) -> None:
    # One idle CP8, or two CP4 ready after the 0.8-s switch. A: Ê_8 4.0 s, Ê_4 4.4 s; B: 0.2 s on both.
    # Span forecast B, A, B, A, A at 0, 1, 4, 4, 20 s. Stay: 0.2, 4.0, 1.2 (B waits for A until 5 s), 5.2, 4.0
    # -> 2.92 s; split: 1.0 (the switch), 4.4, 0.2, 4.6 (behind B on the second CP4), 4.4 -> 2.92 s: no span
    # split (not 2% better), but within burst_split_full_slack (2%). Burst forecast A, A at 0 s: stay 4.0, 8.0
    # -> 6.0 s, split 5.2 s each: a 13% win. A resample keeps the instants and draws the requests: e.g. B, B, B,
    # B, A has stay 0.2, 0.2, 0.2, 0.4, 4.0 -> 1.0 s against split 1.0, 0.2, 0.2, 0.2, 4.4 -> 1.2 s (20% worse):
    # a burst split that a redraw of the span's requests does not back.
    lattice = Lattice(1, 8, [4, 8])
    (cp8,) = lattice.build({8: 1})
    model = PredictiveModel(
        COST, [4, 8], 1.0, 0.1, 0.8, 4, 0.02, 0.05, 2.0, burst_full_slack=0.02, split_resamples=8,
        resample_after_s=15.0, burst_resample_slack=slack,
    )  # fmt: skip
    ops = {ReconfigKind.SPLIT: lattice.ops(ReconfigKind.SPLIT)}
    e8 = {"A": 4.0, "B": 0.2}
    e4 = {"A": 4.4, "B": 0.2}

    def forecast(mix: str, times: list[float]) -> ReplayArrivals:
        return ReplayArrivals(np.array(times), {4: np.array([e4[k] for k in mix]), 8: np.array([e8[k] for k in mix])})

    span = forecast("BABAA", [0.0, 1.0, 4.0, 4.0, 20.0])
    burst = forecast("AA", [0.0, 0.0])
    d = model.decide([WorkerNow(cp8.worker_id, 8, 0.0, 0.0, [])], span, ops, burst=burst, age_s=age_s)
    assert d.stay.objective == pytest.approx(2.92)
    assert d.best_split is not None and d.best_split.objective == pytest.approx(2.92)
    assert d.want == want
    if want is None:
        assert d.reason == (
            "split 0 wins on the last seconds' rate (5.200 s vs stay 6.000 s) but loses by more than 5% on a"
            " resample of the span's mix"
        )
    else:
        assert "on the last seconds' rate predicted 5.200 s vs stay 6.000 s" in d.reason


@pytest.mark.parametrize("wait", [True, False])
def test_no_decision_on_a_handful_of_first_arrivals(wait: bool) -> None:
    # 2xCP4; ten 4K-token requests 0.6 s apart from 0 (~0.11 s each: nothing ever waits). At the window end at
    # 5 s the pool has seen 9 arrivals, fewer than min_forecast_requests (32), within a forecast span (10 s) of its
    # first, and none waits: with wait_for_min_forecast there is no decision (nor at the split checks before).
    # Without it the window end decides on those 9 arrivals tiled over the span.
    c = cfg(1, wait_for_min_forecast=wait)
    times = [0.6 * k for k in range(10)]
    sim = Simulation(requests(c, times, 4096), c, COST, "vertumnus", "2xCP4")
    res = sim.run()
    ctl = sim.pool.controller
    window = list(ctl.reports)  # the window end at 5 s (the run ends at ~5.5 s)
    assert len(window) == 1
    if wait:
        assert window[0].reason == "too few arrivals seen yet to forecast" and ctl.last_decision is None
    else:
        assert ctl.last_decision is not None and window[0].reason == ctl.last_decision.reason
    assert res.reconfigs == [] and res.summary["completed"] == len(times)


def test_one_operation_per_decision_when_concurrency_is_one() -> None:
    c = cfg(2, max_concurrent_ops=1)
    times = [k / 30 for k in range(30 * 15)]
    res = run(c, requests(c, times, 4096), "2xCP8")
    assert [(r.kind, r.sources) for r in res.reconfigs] == [("split", (0,)), ("split", (1,))]
    assert began(res.reconfigs[1]) == pytest.approx(2.0)  # the next check, not the same decision


@pytest.mark.parametrize(("while_reconfiguring", "second"), [(False, 5.0), (True, 2.0)])
def test_a_second_split_starts_while_the_first_is_in_flight(while_reconfiguring: bool, second: float) -> None:
    # The two-block burst above, one operation per decision and a 3-s switch: the 1-s check splits worker 0
    # (in flight until ~4 s). With split_while_reconfiguring the 2-s check still decides, on the ACTIVE worker 1,
    # and splits it beside the running plan; without, nothing is decided until the first split committed and
    # worker 1 waits for the next window end (5 s).
    c = cfg(2, max_concurrent_ops=1, switch_s=3.0, split_while_reconfiguring=while_reconfiguring)
    times = [k / 30 for k in range(30 * 20)]
    res = run(c, requests(c, times, 4096), "2xCP8")
    assert [(r.kind, r.sources, r.targets) for r in res.reconfigs] == [
        ("split", (0,), (2, 3)),
        ("split", (1,), (4, 5)),
    ]
    assert [began(r) for r in res.reconfigs] == pytest.approx([1.0, second])
    # the second began before the first committed (two plans in flight) only when deciding while reconfiguring
    assert (began(res.reconfigs[1]) < res.reconfigs[0].time_s) == while_reconfiguring
    assert res.summary["completed"] == len(times) and res.summary["rejected"] == 0


def test_a_decision_beside_a_running_split_counts_its_targets_as_capacity(monkeypatch: pytest.MonkeyPatch) -> None:
    # 2 nodes as 2xCP8; 64K-token requests at 1.9 req/s (a CP8 serves ~0.78/s, two CP4 ~1.08/s): worker 1 is split
    # at 17 s, and the 2xCP4 on their way make the pool big enough — no second split while it runs or after.
    # Counting only the ACTIVE workers (the targets left out) sees one CP8 against the load and splits worker 0
    # at the next check, 18 s.
    from vertumnus.controller import controller as controller_module

    c = cfg(2, max_concurrent_ops=1, switch_s=3.0, split_while_reconfiguring=True)
    times = [k / 1.9 for k in range(76)]
    res = run(c, requests(c, times, 65536), "2xCP8")
    assert [(r.kind, r.sources, r.targets, began(r)) for r in res.reconfigs] == [
        ("split", (1,), (2, 3), pytest.approx(17.0))
    ]
    monkeypatch.setattr(controller_module, "incoming_workers", lambda *_: [])
    blind = run(c, requests(c, times, 65536), "2xCP8")
    assert [(r.sources, began(r)) for r in blind.reconfigs] == [
        ((1,), pytest.approx(17.0)),
        ((0,), pytest.approx(18.0)),
    ]
    assert res.summary["completed"] == blind.summary["completed"] == len(times)


# -- decisions computed off the pool (the server's thread; the simulator models the delay) --------------------
def test_the_pool_hands_the_decision_its_age_and_a_split_of_one_kind_of_request_holds_on_its_resamples() -> None:
    # The overload scenario above with split_resamples on from 0.5 s: every request is alike, so every resample
    # of the forecast is the forecast itself and the 1-s check splits as before; the check's snapshot carries
    # the pool's age (the first arrival came at 0 s).
    c = cfg(1, check_interval_s=1.0, split_resamples=8, split_resample_after_s=0.5)
    times = [k / 12 for k in range(12 * 20)]
    sim = Simulation(requests(c, times, 4096), c, COST, "vertumnus", "1xCP8")
    ages: list[tuple[float, float]] = []
    sim.pool.controller.decision_listeners.append(lambda job, d, acted: ages.append((job.now, job.age_s)))
    res = sim.run()
    assert [(r.kind, r.sources, r.targets) for r in res.reconfigs] == [("split", (0,), (1, 2))]
    assert began(res.reconfigs[0]) == pytest.approx(1.0)
    assert ages[0] == (pytest.approx(1.0), pytest.approx(1.0))
    assert all(age == pytest.approx(now) for now, age in ages)


def test_a_deferred_decision_acts_when_it_lands() -> None:
    # The overload scenario above with the replay off the pool: the 1-s check's snapshot is acted on 0.4 s later.
    c = cfg(1, check_interval_s=1.0)
    times = [k / 12 for k in range(12 * 20)]
    sim = Simulation(requests(c, times, 4096), c, COST, "vertumnus", "1xCP8", decision_delay_s=0.4)
    res = sim.run()
    assert [(r.kind, r.sources, r.targets) for r in res.reconfigs] == [("split", (0,), (1, 2))]
    assert began(res.reconfigs[0]) == pytest.approx(1.4)
    assert res.summary["completed"] == len(times)
    assert sim.pool.controller.stale_decisions == 0


def test_a_decision_that_lands_after_the_pool_changed_is_dropped() -> None:
    # While the 1-s check's decision is being computed (it lands at 1.4 s), an operator splits worker 0 at
    # 1.2 s: the decision was taken on 1xCP8 and is dropped as stale; the pool keeps the operator's split.
    from vertumnus.engines.sim.events import EventKind
    from vertumnus.types import ReconfigKind

    c = cfg(1, check_interval_s=1.0)
    times = [k / 12 for k in range(12 * 20)]
    sim = Simulation(requests(c, times, 4096), c, COST, "vertumnus", "1xCP8", decision_delay_s=0.4)
    sim.loop.push(1.2, EventKind.TIMER, lambda: sim.pool.reconfigure(ReconfigKind.SPLIT, 0))
    res = sim.run()
    assert sim.pool.controller.stale_decisions == 1
    assert [(r.kind, r.sources, r.targets) for r in res.reconfigs] == [("split", (0,), (1, 2))]
    assert began(res.reconfigs[0]) == pytest.approx(1.2)
    assert res.summary["completed"] == len(times) and res.summary["rejected"] == 0
