"""A transparent DataPlane wrapper that lets the server watch engine events on their way to the pool.

The pool hands itself to ``data_plane.start(groups, epoch, events)``; the wrapper substitutes a tee that forwards
every callback to the pool unchanged and, after the pool has seen it, tells the server's runtime about the ones
it times (prefill start → per-request queue time and router overhead; worker failure → metrics). Works for any
engine (torch, vLLM, the benchmark's instant engine) because it only sees the :mod:`vertumnus.interfaces` seams.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from vertumnus.interfaces import DataPlane, EngineEvents, PrefillJob
from vertumnus.types import CacheOp, CacheReport, PrefillResult, ReconfigPlan, WorkerGroup


class EventObserver(Protocol):
    def on_prefill_started(self, worker_id: int, request_id: str, now: float) -> None: ...

    def on_worker_failed(self, worker_id: int, reason: str) -> None: ...


class _TeeEvents:
    """Forwards to the pool first (its state must be current when the observer reads it), then observes."""

    __slots__ = ("_obs", "_pool")

    def __init__(self, pool: EngineEvents, observer: EventObserver) -> None:
        self._pool = pool
        self._obs = observer

    def prefill_started(self, worker_id: int, request_id: str, now: float) -> None:
        self._pool.prefill_started(worker_id, request_id, now)
        self._obs.on_prefill_started(worker_id, request_id, now)

    def prefill_done(self, result: PrefillResult) -> None:
        self._pool.prefill_done(result)

    def cache_report(self, report: CacheReport) -> None:
        self._pool.cache_report(report)

    def cache_op_failed(self, op_id: int, reason: str) -> None:
        self._pool.cache_op_failed(op_id, reason)

    def worker_parked(self, worker_id: int, now: float) -> None:
        self._pool.worker_parked(worker_id, now)

    def epoch_ack(self, worker_id: int, rank: int, epoch: int, now: float) -> None:
        self._pool.epoch_ack(worker_id, rank, epoch, now)

    def worker_failed(self, worker_id: int, reason: str, now: float) -> None:
        self._pool.worker_failed(worker_id, reason, now)
        self._obs.on_worker_failed(worker_id, reason)


class ObservedDataPlane:
    """Delegates every DataPlane call to ``inner``; only ``start`` differs (it installs the tee)."""

    __slots__ = ("_obs", "inner")

    def __init__(self, inner: DataPlane, observer: EventObserver) -> None:
        self.inner = inner
        self._obs = observer

    def start(self, groups: Sequence[WorkerGroup], epoch: int, events: EngineEvents) -> None:
        self.inner.start(groups, epoch, _TeeEvents(events, self._obs))

    def submit(self, worker_id: int, job: PrefillJob) -> None:
        self.inner.submit(worker_id, job)

    def withdraw(self, worker_id: int) -> list[PrefillJob]:
        return self.inner.withdraw(worker_id)

    def park(self, worker_ids: Sequence[int]) -> None:
        self.inner.park(worker_ids)

    def activate(self, plan: ReconfigPlan) -> None:
        self.inner.activate(plan)

    def execute(self, op: CacheOp) -> None:
        self.inner.execute(op)

    def restart(self, group: WorkerGroup, epoch: int) -> None:
        self.inner.restart(group, epoch)

    def close(self) -> None:
        self.inner.close()
