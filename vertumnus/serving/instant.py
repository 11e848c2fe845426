"""The trivial engine of ``vertumnus bench serve``: it measures the front end + pool, not a model.

:class:`InstantDataPlane` completes every prefill on the next event-loop iteration after it starts (FCFS per
worker, one at a time, exactly like a real worker's queue), acks epochs at once and confirms cache ops at once;
it holds no KV and reports no cache contents. :class:`InstantDecode` answers every request with one
``<|eos|>`` token. Both keep the DataPlane re-entrancy rule: no callback is made from inside the pool's own
call — every event is scheduled with ``loop.call_soon``.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from vertumnus.interfaces import EngineEvents, PrefillJob
from vertumnus.serving.handoff import DecodeChunk, DecodeRequest
from vertumnus.serving.tokenizer import EOS
from vertumnus.types import CacheOp, CacheOpKind, CacheReport, CacheReportKind, PrefillResult, ReconfigPlan, WorkerGroup


class _Worker:
    __slots__ = ("busy", "group", "parking", "queue")

    def __init__(self, group: WorkerGroup) -> None:
        self.group = group
        self.queue: deque[PrefillJob] = deque()
        self.busy = False
        self.parking = False


class InstantDataPlane:
    """A DataPlane whose prefills take one loop iteration (see module docstring)."""

    def __init__(self, gpus_per_node: int, clock: Callable[[], float]) -> None:
        self.gpn = gpus_per_node
        self.clock = clock
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
            self.workers[g.worker_id] = _Worker(g)
            self._soon(self._ack, g, epoch)

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
        rid = job.request.request_id
        self.events.prefill_done(PrefillResult(rid, w.group.worker_id, 0, started, self.clock()))
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
        for g in plan.targets:
            self.workers[g.worker_id] = _Worker(g)
            self._soon(self._ack, g, plan.epoch)

    def execute(self, op: CacheOp) -> None:
        kind = CacheReportKind.REMOVED if op.kind == CacheOpKind.RECLAIM else CacheReportKind.STORED
        keys = op.keys[op.first_missing :]
        parent = op.keys[op.first_missing - 1] if op.first_missing > 0 and kind == CacheReportKind.STORED else None
        self._soon(self.events.cache_report, CacheReport(op.dst_worker, kind, keys, parent, op.op_id))

    def restart(self, group: WorkerGroup, epoch: int) -> None:
        self.workers[group.worker_id] = _Worker(group)
        self._soon(self._ack, group, epoch)

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
