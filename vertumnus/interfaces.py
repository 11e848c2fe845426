"""The seams between policy code and data planes, as Protocols.

::

      HTTP front end / simulator workload
                   │ Request
                   ▼
      ┌──────────── PrefillPool (vertumnus.pool) ────────────┐
      │ cache.lookup → scheduler.place → cache.commit        │   policy code: no torch, no ray
      │ Controller (windows, lattice, epochs)                │
      └───────┬──────────────────────────────▲───────────────┘
              │ DataPlane calls              │ EngineEvents callbacks
              ▼                              │
      sim engine │ torch CP engine │ vLLM engines  (one DataPlane each)

The pool drives a :class:`DataPlane`; the data plane reports back through :class:`EngineEvents`. The simulator
calls the callbacks from its event loop at virtual times; real engines call them from their threads / asyncio
tasks (the pool serialises them). Times passed in are seconds on the pool's clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from vertumnus.types import CacheOp, CacheReport, Placement, PrefillResult, ReconfigPlan, Request, WorkerGroup


@dataclass(slots=True)
class PrefillJob:
    """One request handed to a worker: what to compute and what the scheduler predicted.

    ``reconcile``: a copy to finish before the prefill (a RECONCILE of a pending prefix's missing blocks, or a
    queue_aware fetch), or None. An engine that can copy beside compute starts it when the job is queued behind
    others, so the transfer overlaps the wait (docs/design.md, *Attached copies*). ``max_reuse_blocks``: the
    engine must not reuse more than this many leading blocks of the prompt (the blocks the trie knows the worker
    holds validly, plus the reconciled ones); it may reuse fewer if its own cache evicted some in between.
    """

    request: Request
    placement: Placement
    reconcile: CacheOp | None = None
    max_reuse_blocks: int = 0


class EngineEvents(Protocol):
    """Callbacks from a data plane into the pool."""

    def prefill_started(self, worker_id: int, request_id: str, now: float) -> None: ...

    def prefill_done(self, result: PrefillResult) -> None: ...

    def cache_report(self, report: CacheReport) -> None: ...

    def cache_op_failed(self, op_id: int, reason: str) -> None: ...

    def worker_parked(self, worker_id: int, now: float) -> None: ...

    def epoch_ack(self, worker_id: int, rank: int, epoch: int, now: float) -> None: ...

    def worker_failed(self, worker_id: int, reason: str, now: float) -> None: ...


class DataPlane(Protocol):
    """All ranks of a pool. Workers are views over ranks; a reconfiguration re-groups ranks in place
    (torch engine) or restarts engines (vLLM)."""

    def start(self, groups: Sequence[WorkerGroup], epoch: int, events: EngineEvents) -> None:
        """Bring up ranks grouped as ``groups``; each rank acks ``epoch`` via ``events.epoch_ack``."""
        ...

    def submit(self, worker_id: int, job: PrefillJob) -> None:
        """Queue a prefill at a worker (FCFS, one prefill at a time per worker)."""
        ...

    def withdraw(self, worker_id: int) -> list[PrefillJob]:
        """Remove and return the worker's queued (not started) jobs — the drain step re-places them."""
        ...

    def park(self, worker_ids: Sequence[int]) -> None:
        """Stop the workers at their next step boundary once their running prefill (if any) finished;
        each reports ``events.worker_parked``."""
        ...

    def activate(self, plan: ReconfigPlan) -> None:
        """Switch parked ranks from ``plan.sources`` to ``plan.targets`` (weights and KV stay resident); each
        participating rank acks ``plan.epoch`` via ``events.epoch_ack``."""
        ...

    def execute(self, op: CacheOp) -> None:
        """Run a cache op (replicate / reclaim / reconcile); confirmed by a CacheReport with ``op_id`` or
        ``events.cache_op_failed``."""
        ...

    def restart(self, group: WorkerGroup, epoch: int) -> None:
        """Bring a FAILED worker's ranks back under ``epoch`` (ack via ``events.epoch_ack``)."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class EngineStatsSource(Protocol):
    """Optional: a data plane with counters of its own (the vLLM backend's KV-event feeds, logical reclamations,
    engine restarts). The server registers :meth:`collector` in its ``/metrics`` registry and shows :meth:`stats`
    under ``engine_stats`` in ``/v1/pool``."""

    def stats(self) -> dict[str, Any]:
        """The counters as plain data."""
        ...

    def collector(self) -> Any:
        """A ``prometheus_client`` collector of the same counters (read at scrape time)."""
        ...
