"""The simulated engine against a recording EngineEvents: FCFS service times, reuse, cache reports,
copies, reclaim, park / switch (split and merge) and acks — exact times with a hand-made profile."""

from __future__ import annotations

from typing import Any

import pytest

from vertumnus.config import config_from_dict
from vertumnus.cost_model import CostModel, CostProfile, DegreeProfile
from vertumnus.engines.sim import SimDataPlane
from vertumnus.engines.sim.events import EventKind, EventLoop
from vertumnus.interfaces import PrefillJob
from vertumnus.types import (
    CacheOp,
    CacheOpKind,
    CacheReport,
    CacheReportKind,
    Placement,
    PrefillResult,
    ReconfigKind,
    ReconfigPlan,
    Request,
    WorkerGroup,
)

# E_C(R, P) = 0.5 + 0.001·R + 0.0001·P + 0.002·R / C   (b, c > 0; a = α = 0 keep the arithmetic exact)
PROFILE = CostProfile(
    degrees={c: DegreeProfile(d=0.5, a=0.001, b=0.0001, c=0.002, alpha=0.0) for c in (1, 2, 4)}, source="test"
)
BLOCK = 100
BW = 1e9  # bytes/s (1 GB/s); 1e6 bytes a block -> 1 ms a block


class Recorder:
    """EngineEvents that records every callback with the virtual time it arrived at."""

    def __init__(self, loop: EventLoop) -> None:
        self.loop = loop
        self.calls: list[tuple[float, str, Any]] = []

    def _rec(self, name: str, payload: Any) -> None:
        self.calls.append((self.loop.now, name, payload))

    def prefill_started(self, worker_id: int, request_id: str, now: float) -> None:
        self._rec("started", (worker_id, request_id))

    def prefill_done(self, result: PrefillResult) -> None:
        self._rec("done", result)

    def cache_report(self, report: CacheReport) -> None:
        self._rec("report", report)

    def cache_op_failed(self, op_id: int, reason: str) -> None:
        self._rec("op_failed", (op_id, reason))

    def worker_parked(self, worker_id: int, now: float) -> None:
        self._rec("parked", worker_id)

    def epoch_ack(self, worker_id: int, rank: int, epoch: int, now: float) -> None:
        self._rec("ack", (worker_id, rank, epoch))

    def worker_failed(self, worker_id: int, reason: str, now: float) -> None:
        self._rec("failed", worker_id)

    def of(self, name: str) -> list[tuple[float, Any]]:
        return [(t, p) for t, n, p in self.calls if n == name]


def make(capacity_per_rank: int = 10) -> tuple[EventLoop, SimDataPlane, Recorder]:
    cfg = config_from_dict(
        {
            "pool": {
                "nodes": 2,
                "gpus_per_node": 4,
                "degrees": [1, 2, 4],
                "kv_capacity_blocks_per_rank": capacity_per_rank,
                "sim_switch_s": 0.25,
            },
            "cache": {
                "block_tokens": BLOCK,
                "bytes_per_block": 1_000_000,
                "intra_node_gbps": 1.0,
                "inter_node_gbps": 0.5,
            },
        }
    )
    loop = EventLoop()
    dp = SimDataPlane(cfg, CostModel(PROFILE), loop)
    rec = Recorder(loop)
    return loop, dp, rec


def job(rid: str, keys: tuple[int, ...], tokens: int, worker: int, reuse: int) -> PrefillJob:
    req = Request(rid, 0.0, tokens, keys)
    return PrefillJob(req, Placement(rid, worker, 2, 0, tokens, 0.0, 0.0, 0.0, 2, 1), None, reuse)


G0 = WorkerGroup(0, 0, 0, 2)  # node 0, ranks 0-1
G1 = WorkerGroup(1, 0, 2, 2)  # node 0, ranks 2-3
G2 = WorkerGroup(2, 1, 0, 4)  # node 1, ranks 0-3


def test_fcfs_service_times_reuse_and_reports() -> None:
    loop, dp, rec = make()
    dp.start([G0, G1], 1, rec)
    loop.run()
    assert sorted(p for _, p in rec.of("ack")) == [(0, 0, 1), (0, 1, 1), (1, 2, 1), (1, 3, 1)]
    dp.submit(0, job("a", (11, 12, 13), 350, 0, 0))
    dp.submit(0, job("b", (11, 12, 14), 320, 0, 2))  # may reuse 2 blocks: the ones "a" stores
    loop.run()
    # a: R=350, P=0 -> 0.5 + 0.35 + 0.35 = 1.2; b starts at 1.2 with P=200, R=120 -> 0.5+0.12+0.02+0.12 = 0.76
    done = rec.of("done")
    assert [(t, r.request_id, r.cached_tokens, r.started_s) for t, r in done] == [
        (pytest.approx(1.2), "a", 0, 0.0),
        (pytest.approx(1.96), "b", 200, pytest.approx(1.2)),
    ]
    reports = [p for _, p in rec.of("report")]
    assert reports == [
        CacheReport(0, CacheReportKind.STORED, (11, 12, 13), None),
        CacheReport(0, CacheReportKind.STORED, (14,), 12),
    ]


