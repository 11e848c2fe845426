"""TorchDataPlane scenarios with real rank processes (gloo, 127.0.0.1): split / merge in place, mid-traffic
split, cache ops between workers, eviction reports, rank failure and restart."""

from __future__ import annotations

import os
import signal
import threading

import pytest
import torch
from cp_helpers import TOL, Recorder, job, tiny_config, tokens

from vertumnus.cache.block_keys import keys_from_tokens
from vertumnus.cp.model import ReferenceModel
from vertumnus.engines.torch.data_plane import TorchDataPlane
from vertumnus.interfaces import DataPlane, PrefillJob
from vertumnus.types import CacheOp, CacheOpKind, CacheReportKind, ReconfigKind, ReconfigPlan, WorkerGroup

B = 8  # block tokens


def _run(
    dp: TorchDataPlane, rec: Recorder, rid: str, toks: list[int], wid: int, degree: int, **kw: object
) -> tuple[int, torch.Tensor]:
    dp.submit(wid, job(rid, toks, wid, degree, B, **kw))  # type: ignore[arg-type]
    res = rec.done(rid)
    out = dp.take_output(rid)
    assert out is not None and res.worker_id == wid and res.ok
    return res.cached_tokens, out.logits


def _acks(rec: Recorder, epoch: int) -> set[tuple[int, int]]:
    return {(w, r) for w, r, e in rec.of("ack") if e == epoch}


def test_prefix_survives_split_and_merge_with_identical_logits() -> None:
    cfg = tiny_config(4, [2, 4])
    ref = ReferenceModel.from_config(cfg.model)
    rec = Recorder()
    w4, lo, hi, merged = (
        WorkerGroup(0, 0, 0, 4),
        WorkerGroup(1, 0, 0, 2),
        WorkerGroup(2, 0, 2, 2),
        WorkerGroup(3, 0, 0, 4),
    )
    p = tokens(60, 1)  # 7 full blocks
    q = p[:56] + tokens(21, 2)  # shares 7 blocks, 9 full blocks
    kq = keys_from_tokens(q, B)
    with TorchDataPlane(cfg, return_kv=True) as dp:
        plane: DataPlane = dp
        plane.start([w4], 0, rec)
        rec.wait(lambda: _acks(rec, 0) == {(0, 0), (0, 1), (0, 2), (0, 3)})
        dp.submit(0, job("p", p, 0, 4, B))
        assert rec.done("p").cached_tokens == 0
        out = dp.take_output("p")
        assert out is not None and out.kv is not None
        ref_logits, ref_cache = ref.prefill(p)
        assert (out.logits - ref_logits).abs().max().item() <= TOL
        assert (out.kv - ref_cache.tensor()).abs().max().item() <= TOL
        stored = [r for r in rec.reports(0) if r.kind == CacheReportKind.STORED]
        assert [(r.keys, r.parent) for r in stored] == [(keys_from_tokens(p, B), None)]

        cached, l4 = _run(dp, rec, "q-cp4", q, 0, 4)
        assert cached == 56
        assert (l4 - ref.prefill(q)[0]).abs().max().item() <= TOL

        # split CP4 -> CP2 + CP2: blocks of depth mod 4 in {0, 1} stay with `lo`, {2, 3} with `hi`
        dp.park([0])
        rec.wait(lambda: 0 in rec.of("parked"))
        dp.activate(ReconfigPlan(ReconfigKind.SPLIT, (w4,), (lo, hi), 1))
        rec.wait(lambda: _acks(rec, 1) == {(1, 0), (1, 1), (2, 2), (2, 3)})
        cached, l_lo = _run(
            dp, rec, "q-lo", q, 1, 2, reconcile=CacheOp(7, CacheOpKind.RECONCILE, 1, kq, 2, src_worker=2)
        )
        assert cached == 72  # all 9 blocks: the missing 2, 3, 6, 7 came from the sibling
        assert (7 in {r.op_id for r in rec.reports(1)}) and not rec.of("op_failed")
        confirm = next(r for r in rec.reports(1) if r.op_id == 7)
        assert (confirm.kind, confirm.keys, confirm.parent) == (CacheReportKind.STORED, kq[2:], kq[1])
        cached, l_hi = _run(
            dp, rec, "q-hi", q, 2, 2, reconcile=CacheOp(8, CacheOpKind.RECONCILE, 2, kq, 0, src_worker=1)
        )
        assert cached == 72
        assert (l_lo - l4).abs().max().item() <= 1e-5 and (l_hi - l4).abs().max().item() <= 1e-5

        # merge back: either source's blocks serve without copying
        dp.park([1, 2])
        rec.wait(lambda: {1, 2} <= set(rec.of("parked")))
        dp.activate(ReconfigPlan(ReconfigKind.MERGE, (lo, hi), (merged,), 2))
        rec.wait(lambda: _acks(rec, 2) == {(3, 0), (3, 1), (3, 2), (3, 3)})
        cached, l_m = _run(dp, rec, "q-merged", q, 3, 4)
        assert cached == 72 and (l_m - l4).abs().max().item() <= 1e-5
        assert not rec.of("op_failed") and not rec.of("failed")


