"""Cache operations of the Ray-hosted torch engine, run for :class:`~vertumnus.serving.ray_data_plane.RayDataPlane`;
also its per-worker step FIFO types.

- replicate / reconcile into a destination worker: *export* from the source's ranks — read-only and rank-local,
  so it is sent straight to the source ranks, never through the source's FIFO (a worker waiting for a copy can
  therefore never deadlock on another worker's queue) — then *import* on the destination's ranks through the
  destination's FIFO (it changes the replicated block index, so every rank must see it in the same order).
  Each destination rank receives the blocks it owns canonically: block at depth d goes to rank d mod C;
- reclaim: RemoveBlocks through the destination's FIFO.
Confirmation is the engine's own cache report carrying the op id (first rank), or ``cache_op_failed`` — also
when the op's step raises (the op fails visibly; nobody waits for a confirmation that cannot come).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from vertumnus.engines.torch.messages import Command, ExportBlocks, Exported, ImportBlocks, OpDone, RemoveBlocks, Reply
from vertumnus.interfaces import EngineEvents, PrefillJob
from vertumnus.types import CacheOp, CacheOpKind, WorkerGroup

log = logging.getLogger("vertumnus.serving")


@dataclass(slots=True)
class StepItem:
    run: Callable[[], Awaitable[None]]
    job: PrefillJob | None = None  # set for prefills (withdrawable)


@dataclass(slots=True)
class WorkerLane:
    group: WorkerGroup
    ranks: tuple[int, ...]  # global ranks
    queue: deque[StepItem] = field(default_factory=deque)
    busy: bool = False
    parking: bool = False
    failed: bool = False


class WorkerFailed(Exception):
    """A step could not complete on every rank of the worker."""


class _Host(Protocol):
    """What the cache ops need from the data plane (its worker table, FIFOs and step functions)."""

    workers: dict[int, WorkerLane]

    @property
    def events(self) -> EngineEvents: ...

    def spawn_task(self, coro: Awaitable[Any], what: str) -> None: ...

    def enqueue(self, w: WorkerLane, item: StepItem, front: bool = False) -> None: ...

    async def step_ranks(
        self, ranks: Sequence[int], cmds: Callable[[int], Command]
    ) -> list[tuple[list[Reply], Any]]: ...

    async def worker_step(self, w: WorkerLane, cmds: Callable[[int], Command]) -> list[tuple[list[Reply], Any]]: ...


class CacheOps:
    """Runs cache ops on behalf of a data plane (see module docstring)."""

    def __init__(self, host: _Host) -> None:
        self.host = host

    def execute(self, op: CacheOp) -> None:
        """Queue a replicate / reconcile / reclaim at its destination (failed at once if it is gone)."""
        dst = self.host.workers.get(op.dst_worker)
        if dst is None or dst.failed:
            self.host.spawn_task(self._op_failed(op.op_id, "destination worker is gone"), "cache op")
            return
        if op.kind == CacheOpKind.RECLAIM:
            self.host.enqueue(dst, StepItem(lambda: self._guarded(op, self._remove(dst, op))))
        else:
            self.host.enqueue(dst, StepItem(lambda: self._guarded(op, self.copy(op, dst))))

    async def _guarded(self, op: CacheOp, step: Coroutine[Any, Any, None]) -> None:
        """Run one op's step; an unexpected exception fails the op (a dead worker is reported as such)."""
        try:
            await step
        except WorkerFailed:
            raise
        except Exception as e:
            log.exception("torch data plane: cache op %d failed", op.op_id)
            self.host.events.cache_op_failed(op.op_id, f"{type(e).__name__}: {e}")

    async def _op_failed(self, op_id: int, reason: str) -> None:
        self.host.events.cache_op_failed(op_id, reason)

    async def _remove(self, w: WorkerLane, op: CacheOp) -> None:
        keys = tuple(op.keys[op.first_missing :])
        out = await self.host.worker_step(w, lambda r: RemoveBlocks(op.op_id, w.group.worker_id, keys))
        self._op_replies(op, out)

    async def copy(self, op: CacheOp, dst: WorkerLane) -> None:
        """Replicate / reconcile into ``dst`` (holding its turn): export from the source's ranks, import."""
        src = self.host.workers.get(op.src_worker) if op.src_worker is not None else None
        if src is None or src.failed:
            self.host.events.cache_op_failed(op.op_id, "no valid copy to copy from")
            return
        path = tuple(op.keys)
        wanted = path[op.first_missing :]
        try:
            out = await self.host.step_ranks(src.ranks, lambda r: ExportBlocks(op.op_id, src.group.worker_id, wanted))
        except WorkerFailed as e:
            self.host.events.cache_op_failed(op.op_id, f"export failed: {e}")
            return
        blocks: dict[int, Any] = {}
        for replies, _ in out:
            for rep in replies:
                if isinstance(rep, Exported) and rep.blocks is not None:
                    blocks.update(zip(rep.keys, rep.blocks, strict=True))
        available = tuple(k for k in wanted if k in blocks)
        c = dst.group.degree

        def cmd(r: int) -> ImportBlocks:
            mine = tuple(
                path[i] for i in range(op.first_missing, len(path)) if i % c == r - dst.ranks[0] and path[i] in blocks
            )  # canonical owner: depth mod C
            stacked = _stack([blocks[k] for k in mine]) if mine else None
            return ImportBlocks(op.op_id, dst.group.worker_id, path, op.first_missing, available, mine, stacked)

        self._op_replies(op, await self.host.worker_step(dst, cmd))

    def _op_replies(self, op: CacheOp, out: list[tuple[list[Reply], Any]]) -> None:
        errors = [rep.error for replies, _ in out for rep in replies if isinstance(rep, OpDone) and rep.error]
        for replies, _ in out:
            for rep in replies:
                if isinstance(rep, OpDone):
                    for rp in rep.reports:
                        self.host.events.cache_report(rp)
        if errors:
            self.host.events.cache_op_failed(op.op_id, errors[0])


def _stack(tensors: list[Any]) -> Any:
    import torch

    return torch.stack(tensors)