def test_max_reuse_caps_what_the_engine_reuses() -> None:
    loop, dp, rec = make()
    dp.start([G0], 1, rec)
    dp.submit(0, job("a", (1, 2, 3), 300, 0, 0))
    dp.submit(0, job("b", (1, 2, 3), 300, 0, 1))  # trie said only 1 block is valid
    loop.run()
    assert [r.cached_tokens for _, r in rec.of("done")] == [0, 100]


def test_lru_eviction_reported_as_removed() -> None:
    loop, dp, rec = make(capacity_per_rank=2)  # degree 2 -> 4 blocks
    dp.start([G0], 1, rec)
    dp.submit(0, job("a", (1, 2, 3), 300, 0, 0))
    dp.submit(0, job("b", (7, 8), 200, 0, 0))
    loop.run()
    reports = [p for _, p in rec.of("report")]
    assert reports[-2:] == [
        CacheReport(0, CacheReportKind.REMOVED, (3,), None),  # a's tail goes first
        CacheReport(0, CacheReportKind.STORED, (7, 8), None),
    ]


def test_replicate_costs_bandwidth_and_confirms_with_op_id() -> None:
    loop, dp, rec = make()
    dp.start([G0, G1, G2], 1, rec)
    dp.submit(0, job("a", (1, 2, 3, 4), 400, 0, 0))
    dp.submit(1, job("b", (1, 2), 200, 1, 0))
    loop.run()
    t0 = loop.now
    rec.calls.clear()
    # intra-node 0 -> 1: worker 1 misses 2 blocks = 2 MB at 1 GB/s = 2 ms
    dp.execute(CacheOp(7, CacheOpKind.REPLICATE, 1, (1, 2, 3, 4), 2, src_worker=0))
    # inter-node 0 -> 2: 4 blocks at 0.5 GB/s = 8 ms
    dp.execute(CacheOp(8, CacheOpKind.REPLICATE, 2, (1, 2, 3, 4), 0, src_worker=0, inter_node=True))
    loop.run()
    reps = rec.of("report")
    assert reps[0] == (pytest.approx(t0 + 0.002), CacheReport(1, CacheReportKind.STORED, (3, 4), 2, 7))
    assert reps[1] == (pytest.approx(t0 + 0.008), CacheReport(2, CacheReportKind.STORED, (1, 2, 3, 4), None, 8))
    assert dp.stats.copied_blocks == 6
    # the source lost the blocks: the op fails instead of copying
    dp.execute(CacheOp(9, CacheOpKind.REPLICATE, 2, (5, 6), 0, src_worker=0))
    loop.run()
    assert rec.of("op_failed")[-1][1] == (9, "source no longer holds the missing blocks")


def test_reclaim_frees_capacity_now() -> None:
    loop, dp, rec = make()
    dp.start([G0], 1, rec)
    dp.submit(0, job("a", (1, 2, 3), 300, 0, 0))
    loop.run()
    dp.execute(CacheOp(3, CacheOpKind.RECLAIM, 0, (1, 2, 3), 1))
    loop.run()
    assert rec.of("report")[-1][1] == CacheReport(0, CacheReportKind.REMOVED, (3, 2), None, 3)  # deepest first
    assert dp.workers[0].cache.keys() == [1]


def test_park_waits_for_running_prefill_then_split_and_merge() -> None:
    loop, dp, rec = make()
    dp.start([G2], 1, rec)
    dp.submit(2, job("a", (1, 2, 3, 4, 5), 500, 2, 0))
    dp.submit(2, job("b", (9,), 150, 2, 0))
    loop.step()  # acks
    loop.run(until=lambda: bool(rec.of("started")))
    assert [j.request.request_id for j in dp.withdraw(2)] == ["b"]
    dp.park([2])
    loop.run()
    # a: R=500 at C=4 -> 0.5 + 0.5 + 0.25 = 1.25; parked right when it finishes
    assert rec.of("parked") == [(pytest.approx(1.25), 2)]
    lo, hi = WorkerGroup(3, 1, 0, 2), WorkerGroup(4, 1, 2, 2)
    rec.calls.clear()
    dp.activate(ReconfigPlan(ReconfigKind.SPLIT, (G2,), (lo, hi), 2))
    loop.run()
    acks = rec.of("ack")
    assert [t for t, _ in acks] == [pytest.approx(1.5)] * 4  # switch_s = 0.25
    assert sorted(p for _, p in acks) == [(3, 4, 2), (3, 5, 2), (4, 6, 2), (4, 7, 2)]
    # block b on parent rank b mod 4: ranks 0-1 -> lower child, 2-3 -> upper child
    assert sorted(dp.workers[3].cache.keys()) == [1, 2, 5]
    assert sorted(dp.workers[4].cache.keys()) == [3, 4]
    # reconcile on first reuse: the lower child copies blocks 3, 4 from its sibling (intra-node, 2 ms)
    rec.calls.clear()
    j = job("c", (1, 2, 3, 4, 5), 520, 3, 5)
    j.reconcile = CacheOp(11, CacheOpKind.RECONCILE, 3, (1, 2, 3, 4, 5), 2, src_worker=4)
    dp.submit(3, j)
    loop.run()
    assert rec.of("report")[0] == (pytest.approx(1.502), CacheReport(3, CacheReportKind.STORED, (3, 4, 5), 2, 11))
    # c: P=500, R=20 at C=2 -> 0.5 + 0.02 + 0.05 + 0.02 = 0.59 after the copy
    assert rec.of("done")[0][0] == pytest.approx(1.502 + 0.59)
    assert rec.of("done")[0][1].cached_tokens == 500
    # merge back: all blocks kept
    dp.park([3, 4])
    loop.run()
    dp.activate(ReconfigPlan(ReconfigKind.MERGE, (lo, hi), (WorkerGroup(5, 1, 0, 4),), 3))
    loop.run()
    assert sorted(dp.workers[5].cache.keys()) == [1, 2, 3, 4, 5]
    assert 3 not in dp.workers and 4 not in dp.workers


