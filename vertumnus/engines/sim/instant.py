"""The trivial data plane: no engine, no copying; for measuring the control plane and the serving front end.

Each worker runs its jobs FCFS, one at a time; a job takes ``prefill_s(job)`` seconds (default 0: it finishes on
the next turn of the loop). Cache ops are confirmed at once (a job's attached op when the job starts); a switch or
restart acks every rank after ``switch_s``. Two block models:

- ``blocks_per_rank`` None (the control-plane replay): nothing is kept; a finished job reports the blocks it
  computed anew (beyond ``max_reuse_blocks``, under their parent) as stored, as engine KV events do, and its cached
  tokens are the placement's;
- ``blocks_per_rank`` set (``vertumnus bench serve``): each worker keeps its block set with LRU eviction (the
  simulator's :class:`~vertumnus.engines.sim.cache.BlockCache`) and reports stores, evictions and, when regrouped
  or restarted, CLEARED, so the pool's trie, matches and reuse behave as with a real engine.

Events run on a :data:`Schedule`: the simulator's :class:`~vertumnus.engines.sim.events.EventLoop`
(:func:`on_event_loop`) or, by default, the running asyncio loop. Re-entrancy invariant (the DataPlane rule): no
callback is made from inside the pool's own call; every event is scheduled.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from vertumnus.engines.sim.cache import BlockCache
from vertumnus.engines.sim.events import EventKind, EventLoop
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

# schedule(delay_s, fn, *args): run fn(*args) delay_s seconds from now, never synchronously
Schedule = Callable[..., None]


def on_event_loop(loop: EventLoop) -> Schedule:
    """A :data:`Schedule` on the simulator's event loop (engine events)."""

    def schedule(delay: float, fn: Callable[..., None], *args: Any) -> None:
        loop.push(loop.now + delay, EventKind.ENGINE, fn, *args)

    return schedule


def on_asyncio(loop: asyncio.AbstractEventLoop) -> Schedule:
    """A :data:`Schedule` on an asyncio loop (delay 0: the next iteration)."""

    def schedule(delay: float, fn: Callable[..., None], *args: Any) -> None:
        if delay > 0:
            loop.call_later(delay, fn, *args)
        else:
            loop.call_soon(fn, *args)

    return schedule


@dataclass(slots=True)
class _Worker:
    group: WorkerGroup
    cache: BlockCache | None
    queue: deque[PrefillJob] = field(default_factory=deque)
    running: PrefillJob | None = None
    parking: bool = False


