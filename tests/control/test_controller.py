"""Window rules, persistence, merge admission, operation choice and the epoch protocol (DESIGN.md §2).

Uses a small recording fake DataPlane / cache / host: the controller talks to workers only through those
interfaces. κ = 7 s per 10-s window for every degree (calibrated profile), θ_low 0.3, θ_up 0.8, Δ_long 0.1.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from vertumnus.config import DEFAULT_PROFILE, REPO_ROOT, config_from_dict
from vertumnus.controller.controller import Controller
from vertumnus.controller.epochs import EpochManager, Phase
from vertumnus.controller.lattice import Lattice
from vertumnus.controller.rules import Direction, signal
from vertumnus.cost_model import CostModel
from vertumnus.interfaces import PrefillJob
from vertumnus.scheduler import Scheduler
from vertumnus.types import (
    CacheOp,
    PrefixMatch,
    ReconfigKind,
    ReconfigPlan,
    Request,
    WorkerGroup,
    WorkerState,
)

COST = CostModel.from_file(REPO_ROOT / DEFAULT_PROFILE)


class FakeDataPlane:
    """Records every call; never calls back (tests deliver events explicitly)."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.queued: dict[int, list[PrefillJob]] = {}
        self.running: set[str] = set()

    def start(self, groups: Sequence[WorkerGroup], epoch: int, events: Any) -> None:
        self.calls.append(("start", tuple(g.worker_id for g in groups), epoch))

    def submit(self, worker_id: int, job: PrefillJob) -> None:
        self.queued.setdefault(worker_id, []).append(job)

    def withdraw(self, worker_id: int) -> list[PrefillJob]:
        self.calls.append(("withdraw", worker_id))
        jobs = self.queued.get(worker_id, [])
        self.queued[worker_id] = [j for j in jobs if j.request.request_id in self.running]
        return [j for j in jobs if j.request.request_id not in self.running]

    def park(self, worker_ids: Sequence[int]) -> None:
        self.calls.append(("park", tuple(worker_ids)))

    def activate(self, plan: ReconfigPlan) -> None:
        self.calls.append(("activate", tuple(t.worker_id for t in plan.targets), plan.epoch))

    def execute(self, op: CacheOp) -> None:
        self.calls.append(("execute", op.op_id))

    def restart(self, group: WorkerGroup, epoch: int) -> None:
        self.calls.append(("restart", group.worker_id, epoch))

    def close(self) -> None:
        self.calls.append(("close",))


class FakeCache:
    """Worker metadata calls plus a reconciliation-traffic table keyed by the first source id."""

    def __init__(self, sched: Scheduler, traffic: dict[int, float] | None = None) -> None:
        self.sched = sched
        self.traffic = traffic or {}
        self.calls: list[tuple[Any, ...]] = []

    def add_worker(self, worker_id: int, degree: int, node: int, capacity_blocks: int) -> None:
        self.calls.append(("add", worker_id, degree, capacity_blocks))

    def remove_worker(self, worker_id: int) -> None:
        self.calls.append(("remove", worker_id))

    def set_available(self, worker_id: int, available: bool) -> None:
        self.calls.append(("available", worker_id, available))

    def on_reconfigure(self, plan: ReconfigPlan) -> None:
        # record whether any target was already schedulable when the metadata changed (must never be)
        states = [self.sched.state(t.worker_id) for t in plan.targets]
        self.calls.append(("reconfigure", plan.epoch, tuple(states)))

    def reconcile_traffic(self, plan: ReconfigPlan) -> float:
        return self.traffic.get(plan.sources[0].worker_id, 0.0)


class FakeHost:
    def __init__(self, sched: Scheduler) -> None:
        self.sched = sched
        self.replaced: list[str] = []
        self.activated: list[int] = []
        self.done: list[tuple[ReconfigPlan, float, float]] = []

    def replace_job(self, job: PrefillJob, now: float) -> None:
        self.replaced.append(job.request.request_id)
        self.sched.release(job.request.request_id)
        assert self.sched.place(job.request, PrefixMatch(0, {}), now, first=False) is not None

    def workers_activated(self, worker_ids: Sequence[int], now: float) -> None:
        self.activated.extend(worker_ids)

    def reconfig_committed(self, plan: ReconfigPlan, drain_s: float, switch_s: float) -> None:
        self.done.append((plan, drain_s, switch_s))


