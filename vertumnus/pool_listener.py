"""What the pool reports outward: listener callbacks and the snapshot served at ``/v1/pool``.

The simulator's metrics collector and the server's Prometheus metrics are :class:`PoolListener` s. Each
request is reported exactly once through ``request_done`` — after any re-placement (drain, failure), never
for a late completion from a worker it was taken away from.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from vertumnus.types import CacheOp, Placement, PrefillResult, ReconfigPlan, Request


class PoolListener(Protocol):
    """Observer of a :class:`~vertumnus.pool.PrefillPool`. Methods run inside pool calls: keep them short and
    never call back into the pool from them."""

    def request_done(self, request: Request, placement: Placement | None, result: PrefillResult | None) -> None:
        """A request finished: ``result.ok`` tells success. ``placement`` is the final placement; it is None
        (and ``result.ok`` False, ``result.worker_id`` −1) for a request accepted into the backlog that later
        turned out unservable (e.g. a split left no worker with enough KV capacity)."""
        ...

    def reconfig_done(self, plan: ReconfigPlan, drain_s: float, switch_s: float) -> None:
        """A split / merge committed; the targets are schedulable from now on."""
        ...

    def cache_op_done(self, op: CacheOp, ok: bool) -> None:
        """A replicate / reclaim / reconcile op was confirmed (ok) or failed / cancelled (not ok)."""
        ...


@dataclass(slots=True)
class WorkerSnapshot:
    """One worker in ``/v1/pool``."""

    worker_id: int
    degree: int
    node: int
    ranks: tuple[int, ...]  # global rank ids (node × gpus_per_node + node-local rank)
    state: str  # WorkerState name
    epoch: int
    queue_s: float  # q_w(now)
    queued: int  # requests queued or running there
    running: str | None  # request id running now, if reported started
    free_kv_blocks: int  # KV capacity not reserved by queued / running requests
    cached_blocks: int  # trie blocks this worker holds


@dataclass(slots=True)
class PoolSnapshot:
    """The pool at one instant (``/v1/pool``; JSON-ready via ``dataclasses.asdict``)."""

    now: float
    epoch: int
    composition: str  # e.g. "2xCP4+4xCP8"
    workers: list[WorkerSnapshot]
    backlog: int  # requests waiting for a schedulable worker
    inflight: int  # requests placed and not done
    reconfiguring: str | None  # e.g. "split 3 -> 7,8 (drain)" while an operation is in flight
    last_window: dict[str, float | int | str | None] | None  # demand_s, capacity_s, rho, requests, ...
    reconfigs_done: int
    cache: dict[str, float | int] = field(default_factory=dict)  # CacheManager.stats()