def _fetch(op_id: int, rid: str, dst: int, src: int) -> PrefillJob:
    """A job at ``dst`` that reuses blocks 1-4 after copying them from ``src`` (inter-node: 4 blocks, 8 ms)."""
    j = job(rid, (1, 2, 3, 4, 5), 520, dst, 4)
    j.reconcile = CacheOp(op_id, CacheOpKind.REPLICATE, dst, (1, 2, 3, 4), 0, src_worker=src, inter_node=True)
    return j


def _warm_source_and_queue(dp: SimDataPlane, loop: EventLoop, rec: Recorder) -> float:
    """Worker 2 (node 1) holds blocks 1-4; worker 0 is then busy with a 1.2-s prefill. Returns its start."""
    dp.start([G0, G2], 1, rec)
    dp.submit(2, job("src", (1, 2, 3, 4), 400, 2, 0))
    loop.run()
    t0 = loop.now
    rec.calls.clear()
    dp.submit(0, job("a", (11, 12, 13), 350, 0, 0))  # 1.2 s at C=2
    loop.run(until=lambda: bool(rec.of("started")))
    assert loop.now == t0
    return t0


def test_a_queued_jobs_copy_runs_during_its_wait() -> None:
    loop, dp, rec = make()
    t0 = _warm_source_and_queue(dp, loop, rec)
    dp.submit(0, _fetch(21, "b", 0, 2))  # queued behind "a": its copy starts now
    loop.run()
    # the copy lands 8 ms after submit (confirmed with its op id), long before "a" is done
    assert rec.of("report")[0] == (
        pytest.approx(t0 + 0.008),
        CacheReport(0, CacheReportKind.STORED, (1, 2, 3, 4), None, 21),
    )
    # b starts when "a" ends (no copy left to wait for): P=400, R=120 at C=2 -> 0.5+0.12+0.04+0.12 = 0.78
    done = {r.request_id: (t, r) for t, r in rec.of("done")}
    assert done["b"][1].started_s == pytest.approx(t0 + 1.2)
    assert done["b"][0] == pytest.approx(t0 + 1.2 + 0.78)
    assert done["b"][1].cached_tokens == 400
    assert dp.stats.copies == 1


def test_a_copy_longer_than_the_wait_delays_only_its_own_job() -> None:
    loop, dp, rec = make()
    t0 = _warm_source_and_queue(dp, loop, rec)
    # submitted 5 ms before "a" ends: its 8-ms copy lands 3 ms after
    loop.push(t0 + 1.195, EventKind.ARRIVAL, dp.submit, 0, _fetch(22, "b", 0, 2))
    loop.run()
    done = {r.request_id: (t, r) for t, r in rec.of("done")}
    assert done["b"][1].started_s == pytest.approx(t0 + 1.2)  # at the head when "a" ends, waiting for its copy
    assert done["b"][0] == pytest.approx(t0 + 1.195 + 0.008 + 0.78)
    assert done["b"][1].cached_tokens == 400


def test_withdrawing_a_job_cancels_its_copy() -> None:
    loop, dp, rec = make()
    _warm_source_and_queue(dp, loop, rec)
    dp.submit(0, _fetch(23, "b", 0, 2))
    assert [j.request.request_id for j in dp.withdraw(0)] == ["b"]
    loop.run()
    assert all(p.op_id != 23 for _, p in rec.of("report"))  # nothing stored or confirmed for it
    assert 1 not in dp.workers[0].cache
    assert [r.request_id for _, r in rec.of("done")] == ["a"]