class InstantDataPlane:
    """:class:`vertumnus.interfaces.DataPlane` whose work takes no resources (see the module docstring)."""

    def __init__(
        self,
        clock: Callable[[], float],
        gpus_per_node: int,
        *,
        schedule: Schedule | None = None,
        prefill_s: Callable[[PrefillJob], float] | None = None,
        switch_s: float = 0.0,
        blocks_per_rank: int | None = None,
        block_tokens: int = 512,
    ) -> None:
        """``schedule`` None: the asyncio loop running at :meth:`start`."""
        self.clock = clock
        self.gpn = gpus_per_node
        self._schedule = schedule
        self.prefill_s = prefill_s
        self.switch_s = switch_s
        self.blocks_per_rank = blocks_per_rank
        self.block_tokens = block_tokens
        self.workers: dict[int, _Worker] = {}
        self._events: EngineEvents | None = None
        self._tick = 0
        self.completed = 0

    @property
    def events(self) -> EngineEvents:
        assert self._events is not None, "data plane not started"
        return self._events

    def _soon(self, delay: float, fn: Callable[..., None], *args: Any) -> None:
        assert self._schedule is not None, "data plane not started"
        self._schedule(delay, fn, *args)

    def _new_worker(self, group: WorkerGroup) -> _Worker:
        cache = None if self.blocks_per_rank is None else BlockCache(self.blocks_per_rank * group.degree)
        w = self.workers[group.worker_id] = _Worker(group, cache)
        return w

    def _ack(self, group: WorkerGroup, epoch: int) -> None:
        for rank in group.global_ranks(self.gpn):
            self.events.epoch_ack(group.worker_id, rank, epoch, self.clock())

    def _up_after(self, group: WorkerGroup, epoch: int, delay: float) -> None:
        """A new worker (empty cache) acks ``epoch`` after ``delay``; with a block model, then reports CLEARED so
        the trie drops what it inherited."""
        self._new_worker(group)
        self._soon(delay, self._ack, group, epoch)
        if self.blocks_per_rank is not None:
            self._soon(delay, self.events.cache_report, CacheReport(group.worker_id, CacheReportKind.CLEARED))

    # -- DataPlane ----------------------------------------------------------------------------------------------
    def start(self, groups: Sequence[WorkerGroup], epoch: int, events: EngineEvents) -> None:
        self._events = events
        if self._schedule is None:
            self._schedule = on_asyncio(asyncio.get_running_loop())
        for g in groups:
            self._new_worker(g)
            self._soon(0.0, self._ack, g, epoch)

    def submit(self, worker_id: int, job: PrefillJob) -> None:
        w = self.workers[worker_id]
        w.queue.append(job)
        if w.running is None and not w.parking:
            self._soon(0.0, self._begin, w)

    def _begin(self, w: _Worker) -> None:
        if w.running is not None or not w.queue or w.parking:
            return
        job = w.running = w.queue.popleft()
        if job.reconcile is not None:
            self._apply(job.reconcile)
        now = self.clock()
        self.events.prefill_started(w.group.worker_id, job.request.request_id, now)
        self._soon(0.0 if self.prefill_s is None else self.prefill_s(job), self._finish, w, job, now)

    def _finish(self, w: _Worker, job: PrefillJob, started: float) -> None:
        w.running = None
        wid = w.group.worker_id
        if self.workers.get(wid) is w:  # not regrouped or restarted meanwhile
            self.events.prefill_done(PrefillResult(job.request.request_id, wid, self._store(w, job), started,
                                                   self.clock()))  # fmt: skip
            self.completed += 1
        if w.parking:
            self.events.worker_parked(wid, self.clock())
        elif w.queue:
            self._begin(w)

    def _store(self, w: _Worker, job: PrefillJob) -> int:
        """Report the job's blocks as the engine's KV events would; returns the tokens it reused."""
        req, wid = job.request, w.group.worker_id
        keys, n = req.block_keys, job.max_reuse_blocks
        if w.cache is None:
            if len(keys) > n:  # only the newly computed blocks, under their parent
                self.events.cache_report(CacheReport(wid, CacheReportKind.STORED, keys[n:], keys[n - 1] if n else None))
            return job.placement.cached_tokens
        reused = w.cache.leading(keys, n)
        self._tick += 1
        first_new, evicted = w.cache.store(keys, self._tick)
        if evicted:
            self.events.cache_report(CacheReport(wid, CacheReportKind.REMOVED, tuple(evicted)))
        if first_new is not None:
            parent = keys[first_new - 1] if first_new else None
            self.events.cache_report(CacheReport(wid, CacheReportKind.STORED, tuple(keys[first_new:]), parent))
        return min(reused * self.block_tokens, req.input_len - 1) if reused else 0

    def withdraw(self, worker_id: int) -> list[PrefillJob]:
        w = self.workers[worker_id]
        jobs = list(w.queue)
        w.queue.clear()
        return jobs

    def park(self, worker_ids: Sequence[int]) -> None:
        for wid in worker_ids:
            w = self.workers[wid]
            w.parking = True
            if w.running is None:
                self._soon(0.0, self.events.worker_parked, wid, self.clock())

    def activate(self, plan: ReconfigPlan) -> None:
        for s in plan.sources:
            self.workers.pop(s.worker_id, None)
        for g in plan.targets:
            self._up_after(g, plan.epoch, self.switch_s)

    def execute(self, op: CacheOp) -> None:
        self._soon(0.0, self._apply, op)

    def _apply(self, op: CacheOp) -> None:
        """Carry out a cache op at once and confirm it (REMOVED for a reclaim, STORED otherwise, with its id)."""
        fm = op.first_missing
        w = self.workers.get(op.dst_worker)
        if w is None or w.cache is None:
            if w is None and self.blocks_per_rank is not None:
                self.events.cache_op_failed(op.op_id, "destination worker is gone")
                return
            if op.src_worker is None and op.kind == CacheOpKind.RECONCILE:
                return
            kind = CacheReportKind.REMOVED if op.kind == CacheOpKind.RECLAIM else CacheReportKind.STORED
            self.events.cache_report(CacheReport(op.dst_worker, kind, op.keys[fm:], op.keys[fm - 1] if fm else None,
                                                 op_id=op.op_id))  # fmt: skip
            return
        self._tick += 1
        if op.kind == CacheOpKind.RECLAIM:
            removed = w.cache.remove(op.keys[fm:])
            keys = tuple(removed or op.keys[fm:])
            self.events.cache_report(CacheReport(op.dst_worker, CacheReportKind.REMOVED, keys, op_id=op.op_id))
            return
        _, evicted = w.cache.store(op.keys, self._tick)
        if evicted:
            self.events.cache_report(CacheReport(op.dst_worker, CacheReportKind.REMOVED, tuple(evicted)))
        parent = op.keys[fm - 1] if fm else None
        self.events.cache_report(CacheReport(op.dst_worker, CacheReportKind.STORED, tuple(op.keys[fm:]), parent,
                                             op.op_id))  # fmt: skip

    def restart(self, group: WorkerGroup, epoch: int) -> None:
        self._up_after(group, epoch, self.switch_s)

    def close(self) -> None:
        self.workers.clear()