def test_split_ordered_mid_traffic_loses_no_request() -> None:
    cfg = tiny_config(2, [1, 2], capacity=6)  # 5 blocks per prompt: eviction happens along the way
    ref = ReferenceModel.from_config(cfg.model)
    rec = Recorder()
    w, a, b = WorkerGroup(0, 0, 0, 2), WorkerGroup(1, 0, 0, 1), WorkerGroup(2, 0, 1, 1)
    prompts = {f"r{i}": tokens(40 + i, 10 + i) for i in range(6)}
    prompts["late"] = tokens(33, 99)
    queued, taken = threading.Event(), threading.Event()
    withdrawn: list[PrefillJob] = []

    def drain_while_r0_runs(worker_id: int, request_id: str) -> None:
        # On the driver thread: r0's completion is not handled before this returns, so r1 cannot be dispatched
        # however fast the ranks are (or slow this thread is); the drain sees exactly the five queued jobs.
        if request_id == "r0":
            assert queued.wait(60)
            withdrawn.extend(dp.withdraw(0))  # drain: queued jobs go back to the pool
            taken.set()

    rec.on_started = drain_while_r0_runs
    with TorchDataPlane(cfg, return_kv=False) as dp:
        dp.start([w], 0, rec)
        for rid in ("r0", "r1", "r2", "r3", "r4", "r5"):
            dp.submit(0, job(rid, prompts[rid], 0, 2, B))
        queued.set()
        assert taken.wait(60)
        assert [j.request.request_id for j in withdrawn] == ["r1", "r2", "r3", "r4", "r5"]
        dp.park([0])
        dp.submit(0, job("late", prompts["late"], 0, 2, B))  # arrives after the drain: must not be lost
        rec.wait(lambda: 0 in rec.of("parked"))
        assert [r.request_id for r in rec.of("done")] == ["r0"]  # the running prefill finished first
        dp.activate(ReconfigPlan(ReconfigKind.SPLIT, (w,), (a, b), 1))
        for i, jb in enumerate(withdrawn):
            dp.submit(1 + i % 2, jb)
        rec.wait(lambda: len(rec.of("done")) == 7)
        done = {r.request_id: r.worker_id for r in rec.of("done")}
        assert done == {"r0": 0, "r1": 1, "r2": 2, "r3": 1, "r4": 2, "r5": 1, "late": 1}
        for rid, toks in prompts.items():
            out = dp.take_output(rid)
            assert out is not None and out.kv is None
            assert (out.logits - ref.prefill(toks)[0]).abs().max().item() <= TOL, rid
    # each worker's reports replay to a holding within its capacity (6 blocks per rank); a child starts with
    # the parent's blocks on its rank (depth mod 2 = its position)
    depth = {k: d for toks in prompts.values() for d, k in enumerate(keys_from_tokens(toks, B))}
    parent: set[int] = set()
    for wid, degree in ((0, 2), (1, 1), (2, 1)):
        held = {k for k in parent if depth[k] % 2 == wid - 1}
        for r in rec.reports(wid):
            if r.kind == CacheReportKind.STORED:
                held |= set(r.keys)
            else:
                assert set(r.keys) <= held
                held -= set(r.keys)
        assert 0 < len(held) <= 6 * degree
        if wid == 0:
            parent = held
    assert any(r.kind == CacheReportKind.REMOVED for r in rec.of("report"))


