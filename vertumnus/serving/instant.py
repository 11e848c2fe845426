"""The trivial engine of ``vertumnus bench serve``: it measures the front end + pool, not a model.

:class:`InstantDataPlane` completes every prefill on the next event-loop iteration after it starts (FCFS per
worker, one at a time, exactly like a real worker's queue), acks epochs at once and confirms cache ops at once.
It computes nothing, but keeps each worker's block set with LRU eviction (the simulator's
:class:`~vertumnus.engines.sim.cache.BlockCache`) and reports stores / evictions, so the pool's trie, matches and
reuse behave as with a real engine. :class:`InstantDecode` answers every request with one ``<|eos|>`` token.
Both keep the DataPlane re-entrancy rule: no callback is made from inside the pool's own call — every event is
scheduled with ``loop.call_soon``.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from vertumnus.engines.sim.cache import BlockCache
from vertumnus.interfaces import EngineEvents, PrefillJob
from vertumnus.serving.handoff import DecodeChunk, DecodeRequest
from vertumnus.serving.tokenizer import EOS
from vertumnus.types import CacheOp, CacheOpKind, CacheReport, CacheReportKind, PrefillResult, ReconfigPlan, WorkerGroup


class _Worker:
    __slots__ = ("busy", "cache", "group", "parking", "queue")

    def __init__(self, group: WorkerGroup, capacity: int) -> None:
        self.group = group
        self.cache = BlockCache(capacity)
        self.queue: deque[PrefillJob] = deque()
        self.busy = False
        self.parking = False


class InstantDataPlane:
    """A DataPlane whose prefills take one loop iteration (see module docstring)."""

    def __init__(self, gpus_per_node: int, blocks_per_rank: int, block_tokens: int, clock: Callable[[], float]) -> None:
        self.gpn = gpus_per_node
        self.blocks_per_rank = blocks_per_rank
        self.block_tokens = block_tokens
        self.clock = clock
        self._tick = 0
        self.workers: dict[int, _Worker] = {}
        self._events: EngineEvents | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def events(self) -> EngineEvents:
        assert self._events is not None, "start() not called"
        return self._events

    def _soon(self, fn: Callable[..., Any], *args: Any) -> None:
        assert self._loop is not None
        self._loop.call_soon(fn, *args)

    def _ack(self, group: WorkerGroup, epoch: int) -> None:
        for rank in group.global_ranks(self.gpn):
            self.events.epoch_ack(group.worker_id, rank, epoch, self.clock())

    def start(self, groups: Sequence[WorkerGroup], epoch: int, events: EngineEvents) -> None:
        self._events = events
        self._loop = asyncio.get_running_loop()
        for g in groups:
            self.workers[g.worker_id] = self._worker(g)
            self._soon(self._ack, g, epoch)

    def _worker(self, g: WorkerGroup) -> _Worker:
        return _Worker(g, self.blocks_per_rank * g.degree)

    def submit(self, worker_id: int, job: PrefillJob) -> None:
        w = self.workers[worker_id]
        w.queue.append(job)
        if not w.busy:
            w.busy = True
            self._soon(self._run_next, w)

    def _run_next(self, w: _Worker) -> None:
        """Start the head job (if any) and finish it on the next iteration; then park or continue."""
        if not w.queue or w.parking:
            w.busy = False
            if w.parking:
                self.events.worker_parked(w.group.worker_id, self.clock())
            return
        job = w.queue.popleft()
        now = self.clock()
        self.events.prefill_started(w.group.worker_id, job.request.request_id, now)
        self._soon(self._finish, w, job, now)

    def _finish(self, w: _Worker, job: PrefillJob, started: float) -> None:
        req, wid = job.request, w.group.worker_id
        keys = req.block_keys
        reused = w.cache.leading(keys, job.max_reuse_blocks)
        self._tick += 1
        first_new, evicted = w.cache.store(keys, self._tick)
        if evicted:
            self.events.cache_report(CacheReport(wid, CacheReportKind.REMOVED, tuple(evicted)))
        if first_new is not None:
            parent = keys[first_new - 1] if first_new else None
            self.events.cache_report(CacheReport(wid, CacheReportKind.STORED, tuple(keys[first_new:]), parent))
        cached = min(reused * self.block_tokens, req.input_len - 1) if reused else 0
        self.events.prefill_done(PrefillResult(req.request_id, wid, cached, started, self.clock()))
        self._run_next(w)

    def withdraw(self, worker_id: int) -> list[PrefillJob]:
        w = self.workers[worker_id]
        out = list(w.queue)
        w.queue.clear()
        return out

    def park(self, worker_ids: Sequence[int]) -> None:
        for wid in worker_ids:
            w = self.workers[wid]
            w.parking = True
            if not w.busy:
                self._soon(self.events.worker_parked, wid, self.clock())

    def activate(self, plan: ReconfigPlan) -> None:
        for s in plan.sources:
            self.workers.pop(s.worker_id, None)
        for g in plan.targets:  # targets start empty: acked, then CLEARED so the trie drops inherited holdings
            self.workers[g.worker_id] = self._worker(g)
            self._soon(self._ack, g, plan.epoch)
            self._soon(self.events.cache_report, CacheReport(g.worker_id, CacheReportKind.CLEARED))

    def execute(self, op: CacheOp) -> None:
        """Copies and deletions happen at once (no data to move); confirmed with the op id."""
        w = self.workers.get(op.dst_worker)
        if w is None:
            self._soon(self.events.cache_op_failed, op.op_id, "destination worker is gone")
            return
        self._tick += 1
        if op.kind == CacheOpKind.RECLAIM:
            removed = w.cache.remove(op.keys[op.first_missing :])
            report = CacheReport(
                op.dst_worker, CacheReportKind.REMOVED, tuple(removed or op.keys[op.first_missing :]), op_id=op.op_id
            )
        else:
            _, evicted = w.cache.store(op.keys, self._tick)
            if evicted:
                self._soon(
                    self.events.cache_report, CacheReport(op.dst_worker, CacheReportKind.REMOVED, tuple(evicted))
                )
            fm = op.first_missing
            report = CacheReport(
                op.dst_worker, CacheReportKind.STORED, tuple(op.keys[fm:]), op.keys[fm - 1] if fm else None, op.op_id
            )
        self._soon(self.events.cache_report, report)

    def restart(self, group: WorkerGroup, epoch: int) -> None:
        self.workers[group.worker_id] = self._worker(group)
        self._soon(self._ack, group, epoch)
        self._soon(self.events.cache_report, CacheReport(group.worker_id, CacheReportKind.CLEARED))

    def close(self) -> None:
        self.workers.clear()


class InstantDecode:
    """Answers each request with a single ``<|eos|>`` (finish_reason "stop")."""

    async def start(self) -> None:
        return None

    async def stream(self, req: DecodeRequest) -> AsyncIterator[DecodeChunk]:
        yield DecodeChunk([EOS], "stop")

    async def abort(self, request_id: str) -> None:
        return None

    async def stats(self) -> dict[str, Any]:
        return {"backend": "instant", "active": 0}

    async def close(self) -> None:
        return None
