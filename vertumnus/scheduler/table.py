"""Per-worker scheduling state as numpy columns, maintained incrementally.

Invariants (checked by tests, kept by every mutator here):

- rows are ordered by (degree, worker_id), so ``np.argmin`` over a cost column breaks ties towards the lower
  degree, then the lower worker id (the scheduler puts the shorter queue before the id: see ``_choose_fast``);
  rows are rebuilt only when a worker joins or leaves;
- ``reserved_s[w]`` = Σ Ê of the tickets (queued + running requests) at w; ``free_blocks[w]`` =
  capacity − Σ KV blocks charged to those tickets (each: the prompt's blocks w did not hold at placement — a
  held prefix is resident already); ``outstanding[w]`` = Σ uncached blocks of those tickets;
- at most one running ticket per worker: ``run_start[w]`` / ``run_est[w]`` (0 when idle), so
  ``q_w(now) = reserved_s − min(now − run_start, run_est)`` is O(1) per worker and never rescans a queue;
  ``busy`` = rows with a running ticket: every other row has run_start = run_est = 0, so q_w = reserved_s;
- a worker with no tickets has ``reserved_s == 0.0`` exactly (reset, so float drift cannot accumulate).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from vertumnus.types import Placement, Request, WorkerState


@dataclass(slots=True)
class Ticket:
    """A placed request: where it is, what it reserved, whether it runs."""

    request: Request
    placement: Placement
    blocks: int  # KV blocks charged at the worker: the prompt's blocks it did not hold (allocated for it)
    uncached_blocks: int  # blocks the worker must compute (outstanding_blocks contribution)
    first_placement: bool = True
    running: bool = False
    started_s: float = 0.0

    @property
    def worker_id(self) -> int:
        return self.placement.worker_id


@dataclass(slots=True)
class WorkerInfo:
    """Identity of one row plus its FCFS ticket order (insertion order of a dict)."""

    worker_id: int
    degree: int
    node: int
    capacity_blocks: int
    epoch: int
    tickets: dict[str, Ticket] = field(default_factory=dict)
    running: str | None = None


class WorkerTable:
    """Columns: state, degree, reserved_s, run_start, run_est, free_blocks, outstanding (see module doc)."""

    __slots__ = (
        "_est",
        "_free",
        "_outstanding",
        "_reserved",
        "_start",
        "active",
        "busy",
        "degree",
        "free_blocks",
        "index",
        "infos",
        "outstanding",
        "reserved_s",
        "run_est",
        "run_start",
        "state",
    )

    def __init__(self) -> None:
        self.infos: list[WorkerInfo] = []
        self.index: dict[int, int] = {}
        self.state = np.zeros(0, dtype=np.int8)
        self.active = np.zeros(0, dtype=bool)
        self.degree = np.zeros(0, dtype=np.int64)
        self.reserved_s = np.zeros(0, dtype=np.float64)
        self.run_start = np.zeros(0, dtype=np.float64)
        self.run_est = np.zeros(0, dtype=np.float64)
        self.free_blocks = np.zeros(0, dtype=np.int64)
        self.outstanding = np.zeros(0, dtype=np.int64)
        self.busy: set[int] = set()
        self._views()

    # -- membership ---------------------------------------------------------------------------------------
    def add(self, info: WorkerInfo, state: WorkerState) -> None:
        """Add a worker row (no tickets yet)."""
        if info.worker_id in self.index:
            raise ValueError(f"worker {info.worker_id} already registered")
        rows = self._columns()
        rows.append((int(state), info.degree, 0.0, 0.0, 0.0, info.capacity_blocks, 0))
        self._rebuild([*self.infos, info], rows)

    def remove(self, worker_id: int) -> WorkerInfo:
        """Remove a worker row; returns its info (tickets still attached are the caller's to handle)."""
        i = self.index[worker_id]
        rows = self._columns()
        del rows[i]
        infos = self.infos[:i] + self.infos[i + 1 :]
        info = self.infos[i]
        self._rebuild(infos, rows)
        return info

    def _columns(self) -> list[tuple[int, int, float, float, float, int, int]]:
        return [
            (int(s), int(d), float(r), float(a), float(e), int(f), int(o))
            for s, d, r, a, e, f, o in zip(
                self.state,
                self.degree,
                self.reserved_s,
                self.run_start,
                self.run_est,
                self.free_blocks,
                self.outstanding,
                strict=True,
            )
        ]

    def _rebuild(self, infos: list[WorkerInfo], rows: list[tuple[int, int, float, float, float, int, int]]) -> None:
        order = sorted(range(len(infos)), key=lambda k: (infos[k].degree, infos[k].worker_id))
        self.infos = [infos[k] for k in order]
        self.index = {inf.worker_id: i for i, inf in enumerate(self.infos)}
        cols = list(zip(*(rows[k] for k in order), strict=True)) if order else [()] * 7
        self.state = np.array(cols[0], dtype=np.int8)
        self.degree = np.array(cols[1], dtype=np.int64)
        self.reserved_s = np.array(cols[2], dtype=np.float64)
        self.run_start = np.array(cols[3], dtype=np.float64)
        self.run_est = np.array(cols[4], dtype=np.float64)
        self.free_blocks = np.array(cols[5], dtype=np.int64)
        self.outstanding = np.array(cols[6], dtype=np.int64)
        self.active = self.state == int(WorkerState.ACTIVE)
        self.busy = {i for i, inf in enumerate(self.infos) if inf.running is not None}
        self._views()

    def _views(self) -> None:
        # Scalar updates of one row go through memoryviews of the columns (Python floats / ints in and out,
        # same IEEE arithmetic): a numpy element read-modify-write costs about three times as much.
        self._reserved: Any = self.reserved_s.data
        self._free: Any = self.free_blocks.data
        self._outstanding: Any = self.outstanding.data
        self._start: Any = self.run_start.data
        self._est: Any = self.run_est.data

    def set_state(self, worker_id: int, state: WorkerState) -> None:
        i = self.index[worker_id]
        self.state[i] = int(state)
        self.active[i] = state == WorkerState.ACTIVE

    # -- aggregates -----------------------------------------------------------------------------------------
    def reserve(self, ticket: Ticket) -> None:
        """Attach a ticket to its worker and add its Ê, KV blocks and uncached blocks to the aggregates."""
        i = self.index[ticket.worker_id]
        self.infos[i].tickets[ticket.request.request_id] = ticket
        self._reserved[i] += ticket.placement.predicted_s
        self._free[i] -= ticket.blocks
        self._outstanding[i] += ticket.uncached_blocks

    def start(self, ticket: Ticket, now: float) -> None:
        """Mark the ticket running (one running ticket per worker; a newer start replaces an older one)."""
        ticket.running = True
        ticket.started_s = now
        i = self.index.get(ticket.worker_id)
        if i is None:
            return
        self.infos[i].running = ticket.request.request_id
        self._start[i] = now
        self._est[i] = ticket.placement.predicted_s
        self.busy.add(i)

    def release(self, ticket: Ticket) -> None:
        """Detach a ticket (done, withdrawn, or its worker failed) and undo its contribution."""
        i = self.index.get(ticket.worker_id)
        if i is None:  # its worker was retired meanwhile (late completion after a switch): nothing to undo
            return
        info = self.infos[i]
        if info.tickets.pop(ticket.request.request_id, None) is None:
            return
        if info.running == ticket.request.request_id:
            info.running = None
            self._start[i] = 0.0
            self._est[i] = 0.0
            self.busy.discard(i)
        if info.tickets:
            self._reserved[i] -= ticket.placement.predicted_s
            self._free[i] += ticket.blocks
            self._outstanding[i] -= ticket.uncached_blocks
        else:  # exact reset: no drift on an idle worker
            self._reserved[i] = 0.0
            self._free[i] = info.capacity_blocks
            self._outstanding[i] = 0

    def queue_vector(self, now: float) -> np.ndarray:
        """q_w(now) for every row (seconds), as a new array (callers may modify it)."""
        if not self.busy:  # nothing running: min(max(now − 0, 0), 0) = 0 everywhere
            return self.reserved_s.copy()
        elapsed = np.minimum(np.maximum(now - self.run_start, 0.0), self.run_est)
        return self.reserved_s - elapsed

    def queue_s(self, worker_id: int, now: float) -> float:
        """q_w(now) of one worker."""
        i = self.index[worker_id]
        elapsed = min(max(now - self._start[i], 0.0), self._est[i])
        return float(self._reserved[i] - elapsed)

    def info(self, worker_id: int) -> WorkerInfo:
        return self.infos[self.index[worker_id]]

    def state_of(self, worker_id: int) -> WorkerState:
        return WorkerState(int(self.state[self.index[worker_id]]))
