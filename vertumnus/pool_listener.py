"""What the pool reports outward: listener callbacks and the snapshot served at ``/v1/pool``.

The simulator's metrics collector and the server's Prometheus metrics are :class:`PoolListener` s. Each
request is reported exactly once through ``request_done`` — after any re-placement (drain, failure), never
for a late completion from a worker it was taken away from.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from vertumnus.config import format_composition
from vertumnus.controller.controller import Controller
from vertumnus.controller.epochs import EpochManager, Phase
from vertumnus.controller.predictive import Check
from vertumnus.scheduler.scheduler import Scheduler
from vertumnus.types import CacheOp, Placement, PrefillResult, ReconfigPlan, Request, WorkerState


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
    # demand_s, capacity_s, rho, requests, ..., the reason and (predictive) the trail of gate checks behind it
    last_window: dict[str, Any] | None
    reconfigs_done: int
    cache: dict[str, float | int] = field(default_factory=dict)  # CacheManager.stats()


class _CacheView(Protocol):
    def cached_blocks(self, worker_id: int) -> int: ...

    def stats(self) -> dict[str, float]: ...


def build_snapshot(
    now: float,
    scheduler: Scheduler,
    epochs: EpochManager,
    controller: Controller,
    cache: _CacheView,
    backlog: int,
    gpus_per_node: int,
) -> PoolSnapshot:
    """Assemble a :class:`PoolSnapshot` from the pool's parts (read-only)."""
    q = scheduler.queue_map(now)
    t = scheduler.table
    workers: list[WorkerSnapshot] = []
    for i, info in enumerate(t.infos):
        wid = info.worker_id
        g = epochs.group(wid)
        workers.append(
            WorkerSnapshot(
                wid, info.degree, info.node, g.global_ranks(gpus_per_node) if g is not None else (),
                WorkerState(int(t.state[i])).name, info.epoch, q[wid], len(info.tickets), info.running,
                int(t.free_blocks[i]), cache.cached_blocks(wid) if epochs.in_cache(wid) else 0,
            )
        )  # fmt: skip
    workers.sort(key=lambda w: w.worker_id)
    cur = epochs.current
    reconf = None
    if cur is not None:
        src = ",".join(str(s.worker_id) for s in cur.plan.sources)
        dst = ",".join(str(x.worker_id) for x in cur.plan.targets)
        phase = "drain" if cur.phase == Phase.DRAIN else "switch"
        reconf = f"{cur.plan.kind.name.lower()} {src} -> {dst} ({phase})"
    last: dict[str, Any] | None = None
    if controller.reports:
        r = controller.reports[-1]
        last = {
            "index": r.index, "end_s": r.end_s, "demand_s": r.demand_s, "capacity_s": r.capacity_s,
            "rho": r.rho, "requests": r.requests, "long_fraction": r.long_fraction,
            "direction": r.direction.name, "reason": r.reason, "streak": r.streak,
            "switch_s": controller.switch_estimate(),  # what a move's switch is charged now
            "trail": [_check_json(c) for c in r.trail],  # predictive: each gate check (name, passed, value, threshold)
        }  # fmt: skip
    return PoolSnapshot(
        now, epochs.epoch, format_composition(controller.lattice.composition()), workers, backlog,
        len(scheduler.tickets), reconf, last, len(epochs.records), dict(cache.stats()),
    )  # fmt: skip


def _check_json(check: Check) -> dict[str, Any]:
    """A gate check as JSON (a ratio against a zero stay objective, infinite, as null)."""
    out = asdict(check)
    out["value"] = check.value if math.isfinite(check.value) else None
    return out