class Rig:
    def __init__(self, composition: dict[int, int], nodes: int = 2, traffic: dict[int, float] | None = None) -> None:
        self.cfg = config_from_dict(
            {
                "pool": {"nodes": nodes, "gpus_per_node": 8, "degrees": [4, 8]},
                # this file pins the paper's rule controller (test_controller_predictive.py: the default)
                "controller": {"policy": "rules", "window_s": 10.0},  # the arithmetic below is per 10-s window
            }
        )
        self.sched = Scheduler(self.cfg, COST)
        self.lattice = Lattice(nodes, 8, [4, 8])
        self.dp = FakeDataPlane()
        self.cache = FakeCache(self.sched, traffic)
        self.host = FakeHost(self.sched)
        self.epochs = EpochManager(self.lattice, self.sched, self.cache, self.dp, self.host, 2048)
        self.ctl = Controller(self.cfg, COST, self.lattice, self.epochs, self.cache)
        groups = self.lattice.build(composition)
        self.epochs.start(groups, self.host)  # type: ignore[arg-type]
        for g in groups:
            for r in g.ranks:
                self.epochs.on_ack(g.worker_id, r, 1, 0.0)
        self.ctl.start(0.0)

    def q(self, now: float) -> Any:
        return lambda w: self.sched.queue_s(w, now)

    def window(self, demand_s: float, n: int = 10, n_long: int = 0) -> Any:
        for k in range(n):
            self.ctl.observe(demand_s / n, 40_000 if k < n_long else 1000)
        end = self.ctl.timers.next_window_end
        return self.ctl.end_window(end, self.q(end))


def test_signal_rules_and_capacity_precedence() -> None:
    args = (0.3, 0.8, 0.1)
    assert signal(0.9, 0.2, 0.2, *args)[0] == Direction.SPLIT
    assert signal(0.2, 0.2, 0.2, *args)[0] == Direction.MERGE
    assert signal(0.5, 0.35, 0.2, *args)[0] == Direction.MERGE  # long share up, load in band
    assert signal(0.5, 0.05, 0.2, *args)[0] == Direction.SPLIT  # long share down
    assert signal(0.5, 0.25, 0.2, *args)[0] == Direction.NONE  # moved by 0.05 ≤ Δ_long
    assert signal(0.9, 0.9, 0.2, *args)[0] == Direction.SPLIT  # capacity beats long-share (which says merge)
    assert signal(0.1, 0.0, 0.9, *args)[0] == Direction.MERGE  # capacity beats long-share (which says split)


def test_split_fires_after_persist_windows_and_only_once() -> None:
    rig = Rig({8: 2})  # K = 14 s per window
    w1 = rig.window(12.0)  # ρ = 0.857
    assert (w1.signal, w1.direction, w1.streak, w1.acted) == (Direction.SPLIT, Direction.SPLIT, 1, False)
    assert rig.epochs.current is None
    w2 = rig.window(12.0)
    assert (w2.streak, w2.acted, w2.capacity_s, w2.rho) == (2, True, 14.0, pytest.approx(12 / 14))
    cur = rig.epochs.current
    assert cur is not None and cur.plan.kind == ReconfigKind.SPLIT and cur.plan.epoch == 2
    assert cur.plan.sources == (WorkerGroup(0, 0, 0, 8),)  # equal drain (idle) and traffic: lowest id
    assert cur.plan.targets == (WorkerGroup(2, 0, 0, 4), WorkerGroup(3, 0, 4, 4))
    w3 = rig.window(12.0)  # an operation is in flight: does not count, no second operation
    assert (w3.acted, w3.streak) == (False, 0)


def test_interrupted_streak_resets() -> None:
    rig = Rig({8: 2})
    rig.window(12.0)
    assert rig.window(7.0).direction == Direction.NONE  # ρ = 0.5: in band, long share unchanged
    assert rig.window(12.0).streak == 1
    assert rig.epochs.current is None


def test_capacity_beats_long_share_in_the_controller() -> None:
    rig = Rig({8: 1, 4: 2})  # K = 21
    rig.window(10.0, n_long=0)  # ρ 0.48; long share reference 0.0
    w = rig.window(20.0, n_long=8)  # ρ 0.95 and long share 0.8: capacity says split
    assert w.signal == Direction.SPLIT


