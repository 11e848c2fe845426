"""A minimal in-process data plane for measuring the control plane: no engine, no copying.

Each worker runs its jobs FCFS; a job finishes exactly ``placement.predicted_s`` after it starts, then the
worker reports the blocks it computed anew (beyond ``max_reuse_blocks``, under their parent) as stored, as
engine KV events do. Cache ops are confirmed at once; a switch / restart acks every rank after ``switch_s``.
Events go through :class:`EventHeap` and never call the pool from inside a pool call, so what a replay
measures is the control plane (scheduler, trie, controller) plus a thin heap.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from vertumnus.interfaces import EngineEvents, PrefillJob
from vertumnus.types import (
    CacheOp,
    CacheOpKind,
    CacheReport,
    CacheReportKind,
    PrefillResult,
    ReconfigPlan,
    WorkerGroup,
)


class EventHeap:
    """(time, priority, seq) ordered callbacks; priority 0 = engine, 1 = timer, 2 = arrival."""

    __slots__ = ("heap", "now", "popped", "seq")

    def __init__(self) -> None:
        self.heap: list[tuple[float, int, int, Callable[..., None], tuple[Any, ...]]] = []
        self.now = 0.0
        self.seq = 0
        self.popped = 0

    def clock(self) -> float:
        return self.now

    def push(self, t: float, prio: int, fn: Callable[..., None], *args: Any) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, prio, self.seq, fn, args))

    def pop(self) -> bool:
        """Run the next event; False when empty."""
        if not self.heap:
            return False
        t, _, _, fn, args = heapq.heappop(self.heap)
        self.now = t
        self.popped += 1
        fn(*args)
        return True


@dataclass(slots=True)
class _Worker:
    group: WorkerGroup
    queue: deque[PrefillJob] = field(default_factory=deque)
    running: PrefillJob | None = None
    park: bool = False


class InstantPlane:
    """:class:`vertumnus.interfaces.DataPlane` over an :class:`EventHeap` (see the module docstring)."""

    def __init__(self, heap: EventHeap, switch_s: float = 0.0) -> None:
        self.heap = heap
        self.switch_s = switch_s
        self.workers: dict[int, _Worker] = {}
        self.events: EngineEvents | None = None
        self.completed = 0

    def _ev(self) -> EngineEvents:
        assert self.events is not None, "data plane not started"
        return self.events

    def _ack_later(self, groups: Sequence[WorkerGroup], epoch: int, delay: float) -> None:
        for g in groups:
            self.workers[g.worker_id] = _Worker(g)
            for r in g.ranks:
                self.heap.push(self.heap.now + delay, 0, self._ack, g.worker_id, r, epoch)

    def _ack(self, worker_id: int, rank: int, epoch: int) -> None:
        self._ev().epoch_ack(worker_id, rank, epoch, self.heap.now)

    def start(self, groups: Sequence[WorkerGroup], epoch: int, events: EngineEvents) -> None:
        self.events = events
        self._ack_later(groups, epoch, 0.0)

    def submit(self, worker_id: int, job: PrefillJob) -> None:
        w = self.workers[worker_id]
        w.queue.append(job)
        if w.running is None and not w.park:
            self.heap.push(self.heap.now, 0, self._begin, w)

    def _begin(self, w: _Worker) -> None:
        if w.running is not None or not w.queue or w.park:
            return
        job = w.running = w.queue.popleft()
        ev = self._ev()
        if job.reconcile is not None:
            self._confirm(job.reconcile)
        ev.prefill_started(w.group.worker_id, job.request.request_id, self.heap.now)
        self.heap.push(self.heap.now + job.placement.predicted_s, 0, self._finish, w, job)

    def _finish(self, w: _Worker, job: PrefillJob) -> None:
        ev = self._ev()
        now = self.heap.now
        w.running = None
        wid = w.group.worker_id
        if self.workers.get(wid) is w:  # not restarted meanwhile
            started = now - job.placement.predicted_s
            ev.prefill_done(PrefillResult(job.request.request_id, wid, job.placement.cached_tokens, started, now))
            self.completed += 1
            keys, n = job.request.block_keys, job.max_reuse_blocks
            if len(keys) > n:  # like engines' KV events: only the newly computed blocks, under their parent
                ev.cache_report(CacheReport(wid, CacheReportKind.STORED, keys[n:], keys[n - 1] if n else None))
        if w.park:
            ev.worker_parked(wid, now)
        elif w.queue:
            self._begin(w)

    def withdraw(self, worker_id: int) -> list[PrefillJob]:
        w = self.workers[worker_id]
        jobs = list(w.queue)
        w.queue.clear()
        return jobs

    def park(self, worker_ids: Sequence[int]) -> None:
        for wid in worker_ids:
            w = self.workers[wid]
            w.park = True
            if w.running is None:
                self.heap.push(self.heap.now, 0, self._ev().worker_parked, wid, self.heap.now)

    def activate(self, plan: ReconfigPlan) -> None:
        for s in plan.sources:
            self.workers.pop(s.worker_id, None)
        self._ack_later(plan.targets, plan.epoch, self.switch_s)

    def execute(self, op: CacheOp) -> None:
        self.heap.push(self.heap.now, 0, self._confirm, op)

    def _confirm(self, op: CacheOp) -> None:
        if op.src_worker is None and op.kind == CacheOpKind.RECONCILE:
            return
        kind = CacheReportKind.REMOVED if op.kind == CacheOpKind.RECLAIM else CacheReportKind.STORED
        parent = op.keys[op.first_missing - 1] if op.first_missing > 0 else None
        keys = op.keys[op.first_missing :]
        self._ev().cache_report(CacheReport(op.dst_worker, kind, keys, parent, op_id=op.op_id))

    def restart(self, group: WorkerGroup, epoch: int) -> None:
        self._ack_later([group], epoch, self.switch_s)

    def close(self) -> None:
        self.workers.clear()
