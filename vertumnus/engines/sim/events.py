"""The simulator's event loop: a heap of ``(time, kind, seq)`` with deterministic tie-breaks.

Ordering invariant: events pop by time, then by :class:`EventKind` (engine completions before timers before
arrivals, so that an arrival at instant t sees every worker freed at t and every window that ended at t), then by
``seq`` (insertion order). Two runs that push the same events in the same order pop them in the same order; no
wall clock, no hash order and no unseeded randomness enter the loop.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from enum import IntEnum
from typing import Any


class EventKind(IntEnum):
    """Tie-break priority of events at the same instant (lower first)."""

    ENGINE = 0  # prefill start / done, park, epoch ack, cache-op completion
    TIMER = 1  # pool.on_timer (window ends, cache scans)
    ARRIVAL = 2  # a request reaches the pool


class EventLoop:
    """A virtual clock plus a priority queue of callbacks.

    ``push`` never runs the callback synchronously, so components may schedule work from inside callbacks
    without re-entering each other (the data plane never calls the pool from inside a pool call).
    """

    __slots__ = ("_heap", "_kinds", "_ran", "_seq", "now", "popped")

    def __init__(self, start: float = 0.0) -> None:
        self.now = start
        self._heap: list[tuple[float, int, int, Callable[..., None], tuple[Any, ...]]] = []
        self._seq = 0
        self.popped = 0  # events executed so far (the speed benchmark reports events/s)
        self._kinds = [0] * len(EventKind)  # queued events per kind (the runner's idle-gap check)
        self._ran = [0] * len(EventKind)  # events run per kind

    def clock(self) -> float:
        """The current virtual time (the pool's clock in the simulator)."""
        return self.now

    def push(self, time: float, kind: EventKind, fn: Callable[..., None], *args: Any) -> int:
        """Schedule ``fn(*args)`` at ``time`` (never in the past); returns the event's sequence number."""
        if time < self.now:
            raise ValueError(f"event scheduled in the past: {time} < now {self.now}")
        seq = self._seq
        self._seq += 1
        heapq.heappush(self._heap, (time, int(kind), seq, fn, args))
        self._kinds[kind] += 1
        return seq

    def __len__(self) -> int:
        return len(self._heap)

    def pending(self, kind: EventKind) -> int:
        """Events of ``kind`` queued and not yet run."""
        return self._kinds[kind]

    def ran(self, kind: EventKind) -> int:
        """Events of ``kind`` run so far."""
        return self._ran[kind]

    def peek_time(self) -> float | None:
        """Time of the next event, or None when the queue is empty."""
        return self._heap[0][0] if self._heap else None

    def step(self) -> bool:
        """Pop and run one event; False when the queue is empty."""
        if not self._heap:
            return False
        time, kind, _seq, fn, args = heapq.heappop(self._heap)
        self._kinds[kind] -= 1
        self._ran[kind] += 1
        # Invariant: virtual time never goes backwards.
        assert time >= self.now, (time, self.now)
        self.now = time
        self.popped += 1
        fn(*args)
        return True

    def run(self, until: Callable[[], bool] | None = None, max_time: float = float("inf")) -> None:
        """Run events until the queue is empty, ``until()`` is true, or the next event is after ``max_time``."""
        heap = self._heap
        while heap:
            if until is not None and until():
                return
            if heap[0][0] > max_time:
                return
            self.step()