def test_cache_ops_replicate_across_degrees_reclaim_and_fail_cleanly() -> None:
    cfg = tiny_config(4, [1, 2])
    ref = ReferenceModel.from_config(cfg.model)
    rec = Recorder()
    w0, w1, w2 = WorkerGroup(0, 0, 0, 2), WorkerGroup(1, 0, 2, 1), WorkerGroup(2, 0, 3, 1)
    p = tokens(50, 5)  # 6 blocks
    p2 = p[:48] + tokens(7, 6)
    k = keys_from_tokens(p, B)
    want = ref.prefill(p2)[0]

    def confirmed(op_id: int) -> list:
        rec.wait(
            lambda: any(r.op_id == op_id for r in rec.of("report")) or any(o == op_id for o, _ in rec.of("op_failed"))
        )
        return [r for r in rec.of("report") if r.op_id == op_id]

    with TorchDataPlane(cfg) as dp:
        dp.start([w0, w1, w2], 0, rec)
        _run(dp, rec, "p", p, 0, 2)
        dp.execute(CacheOp(1, CacheOpKind.REPLICATE, 1, k, 0, src_worker=0, inter_degree=True))  # CP2 -> CP1
        (c1,) = confirmed(1)
        assert (c1.worker_id, c1.kind, c1.keys, c1.parent) == (1, CacheReportKind.STORED, k, None)
        cached, logits = _run(dp, rec, "p2@1", p2, 1, 1)
        assert cached == 48 and (logits - want).abs().max().item() <= TOL
        dp.execute(CacheOp(2, CacheOpKind.REPLICATE, 2, k, 0, src_worker=1))  # CP1 -> CP1, same degree
        (c2,) = confirmed(2)
        assert (c2.worker_id, c2.keys) == (2, k)
        cached, logits = _run(dp, rec, "p2@2", p2, 2, 1)
        assert cached == 48 and (logits - want).abs().max().item() <= TOL

        dp.execute(CacheOp(3, CacheOpKind.RECLAIM, 0, k, 3))
        (c3,) = confirmed(3)
        assert (c3.worker_id, c3.kind, c3.keys[:3]) == (0, CacheReportKind.REMOVED, k[3:])
        cached, logits = _run(dp, rec, "p2@0", p2, 0, 2)
        assert cached == 24 and (logits - want).abs().max().item() <= TOL
        dp.execute(CacheOp(4, CacheOpKind.RECLAIM, 2, k, 0))
        confirmed(4)
        # CP1 -> CP2 re-partition into a worker that holds the first 3 blocks ... after reclaiming them again
        dp.execute(CacheOp(5, CacheOpKind.RECLAIM, 0, k, 3))
        confirmed(5)
        dp.execute(CacheOp(6, CacheOpKind.REPLICATE, 0, k, 3, src_worker=1, inter_degree=True))
        (c6,) = confirmed(6)
        assert (c6.worker_id, c6.keys, c6.parent) == (0, k[3:], k[2])
        cached, logits = _run(dp, rec, "p2@0b", p2, 0, 2)
        assert cached == 48 and (logits - want).abs().max().item() <= TOL

        # a source that lacks the blocks: nothing installed, the op fails; unknown workers fail too
        dp.execute(CacheOp(9, CacheOpKind.REPLICATE, 1, k, 0, src_worker=2))  # w1 holds all: success
        assert confirmed(9)[0].keys == k
        dp.execute(CacheOp(10, CacheOpKind.REPLICATE, 2, k, 0, src_worker=2))  # w2 reclaimed everything
        assert confirmed(10) == []
        dp.execute(CacheOp(11, CacheOpKind.RECLAIM, 42, k, 0))
        confirmed(11)
        failed = dict(rec.of("op_failed"))
        assert set(failed) == {10, 11} and "lacks 6 block" in failed[10] and "42" in failed[11]
        cached, _ = _run(dp, rec, "p2@2b", p2, 2, 1)
        assert cached == 0


def test_dead_rank_fails_its_worker_and_restart_rejoins_the_world() -> None:
    cfg = tiny_config(2, [1, 2])
    ref = ReferenceModel.from_config(cfg.model)
    rec = Recorder()
    a, b, ab = WorkerGroup(0, 0, 0, 1), WorkerGroup(1, 0, 1, 1), WorkerGroup(2, 0, 0, 2)
    p = tokens(52, 7)
    want = ref.prefill(p)[0]
    with TorchDataPlane(cfg) as dp:
        dp.start([a, b], 0, rec)
        assert _run(dp, rec, "p@1", p, 1, 1)[0] == 0
        pid = dp.rank_pid(0)
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        rec.wait(lambda: [w for w, _ in rec.of("failed")] == [0])
        with pytest.raises(ValueError, match="unknown or failed"):
            dp.submit(0, job("x", p, 0, 1, B))
        dp.restart(a, 1)
        rec.wait(lambda: (0, 0) in _acks(rec, 1))  # then the restarted worker reports its empty cache
        rec.wait(lambda: any(r.kind == CacheReportKind.CLEARED for r in rec.reports(0)))
        cached, logits = _run(dp, rec, "p@0", p, 0, 1)
        assert cached == 0 and (logits - want).abs().max().item() <= TOL
        cached, logits = _run(dp, rec, "p@1 again", p, 1, 1)  # the live worker kept its cache
        assert cached == 48 and (logits - want).abs().max().item() <= TOL
        # the re-formed groups work: merge the restarted rank with the survivor
        dp.park([0, 1])
        rec.wait(lambda: {0, 1} <= set(rec.of("parked")))
        dp.activate(ReconfigPlan(ReconfigKind.MERGE, (a, b), (ab,), 2))
        rec.wait(lambda: _acks(rec, 2) == {(2, 0), (2, 1)})
        cached, logits = _run(dp, rec, "p@merged", p, 2, 2)
        assert cached == 48 and (logits - want).abs().max().item() <= TOL
        assert [w for w, _ in rec.of("failed")] == [0]