def test_merge_admission() -> None:
    # 4 × CP4 on 2 nodes: K = 28; a merge of two CP4 → K' = 21, admitted only if D ≤ 0.8 × 21 = 16.8.
    rig = Rig({4: 4})
    rig.window(16.0, n_long=0)  # ρ 0.571, reference long share 0.0
    blocked = rig.window(20.0, n_long=5)  # long share 0.5 → wants merge, but 20 > 16.8
    assert (blocked.signal, blocked.direction, blocked.streak) == (Direction.MERGE, Direction.NONE, 0)
    ok1 = rig.window(16.0, n_long=5)
    ok2 = rig.window(16.0, n_long=5)
    assert (ok1.direction, ok2.direction, ok2.acted) == (Direction.MERGE, Direction.MERGE, True)
    cur = rig.epochs.current
    assert cur is not None and [s.worker_id for s in cur.plan.sources] == [0, 1]
    assert cur.plan.targets == (WorkerGroup(4, 0, 0, 8),)


def _busy(rig: Rig, worker: int, n: int) -> None:
    for w in rig.sched.worker_ids():
        if w != worker:
            rig.sched.set_state(w, WorkerState.DRAINING)
    for k in range(n):
        rig.sched.place(Request(f"b{worker}-{k}", 0.0, 8192, ()), PrefixMatch(0, {}), 0.0)
    for w in rig.sched.worker_ids():
        rig.sched.set_state(w, WorkerState.ACTIVE)


def test_operation_choice_drain_then_traffic_then_id() -> None:
    rig = Rig({8: 3}, nodes=3, traffic={0: 5.0, 1: 2.0, 2: 2.0})
    _busy(rig, 1, 1)  # worker 1 has 0.176 s outstanding
    c = rig.ctl.choose(ReconfigKind.SPLIT, 30.0, rig.q(0.0))
    assert c is not None and c.op.sources[0].worker_id == 2  # 0 and 2 idle; 2 needs less traffic
    assert (c.drain_s, c.traffic) == (0.0, 2.0)
    rig2 = Rig({8: 3}, nodes=3, traffic={0: 2.0, 1: 2.0, 2: 2.0})
    c2 = rig2.ctl.choose(ReconfigKind.SPLIT, 30.0, rig2.q(0.0))
    assert c2 is not None and c2.op.sources[0].worker_id == 0  # full tie: lowest id
    rig3 = Rig({4: 4})
    _busy(rig3, 0, 2)
    _busy(rig3, 3, 1)
    c3 = rig3.ctl.choose(ReconfigKind.MERGE, 0.0, rig3.q(0.0))
    # merge drain = max q of the siblings: (0,1) → 0.334 s, (2,3) → 0.167 s
    assert c3 is not None and [s.worker_id for s in c3.op.sources] == [2, 3]
    assert c3.drain_s == pytest.approx(COST.predict(4, 8192, 0))


def _queue(rig: Rig, rid: str, worker: int) -> None:
    """Place a 1000-token request at ``worker`` (others draining meanwhile) and queue it at the fake plane."""
    others = [w for w in rig.sched.worker_ids() if w != worker and rig.sched.state(w) == WorkerState.ACTIVE]
    for w in others:
        rig.sched.set_state(w, WorkerState.DRAINING)
    req = Request(rid, 0.0, 1000, ())
    p = rig.sched.place(req, PrefixMatch(0, {}), 0.0)
    assert p is not None and p.worker_id == worker
    rig.dp.submit(worker, PrefillJob(req, p))
    for w in others:
        rig.sched.set_state(w, WorkerState.ACTIVE)


