"""PrefillPool end to end over the real scheduler, cache manager and controller, with a scripted fake data plane.

The fake never calls back on its own: each test delivers engine events (acks, starts, completions, parks,
failures) explicitly, so every ordering is exact.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from vertumnus.cache.block_keys import keys_from_hash_ids
from vertumnus.cache.stats import node_stats
from vertumnus.config import DEFAULT_PROFILE, REPO_ROOT, config_from_dict
from vertumnus.cost_model import CostModel
from vertumnus.interfaces import PrefillJob
from vertumnus.pool import PrefillPool, RequestRejected
from vertumnus.types import (
    CacheOp,
    CacheReport,
    CacheReportKind,
    Placement,
    PrefillResult,
    ReconfigKind,
    ReconfigPlan,
    Request,
    WorkerGroup,
)

COST = CostModel.from_file(REPO_ROOT / DEFAULT_PROFILE)


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class ScriptedPlane:
    """FCFS queues per worker plus a log of control calls."""

    def __init__(self) -> None:
        self.log: list[tuple[Any, ...]] = []
        self.queues: dict[int, list[PrefillJob]] = {}
        self.running: dict[int, PrefillJob] = {}
        self.groups: dict[int, WorkerGroup] = {}

    def start(self, groups: Sequence[WorkerGroup], epoch: int, events: Any) -> None:
        self.groups.update({g.worker_id: g for g in groups})
        self.log.append(("start", tuple(g.worker_id for g in groups), epoch))

    def submit(self, worker_id: int, job: PrefillJob) -> None:
        self.queues.setdefault(worker_id, []).append(job)

    def withdraw(self, worker_id: int) -> list[PrefillJob]:
        jobs, self.queues[worker_id] = self.queues.get(worker_id, []), []
        self.log.append(("withdraw", worker_id, tuple(j.request.request_id for j in jobs)))
        return jobs

    def park(self, worker_ids: Sequence[int]) -> None:
        self.log.append(("park", tuple(worker_ids)))

    def activate(self, plan: ReconfigPlan) -> None:
        self.groups.update({g.worker_id: g for g in plan.targets})
        self.log.append(("activate", tuple(g.worker_id for g in plan.targets), plan.epoch))

    def execute(self, op: CacheOp) -> None:
        self.log.append(("execute", op.op_id, op.kind.name, op.src_worker, op.dst_worker))

    def restart(self, group: WorkerGroup, epoch: int) -> None:
        self.queues[group.worker_id] = []
        self.running.pop(group.worker_id, None)
        self.log.append(("restart", group.worker_id, epoch))

    def close(self) -> None:
        self.log.append(("close",))


class Done:
    def __init__(self) -> None:
        self.requests: list[tuple[str, int | None, bool]] = []
        self.reconfigs: list[tuple[ReconfigPlan, float, float]] = []
        self.ops: list[tuple[int, bool]] = []

    def request_done(self, request: Request, placement: Placement | None, result: PrefillResult | None) -> None:
        assert result is not None
        self.requests.append((request.request_id, placement.worker_id if placement else None, result.ok))

    def reconfig_done(self, plan: ReconfigPlan, drain_s: float, switch_s: float) -> None:
        self.reconfigs.append((plan, drain_s, switch_s))

    def cache_op_done(self, op: CacheOp, ok: bool) -> None:
        self.ops.append((op.op_id, ok))


class Rig:
    def __init__(self, composition: str = "2xCP8", nodes: int = 2, **over: Any) -> None:
        data: dict[str, Any] = {
            "pool": {"nodes": nodes, "gpus_per_node": 8, "degrees": [4, 8], "initial_composition": composition},
            "controller": {"enabled": False},
        }
        for k, v in over.items():
            data.setdefault(k, {}).update(v)
        self.cfg = config_from_dict(data)
        self.clock = Clock()
        self.plane = ScriptedPlane()
        self.pool = PrefillPool(self.cfg, COST, self.plane, self.clock)
        self.done = Done()
        self.pool.add_listener(self.done)
        self.pool.start()

    def ack(self, worker_id: int, epoch: int) -> None:
        for r in self.plane.groups[worker_id].ranks:
            self.pool.epoch_ack(worker_id, r, epoch, self.clock.t)

    def ack_all(self, epoch: int = 1) -> None:
        for wid in list(self.plane.groups):
            self.ack(wid, epoch)

    def run_next(self, worker_id: int, cached_blocks_stored: bool = False) -> PrefillJob:
        """Start and finish the head job of a worker at the current time (then optionally report its blocks)."""
        job = self.plane.queues[worker_id].pop(0)
        rid = job.request.request_id
        self.pool.prefill_started(worker_id, rid, self.clock.t)
        self.clock.t += job.placement.predicted_s
        self.pool.prefill_done(
            PrefillResult(rid, worker_id, job.placement.cached_tokens, self.clock.t - 1, self.clock.t)
        )
        if cached_blocks_stored and job.request.block_keys:
            self.pool.cache_report(CacheReport(worker_id, CacheReportKind.STORED, job.request.block_keys, None))
        return job

    def snap(self, wid: int) -> Any:
        return next(w for w in self.pool.snapshot().workers if w.worker_id == wid)


def req(rid: str, n: int, hashes: Sequence[int] = ()) -> Request:
    return Request(rid, 0.0, n, keys_from_hash_ids(hashes))


def test_start_backlog_until_acks_then_place_and_complete() -> None:
    rig = Rig("2xCP8")
    assert rig.plane.log[0] == ("start", (0, 1), 1)
    assert rig.pool.submit(req("early", 4096)) is None  # no rank acked yet: backlog
    assert rig.pool.snapshot().backlog == 1 and rig.snap(0).state == "SWITCHING"
    rig.ack(0, 1)
    [job] = rig.plane.queues[0]
    assert (job.request.request_id, job.placement.worker_id, job.placement.epoch) == ("early", 0, 1)
    rig.ack(1, 1)
    p = rig.pool.submit(req("second", 4096))
    assert p is not None and p.worker_id == 1  # worker 0 has the reservation of "early"
    rig.run_next(0)
    rig.run_next(1)
    assert rig.done.requests == [("early", 0, True), ("second", 1, True)]
    snap = rig.pool.snapshot()
    assert (snap.inflight, snap.backlog, snap.epoch, snap.composition) == (0, 0, 1, "2xCP8")
    assert rig.snap(0).queue_s == 0.0 and rig.snap(1).ranks == tuple(range(8, 16))


def test_cached_prefix_is_pinned_reused_and_reported_once() -> None:
    rig = Rig("2xCP8")
    rig.ack_all()
    hashes = list(range(64))  # 64 blocks = 32768 tokens
    rig.pool.submit(req("a", 32768, hashes))
    rig.run_next(0, cached_blocks_stored=True)
    assert rig.snap(0).cached_blocks == 64
    p = rig.pool.submit(req("b", 32768 + 1024, [*hashes, 100, 101]))
    assert p is not None and (p.worker_id, p.cached_tokens, p.uncached_tokens) == (0, 32768, 1024)
    [job] = rig.plane.queues[0]
    assert job.max_reuse_blocks == 64 and job.reconcile is None
    assert rig.pool.cache.workers.by_id[0].pins == {tuple(job.request.block_keys[:64]): 1}
    rig.run_next(0)
    assert rig.pool.cache.workers.by_id[0].pins == {}
    rig.pool.prefill_done(PrefillResult("b", 0, 0, 0.0, 1.0))  # duplicate completion: ignored
    assert rig.done.requests == [("a", 0, True), ("b", 0, True)]


def test_rejections_and_duplicates() -> None:
    cold = PrefillPool(config_from_dict({}), COST, ScriptedPlane(), Clock())
    with pytest.raises(ValueError, match="pool not started"):
        cold.submit(req("x", 10))
    rig = Rig("2xCP8", pool={"max_model_len": 50_000})
    rig.ack_all()
    with pytest.raises(RequestRejected) as e:
        rig.pool.submit(req("x", 60_000))
    assert (e.value.reason, e.value.limit) == ("too_long", 50_000)
    rig.pool.submit(req("a", 100))
    with pytest.raises(ValueError, match="already in the pool"):
        rig.pool.submit(req("a", 100))


def test_split_drains_replaces_queued_requests_and_loses_none() -> None:
    rig = Rig("2xCP8", pool={"kv_capacity_blocks_per_rank": 4096})
    rig.ack_all()
    for k in range(6):
        rig.pool.submit(req(f"r{k}", 16384))
    at0 = [j.request.request_id for j in rig.plane.queues[0]]
    at1 = [j.request.request_id for j in rig.plane.queues[1]]
    assert (at0, at1) == (["r0", "r2", "r4"], ["r1", "r3", "r5"])
    rig.pool.prefill_started(0, "r0", 0.0)  # r0 runs; r2, r4 are queued
    rig.plane.queues[0].pop(0)
    plan = rig.pool.reconfigure(ReconfigKind.SPLIT, 0)
    assert plan.targets == (WorkerGroup(2, 0, 0, 4), WorkerGroup(3, 0, 4, 4)) and plan.epoch == 2
    assert rig.plane.log[-2:] == [("withdraw", 0, ("r2", "r4")), ("park", (0,))]
    # the only other ACTIVE worker is 1: r2 and r4 moved there, behind r1, r3, r5
    assert [j.request.request_id for j in rig.plane.queues[1]] == ["r1", "r3", "r5", "r2", "r4"]
    assert rig.snap(0).state == "DRAINING" and rig.pool.snapshot().reconfiguring == "split 0 -> 2,3 (drain)"
    rig.clock.t = 1.0
    rig.pool.prefill_done(PrefillResult("r0", 0, 0, 0.0, 1.0))
    rig.pool.worker_parked(0, 1.0)
    assert rig.plane.log[-1] == ("activate", (2, 3), 2)
    rig.clock.t = 1.4
    rig.ack(2, 2)
    assert rig.snap(2).state == "SWITCHING"  # not schedulable before every participating rank acked
    rig.ack(3, 2)
    assert [(p.epoch, d, s) for p, d, s in rig.done.reconfigs] == [(2, 1.0, pytest.approx(0.4))]
    snap = rig.pool.snapshot()
    assert (snap.composition, snap.epoch, [w.worker_id for w in snap.workers]) == ("2xCP4+1xCP8", 2, [1, 2, 3])
    assert rig.pool.submit(req("late", 16384)) is not None
    while any(rig.plane.queues.get(w) for w in (1, 2, 3)):
        for w in (1, 2, 3):
            if rig.plane.queues.get(w):
                rig.run_next(w)
    done = sorted(r for r, _, ok in rig.done.requests if ok)
    assert done == sorted(["r0", "r1", "r2", "r3", "r4", "r5", "late"]) and len(rig.done.requests) == 7


def test_backlog_while_nothing_is_schedulable_and_late_rejection() -> None:
    rig = Rig("1xCP8", nodes=1, pool={"kv_capacity_blocks_per_rank": 16})  # CP8: 128 blocks, CP4: 64
    rig.ack_all()
    rig.pool.reconfigure(ReconfigKind.SPLIT, 0)
    assert rig.pool.submit(req("small", 1000)) is None
    assert rig.pool.submit(req("huge", 40_000)) is None  # 79 blocks: fits the CP8 that is being split
    rig.pool.worker_parked(0, 0.5)
    rig.ack(1, 2)
    assert not any(rig.plane.queues.values())  # targets become schedulable together, at commit
    rig.ack(2, 2)
    assert [j.request.request_id for j in rig.plane.queues[1]] == ["small"]
    # the CP8 is gone: "huge" can never be served now and is reported failed, not dropped silently
    assert rig.done.requests == [("huge", None, False)]
    assert rig.pool.snapshot().backlog == 0


def test_worker_failure_replaces_everything_and_ignores_late_reports() -> None:
    rig = Rig("2xCP8")
    rig.ack_all()
    hashes = list(range(8))
    rig.pool.submit(req("seed", 4096, hashes))
    rig.run_next(0, cached_blocks_stored=True)
    for k in range(4):
        rig.pool.submit(req(f"r{k}", 4096))
    rig.pool.prefill_started(0, "r0", rig.clock.t)
    rig.pool.worker_failed(0, "rank 3 died", rig.clock.t)
    assert rig.plane.log[-1] == ("restart", 0, 2)
    assert rig.snap(0).state == "FAILED" and rig.snap(0).cached_blocks == 0
    assert rig.pool.cache.lookup(keys_from_hash_ids(hashes)).held_blocks == {}  # holdings dropped
    moved = [j.request.request_id for j in rig.plane.queues[1]]
    assert sorted(moved) == ["r0", "r1", "r2", "r3"]
    rig.pool.prefill_done(PrefillResult("r0", 0, 0, 0.0, 0.1))  # late report from the failed worker
    rig.pool.worker_failed(0, "again", rig.clock.t)  # duplicate report: ignored
    assert [r for r, _, _ in rig.done.requests] == ["seed"] and rig.plane.log[-1] == ("restart", 0, 2)
    rig.ack(0, 1)  # stale epoch
    assert rig.snap(0).state == "FAILED"
    rig.ack(0, 2)
    assert rig.snap(0).state == "ACTIVE" and rig.snap(0).epoch == 2
    # back ACTIVE, the restarted worker takes its share of the queue at once (scheduler.rebalance_on_activate):
    # the four requests are placed again in arrival order, alternating between the two idle workers
    assert {w: [j.request.request_id for j in q] for w, q in rig.plane.queues.items()} == {
        0: ["r1", "r3"],
        1: ["r0", "r2"],
    }
    assert rig.pool.rebalanced == 4
    for w in (0, 0, 1, 1):
        rig.run_next(w)
    assert sorted(r for r, _, _ in rig.done.requests) == ["r0", "r1", "r2", "r3", "seed"]
    assert len(rig.done.requests) == 5


def test_manual_reconfigure_validation() -> None:
    rig = Rig("1xCP8+2xCP4")
    rig.ack_all()
    with pytest.raises(ValueError, match="no worker 9"):
        rig.pool.reconfigure(ReconfigKind.SPLIT, 9)
    with pytest.raises(ValueError, match=r"cannot split worker 1 \(CP4\): degree 2 is not allowed"):
        rig.pool.reconfigure(ReconfigKind.SPLIT, 1)
    with pytest.raises(ValueError, match="cannot merge worker 0"):
        rig.pool.reconfigure(ReconfigKind.MERGE, 0)
    plan = rig.pool.reconfigure(ReconfigKind.MERGE, 2)
    assert [s.worker_id for s in plan.sources] == [1, 2] and plan.targets == (WorkerGroup(3, 1, 0, 8),)
    with pytest.raises(ValueError, match="merge is in progress"):
        rig.pool.reconfigure(ReconfigKind.SPLIT, 0)


def test_timers_windows_and_cache_scan_ops_are_confirmed() -> None:
    # The scan's intra-degree copy (cache.policy: rules; queue_aware would copy at placement instead).
    rig = Rig(
        "2xCP8",
        controller={"enabled": True, "window_s": 10.0, "policy": "rules"},
        cache={"policy": "rules", "scan_interval_s": 5.0},
    )
    rig.ack_all()
    assert rig.pool.next_timer() == 5.0
    hashes = list(range(16))
    rig.pool.submit(req("seed", 8192, hashes))
    rig.run_next(0, cached_blocks_stored=True)
    for k in range(12):  # twelve reuses of the same prefix at worker 0 (intra-degree demand)
        rig.pool.submit(req(f"h{k}", 8192 + 512, [*hashes, 1000 + k]))
        rig.run_next(0)
    rig.clock.t = 5.0
    rig.pool.on_timer(5.0)
    rig.pool.on_timer(5.0)  # idempotent per instant
    execs = [e for e in rig.plane.log if e[0] == "execute"]
    assert execs and execs[0][2:] == ("REPLICATE", 0, 1)
    assert rig.pool.next_timer() == 10.0
    op_id = execs[0][1]
    op = rig.pool._ops[op_id]
    rig.pool.cache_report(CacheReport(1, CacheReportKind.STORED, op.keys[op.first_missing :], None, op_id=op_id))
    assert (op_id, True) in rig.done.ops
    assert rig.pool.cache.lookup(keys_from_hash_ids(hashes)).held_blocks == {0: 16, 1: 16}  # visible now
    rig.pool.submit(req("busy", 8192))  # worker 0 gets busy: the replica at 1 now wins the next reuse
    p = rig.pool.submit(req("after", 8192 + 512, [*hashes, 5000]))
    assert p is not None and (p.worker_id, p.cached_tokens) == (1, 8192)
    rig.clock.t = 10.0
    rig.pool.on_timer(10.0)
    last = rig.pool.snapshot().last_window
    assert last is not None and (last["requests"], last["index"]) == (15, 0)


def test_completion_reported_after_the_commit_is_not_lost() -> None:
    rig = Rig("1xCP8", nodes=1)
    rig.ack_all()
    rig.pool.submit(req("a", 4096))
    rig.plane.queues[0].pop(0)  # the engine took it: running, not withdrawable
    rig.pool.prefill_started(0, "a", 0.0)
    rig.pool.reconfigure(ReconfigKind.SPLIT, 0)
    rig.pool.worker_parked(0, 0.1)  # an async data plane delivered "parked" before "done"
    rig.ack(1, 2)
    rig.ack(2, 2)
    assert rig.pool.snapshot().composition == "2xCP4" and rig.pool.snapshot().inflight == 1
    rig.pool.prefill_done(PrefillResult("a", 0, 0, 0.0, 0.2))
    assert rig.done.requests == [("a", 0, True)] and rig.pool.snapshot().inflight == 0


def test_pending_prefix_after_split_is_reconciled_at_first_reuse() -> None:
    rig = Rig("1xCP8", nodes=1)
    rig.ack_all()
    hashes = list(range(8))
    keys = keys_from_hash_ids(hashes)
    rig.pool.submit(req("seed", 8 * 512 + 100, hashes))
    rig.run_next(0, cached_blocks_stored=True)
    rig.pool.reconfigure(ReconfigKind.SPLIT, 0)
    rig.pool.worker_parked(0, rig.clock.t)
    rig.ack(1, 2)
    rig.ack(2, 2)
    # block b lived on rank b mod 8: the lower child (ranks 0-3) holds b0-b3 validly, b4-b7 are pending there
    # (physically on the upper child)
    m = rig.pool.cache.lookup(keys)
    assert (m.held_blocks, m.pending_blocks) == ({1: 4}, {1: 8})
    p = rig.pool.submit(req("b", 8 * 512 + 100, hashes))
    # priced with the pending blocks (cache.price_pending): the 4 it lacks are copied from the sibling first
    assert p is not None and (p.worker_id, p.cached_tokens) == (1, 4096)
    [job] = rig.plane.queues[1]
    op = job.reconcile
    assert op is not None and (op.src_worker, op.dst_worker, op.first_missing, op.keys) == (2, 1, 4, keys)
    assert job.max_reuse_blocks == 8
    # a second request for the prefix while the copy is in flight (the other child busy with a cold 16K prompt):
    # the same worker, priced with the pending prefix, no second copy, and it may reuse what the copy brings —
    # the copy lands before b's prefill, which is ahead of c's
    x = rig.pool.submit(req("x", 16384, list(range(100, 132))))
    assert x is not None and x.worker_id == 2
    q = rig.pool.submit(req("c", 8 * 512 + 100, hashes))
    assert q is not None and (q.worker_id, q.cached_tokens) == (1, 4096)
    second = rig.plane.queues[1][1]
    assert second.request.request_id == "c" and second.reconcile is None and second.max_reuse_blocks == 8
    rig.pool.cache_report(CacheReport(1, CacheReportKind.STORED, keys[4:], keys[3], op_id=op.op_id))
    assert rig.done.ops == [(op.op_id, True)]
    assert rig.pool.cache.lookup(keys).held_blocks[1] == 8


def test_a_data_plane_refusing_a_job_leaves_nothing_reserved() -> None:
    rig = Rig("2xCP8")
    rig.ack_all()

    def refuse(worker_id: int, job: PrefillJob) -> None:
        raise RuntimeError("engine unreachable")

    rig.plane.submit = refuse  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="unreachable"):
        rig.pool.submit(req("a", 4096, list(range(8))))
    snap = rig.pool.snapshot()
    assert snap.inflight == 0 and snap.backlog == 0 and rig.snap(0).queue_s == 0.0
    assert rig.snap(0).free_kv_blocks == 8 * 2048


def _prefix_at(rig: Rig, workers: Sequence[int], hashes: Sequence[int]) -> tuple[int, ...]:
    keys = keys_from_hash_ids(hashes)
    for w in workers:
        rig.pool.cache_report(CacheReport(w, CacheReportKind.STORED, keys, None))
    return keys


def test_a_request_replaced_after_a_failure_is_recorded_in_the_cache_statistics_once() -> None:
    rig = Rig("1xCP8+2xCP4")  # w0: CP8 on node 0; w1, w2: CP4 on node 1
    rig.ack_all()
    keys = _prefix_at(rig, (1, 2), range(8))
    p = rig.pool.submit(req("r", 8 * 512 + 512, [*range(8), 100]))
    assert p is not None and (p.worker_id, p.cached_tokens) == (1, 4096)
    recorded = ({4: 1.0, 8: 0.0}, {4: 0.0, 8: 0.0})  # one reuse at CP4; CP4 (C_pref) holds it: no miss
    assert [node_stats(rig.pool.cache.trie, rig.pool.cache.degrees, k) for k in keys] == [recorded] * 8
    rig.pool.worker_failed(1, "rank 5 died", rig.clock.t)
    [job] = rig.plane.queues[2]  # moved to the other holder, which reuses the same prefix
    assert (job.request.request_id, job.placement.worker_id, job.placement.cached_tokens) == ("r", 2, 4096)
    assert [node_stats(rig.pool.cache.trie, rig.pool.cache.degrees, k) for k in keys] == [
        recorded
    ] * 8  # the same request: no second access


def test_a_request_replaced_by_a_drain_is_recorded_in_the_cache_statistics_once() -> None:
    rig = Rig("1xCP8+2xCP4")
    rig.ack_all()
    keys = _prefix_at(rig, (1,), range(8))
    p = rig.pool.submit(req("r", 8 * 512 + 512, [*range(8), 100]))
    assert p is not None and (p.worker_id, p.cached_tokens, p.preferred_degree) == (1, 4096, 4)
    recorded = ({4: 1.0, 8: 0.0}, {4: 0.0, 8: 0.0})
    assert [node_stats(rig.pool.cache.trie, rig.pool.cache.degrees, k) for k in keys] == [recorded] * 8
    rig.pool.reconfigure(ReconfigKind.MERGE, 1)  # w1 + w2 drain: the queued request moves to w0 (CP8)
    [job] = rig.plane.queues[0]
    assert (job.request.request_id, job.placement.worker_id, job.placement.preferred_degree) == ("r", 0, 8)
    # w1 still holds the prefix while it drains, no CP8 worker does: a second record would add missed[z, 8].
    assert [node_stats(rig.pool.cache.trie, rig.pool.cache.degrees, k) for k in keys] == [recorded] * 8
    assert rig.snap(1).state == "DRAINING"


@pytest.mark.parametrize("rebalance", [True, False])
def test_a_split_takes_over_the_backlog_queued_during_its_drain(rebalance: bool) -> None:
    rig = Rig("2xCP8", scheduler={"rebalance_on_activate": rebalance})
    rig.ack_all()
    rig.pool.submit(req("r0", 16384))
    rig.pool.prefill_started(0, "r0", 0.0)  # worker 0 runs r0 while it drains
    rig.plane.queues[0].pop(0)
    rig.pool.reconfigure(ReconfigKind.SPLIT, 0)
    for k in range(1, 6):  # arrivals during the drain: worker 1 is the only ACTIVE worker
        rig.pool.submit(req(f"r{k}", 16384))
    assert [j.request.request_id for j in rig.plane.queues[1]] == ["r1", "r2", "r3", "r4", "r5"]
    rig.pool.prefill_started(1, "r1", 0.0)  # r1 runs: it stays; r2..r5 wait behind it
    rig.plane.queues[1].pop(0)
    before = rig.pool.rebalanced
    rig.clock.t = 1.0
    rig.pool.prefill_done(PrefillResult("r0", 0, 0, 0.0, 1.0))
    rig.pool.worker_parked(0, 1.0)
    rig.clock.t = 1.8
    rig.ack(2, 2)
    rig.ack(3, 2)  # commit: the children 2, 3 are ACTIVE
    queued = {w: [j.request.request_id for j in rig.plane.queues.get(w, [])] for w in (1, 2, 3)}
    if rebalance:
        # placed again in arrival order by J: the idle children take the head of the backlog at once;
        assert rig.pool.rebalanced - before == 4
        # r2, r3 start on the idle children; r4, r5 wait for the CP8 worker (its r1 ends before a child's r2)
        assert queued == {1: ["r4", "r5"], 2: ["r2"], 3: ["r3"]}
    else:
        assert rig.pool.rebalanced == before
        assert queued == {1: ["r2", "r3", "r4", "r5"], 2: [], 3: []}
    rig.clock.t = 2.0
    rig.pool.prefill_done(PrefillResult("r1", 1, 0, 0.0, 2.0))
    while any(rig.plane.queues.get(w) for w in (1, 2, 3)):
        for w in (1, 2, 3):
            if rig.plane.queues.get(w):
                rig.run_next(w)
    assert sorted(r for r, _, ok in rig.done.requests if ok) == [f"r{k}" for k in range(6)]
    assert len(rig.done.requests) == 6 and rig.pool.snapshot().inflight == 0