def test_a_queued_jobs_copy_starts_at_submit_and_its_prefill_follows_it() -> None:
    """A job queued behind another has its fetch started at submit (the transfer overlaps the wait); its prefill
    reuses the copied prefix. A withdrawn job's copy still lands and reports, but no prefill follows it."""
    cfg = tiny_config(4, [1, 2])
    ref = ReferenceModel.from_config(cfg.model)
    rec = Recorder()
    w0, w1 = WorkerGroup(0, 0, 0, 2), WorkerGroup(1, 0, 2, 1)
    p = tokens(50, 7)  # 6 full blocks
    p2 = p[:48] + tokens(9, 8)
    k = keys_from_tokens(p, B)
    with TorchDataPlane(cfg) as dp:
        dp.start([w0, w1], 0, rec)
        _run(dp, rec, "p", p, 0, 2)  # worker 0 holds the prefix
        # "busy" is dispatched by this very submit (the slot runs it before submit returns), so "fetch" is queued
        dp.submit(1, job("busy", tokens(40, 9), 1, 1, B))
        fetch = CacheOp(5, CacheOpKind.REPLICATE, 1, k, 0, src_worker=0, inter_degree=True)
        dp.submit(1, job("fetch", p2, 1, 1, B, reconcile=fetch))
        res = rec.done("fetch")
        assert res.ok and res.cached_tokens == 48
        out = dp.take_output("fetch")
        assert out is not None and (out.logits - ref.prefill(p2)[0]).abs().max().item() <= TOL
        assert [r.keys for r in rec.reports(1) if r.op_id == 5] == [k] and not rec.of("op_failed")

        gone = CacheOp(6, CacheOpKind.REPLICATE, 1, k, 0, src_worker=0, inter_degree=True)
        queued, taken = threading.Event(), threading.Event()
        withdrawn: list[PrefillJob] = []

        def drain_while_busy2_runs(worker_id: int, request_id: str) -> None:
            # On the driver thread: "busy2" cannot complete (and "withdrawn" cannot start) before this returns.
            if request_id == "busy2":
                assert queued.wait(60)
                withdrawn.extend(dp.withdraw(1))
                taken.set()

        rec.on_started = drain_while_busy2_runs
        dp.submit(1, job("busy2", tokens(40, 10), 1, 1, B))
        dp.submit(1, job("withdrawn", p2, 1, 1, B, reconcile=gone))
        queued.set()
        assert taken.wait(60)
        assert [j.request.request_id for j in withdrawn] == ["withdrawn"]
        rec.wait(lambda: any(r.op_id == 6 for r in rec.reports(1)))  # the copy landed and confirmed
        rec.done("busy2")
        assert all(r.request_id != "withdrawn" for r in rec.of("done"))


def test_a_prefix_reused_by_two_prefills_outlives_one_off_prompts_on_real_ranks() -> None:
    """Retention (cache.retain_reused 2): under eviction pressure the rank keeps the shared prefix and evicts the
    one-off prompts' blocks; plain LRU (retain_reused 0, what norepl runs) loses the prefix to them."""
    prefix = tokens(16, 7)  # 2 blocks
    users = [prefix + tokens(9, 100 + i) for i in range(4)]  # 3 full blocks each, the first 2 shared
    one_offs = [tokens(25, 200 + i) for i in range(3)]  # 3 blocks each: 9 > the 6-block capacity
    ref = ReferenceModel.from_config(tiny_config(1, [1]).model)
    for retain_reused, reused in ((2, 16), (0, 0)):
        cfg = tiny_config(1, [1], capacity=6)
        cfg.cache.retain_reused = retain_reused
        rec = Recorder()
        with TorchDataPlane(cfg, return_kv=False) as dp:
            dp.start([WorkerGroup(0, 0, 0, 1)], 0, rec)
            assert [_run(dp, rec, f"u{i}", users[i], 0, 1)[0] for i in range(3)] == [0, 16, 16]
            for i, toks in enumerate(one_offs):
                assert _run(dp, rec, f"o{i}", toks, 0, 1)[0] == 0
            cached, logits = _run(dp, rec, "u3", users[3], 0, 1)
            assert cached == reused, retain_reused
            assert (logits - ref.prefill(users[3])[0]).abs().max().item() <= TOL