def test_epoch_protocol_order_and_durations() -> None:
    rig = Rig({4: 4})
    assert rig.dp.calls[0] == ("start", (0, 1, 2, 3), 1)
    assert rig.host.activated == [0, 1, 2, 3]
    for rid, w in (("a", 1), ("b", 1), ("c", 0), ("d", 1)):
        _queue(rig, rid, w)
    rig.dp.running.add("a")
    rig.sched.started("a", 1, 0.0)
    plan = rig.ctl.manual(ReconfigKind.MERGE, 1, 1.0, rig.q(1.0))
    assert (plan.epoch, plan.targets) == (2, (WorkerGroup(4, 0, 0, 8),))
    assert [s.worker_id for s in plan.sources] == [0, 1]
    assert rig.dp.calls[1:] == [("withdraw", 0), ("withdraw", 1), ("park", (0, 1))]
    # queued jobs re-placed (FCFS per worker), the running one stays to finish under the old geometry
    assert rig.host.replaced == ["c", "b", "d"]
    assert {rid: rig.sched.tickets[rid].worker_id for rid in "abcd"} == {"a": 1, "b": 3, "c": 2, "d": 2}
    assert rig.sched.state(0) == rig.sched.state(1) == WorkerState.DRAINING
    rig.epochs.on_parked(0, 1.5)
    assert rig.sched.state(0) == WorkerState.PARKED and rig.dp.calls[-1][0] == "park"
    rig.sched.release("a")  # the running prefill finished, then worker 1 parks
    rig.epochs.on_parked(1, 3.0)
    assert rig.dp.calls[-1] == ("activate", (4,), 2)
    assert rig.sched.state(0) == rig.sched.state(1) == rig.sched.state(4) == WorkerState.SWITCHING
    cur = rig.epochs.current
    assert cur is not None and (cur.phase, cur.drain_s) == (Phase.SWITCH, 2.0)
    for r in range(7):
        rig.epochs.on_ack(4, r, 2, 3.2)
    rig.epochs.on_ack(4, 6, 2, 3.3)  # duplicate rank
    rig.epochs.on_ack(4, 7, 1, 3.3)  # stale epoch
    assert rig.sched.state(4) == WorkerState.SWITCHING and rig.host.done == []
    assert not any(c[0] == "reconfigure" for c in rig.cache.calls)
    rig.epochs.on_ack(4, 7, 2, 3.5)
    assert ("reconfigure", 2, (WorkerState.SWITCHING,)) in rig.cache.calls  # metadata before schedulable
    assert rig.sched.state(4) == WorkerState.ACTIVE
    assert rig.sched.worker_ids() == [2, 3, 4] and rig.lattice.composition() == {4: 2, 8: 1}
    assert [(p.epoch, d, pytest.approx(s)) for p, d, s in rig.host.done] == [(2, 2.0, 0.5)]
    assert rig.host.activated[-1] == 4 and rig.epochs.epoch == 2 and rig.epochs.current is None
    assert rig.epochs.records[0].drain_s == 2.0


def test_source_failing_while_draining_is_restarted_and_parked_again() -> None:
    rig = Rig({8: 1}, nodes=1)
    rig.ctl.manual(ReconfigKind.SPLIT, 0, 0.0, rig.q(0.0))
    g = rig.epochs.fail(0)
    assert g == WorkerGroup(0, 0, 0, 8) and rig.sched.state(0) == WorkerState.FAILED
    assert ("remove", 0) in rig.cache.calls
    assert rig.epochs.fail(0) is None  # duplicate report
    assert rig.epochs.restart(g) == 3  # epoch 2 belongs to the plan
    rig.epochs.on_parked(0, 0.5)  # a park report from before the restart: ignored
    assert rig.sched.state(0) == WorkerState.FAILED
    for r in range(8):
        rig.epochs.on_ack(0, r, 3, 1.0)
    assert rig.sched.state(0) == WorkerState.DRAINING and rig.dp.calls[-1] == ("park", (0,))
    rig.epochs.on_parked(0, 2.0)
    assert rig.dp.calls[-1] == ("activate", (1, 2), 2)
    assert rig.epochs.can_fail(0) is False  # its ranks belong to the targets now
    for t in (1, 2):
        for r in range(4):
            rig.epochs.on_ack(t, r, 2, 2.5)
    assert rig.lattice.composition() == {4: 2} and rig.epochs.epoch == 2


def test_target_failing_before_commit_delays_the_commit_until_its_restart_acks() -> None:
    rig = Rig({8: 1}, nodes=1)
    plan = rig.ctl.manual(ReconfigKind.SPLIT, 0, 0.0, rig.q(0.0))
    rig.epochs.on_parked(0, 1.0)
    for r in range(4):
        rig.epochs.on_ack(1, r, 2, 1.5)
    g = rig.epochs.fail(2)
    assert g == WorkerGroup(2, 0, 4, 4) and ("remove", 2) not in rig.cache.calls  # never known to the cache
    assert rig.epochs.restart(g) == 3
    for r in range(4, 8):
        rig.epochs.on_ack(2, r, 2, 1.6)  # the old epoch's acks no longer count
    assert rig.epochs.current is not None and rig.host.done == []
    for r in range(4, 8):
        rig.epochs.on_ack(2, r, 3, 2.0)
    assert rig.epochs.current is None and rig.host.done[0][0] is plan
    # the restarted target came back empty: after the metadata moved to the targets, its holdings are wiped
    at = next(i for i, c in enumerate(rig.cache.calls) if c[:2] == ("reconfigure", 2))
    tail = rig.cache.calls[at:]
    assert tail[1:3] == [("remove", 2), ("add", 2, 4, 4 * 2048)] and ("remove", 1) not in tail
    assert (rig.sched.table.info(1).epoch, rig.sched.table.info(2).epoch, rig.epochs.epoch) == (2, 3, 3)
    assert rig.sched.state(1) == rig.sched.state(2) == WorkerState.ACTIVE
