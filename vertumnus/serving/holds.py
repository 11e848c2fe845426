"""Test-only hooks of the serving data plane: hold prefills on a worker until released (``serving.test_hooks``).

Why: a test that needs a queue, a prefill in progress or requests in flight at a given moment must *make* that
condition, not hope the machine is slow enough for it. With the hook a test holds some (or every) worker, sends
traffic, reads the now stable pool (``/v1/pool``: ``running`` / ``queued`` per worker), acts (reconfigures, kills
a rank, ...) and releases. Nothing here changes what the engine computes; only *when* a worker starts a prefill.

Two places to hold (:class:`HoldAt`):

- ``QUEUE``: jobs are accepted and queued, but the worker does not start a prefill at the head of its FIFO;
  steps queued in front of it (park, regroup) still run, so a drain of a held worker completes (its queued jobs
  are withdrawn and re-placed as usual). Cache ops queued behind a held prefill wait (FIFO order).
- ``START``: the worker starts the next prefill (the pool sees it *running*: ``prefill_started`` was reported)
  and then waits before sending it to the ranks; the worker's FIFO is busy meanwhile, so everything behind it
  waits too (including park and regroup). A held prefill whose worker failed meanwhile is dropped on release
  (the pool already re-placed it), so it never reaches a dead rank.

A hold names workers (by id) or every worker (``None``), including workers created later (split / merge
targets; a restarted worker keeps its id). Releasing named workers removes their own holds (not a hold of every
worker) and wakes their held prefills; releasing ``None`` removes every hold.

The other hook, ``fail_worker``, fails a worker as a dead rank would: the pool re-places its jobs and restarts it
with an empty cache — a test that needs a worker whose cache no earlier test touched gets one that way.
The HTTP endpoints (vertumnus/serving/app.py, docs/serving.md) exist only with ``serving.test_hooks: true`` and
need the admin token.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, Protocol, runtime_checkable


class HoldAt(IntEnum):
    """Where a held worker stops (see module docstring)."""

    QUEUE = 1
    START = 2


@dataclass(slots=True)
class _Waiter:
    worker_id: int
    request_id: str
    future: asyncio.Future[None]


class PrefillHolds:
    """Hold state of one data plane (all on the event loop; no locking)."""

    def __init__(self) -> None:
        self._every: HoldAt | None = None
        self._workers: dict[int, HoldAt] = {}
        self._waiters: list[_Waiter] = []
        self.on_release: Callable[[], None] | None = None  # the data plane restarts its FIFOs

    def mode(self, worker_id: int) -> HoldAt | None:
        """How ``worker_id`` is held now (None: not held)."""
        return self._workers.get(worker_id, self._every)

    def hold(self, worker_ids: Sequence[int] | None, at: HoldAt) -> None:
        """Hold ``worker_ids`` (None: every worker, present and future) at ``at``."""
        if worker_ids is None:
            self._every = at
        else:
            self._workers.update(dict.fromkeys(worker_ids, at))
        if self.on_release is not None:  # a FIFO stopped at QUEUE may run again (a START hold lets it start)
            self.on_release()

    def release(self, worker_ids: Sequence[int] | None) -> int:
        """Remove the holds of ``worker_ids`` (None: every hold) and wake their held prefills; how many woke."""
        if worker_ids is None:
            self._every = None
            self._workers.clear()
        else:
            for wid in worker_ids:
                self._workers.pop(wid, None)
        woken = [w for w in self._waiters if self.mode(w.worker_id) != HoldAt.START]
        self._waiters = [w for w in self._waiters if w not in woken]
        for w in woken:
            if not w.future.done():
                w.future.set_result(None)
        if self.on_release is not None:
            self.on_release()
        return len(woken)

    async def at_start(self, worker_id: int, request_id: str) -> None:
        """Called by a worker that just started a prefill: wait here while the worker is held at START."""
        if self.mode(worker_id) != HoldAt.START:
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(_Waiter(worker_id, request_id, fut))
        await fut

    def state(self) -> dict[str, Any]:
        """The holds and the prefills waiting at a START hold (``GET /v1/test/holds``)."""
        return {
            "every": None if self._every is None else self._every.name.lower(),
            "workers": {str(k): v.name.lower() for k, v in sorted(self._workers.items())},
            "waiting": [{"worker": w.worker_id, "request": w.request_id} for w in self._waiters],
        }


@runtime_checkable
class HookedDataPlane(Protocol):
    """A data plane with the test hooks (the torch engine on Ray)."""

    holds: PrefillHolds

    def fail_worker(self, worker_id: int, reason: str) -> None:
        """Fail a worker as a dead rank would (it restarts with an empty cache); KeyError if unknown."""
        ...
