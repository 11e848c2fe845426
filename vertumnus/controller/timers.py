"""The controller's clock grid: window ends and (predictive) split checks.

Window ends fall every ``window_s`` from the start. Split checks fall every ``startup_check_interval_s`` before
the pool's first arrival and within ``startup_span_s`` of it, every ``check_interval_s`` after (each step from the
last check). Why the start-up cadence: from a start composition far below a load near capacity, the backlog built
before the first split outlasts the start-up, while later splits answer a forecast that changes over seconds.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from vertumnus.controller.rules import WindowAccount


def grid_steps(t: float, step: float, until: float) -> int:
    """How many instants t, t + step, ... lie before ``until`` (0 for t = inf)."""
    return math.ceil((until - t) / step) if t < until else 0


class ControllerTimers:
    """When the controller next has work; ``origin()`` is the pool's first arrival (None: none yet)."""

    def __init__(
        self,
        window_s: float,
        account: WindowAccount,
        origin: Callable[[], float | None],
        check_interval_s: float | None = None,
        startup_check_s: float | None = None,
        startup_span_s: float = 0.0,
    ) -> None:
        self.window_s = window_s
        self.account = account
        self.origin = origin
        self.check_interval_s = check_interval_s  # None: no split checks
        self.startup_check_s = startup_check_s
        self.startup_span_s = startup_span_s
        self.next_window_end = math.inf
        self.next_check = math.inf

    def start(self, now: float) -> None:
        """Open the first window (and schedule the first check) at ``now``."""
        self.next_window_end = now + self.window_s
        if self.check_interval_s is not None:
            self.next_check = now + self.check_step(now)

    def next(self) -> float:
        """The next instant with work (window end or split check)."""
        return min(self.next_window_end, self.next_check)

    def close_window(self) -> float:
        """The window end due now; the next one is scheduled."""
        end = self.next_window_end
        self.next_window_end = end + self.window_s
        return end

    def check_due(self, now: float) -> bool:
        """Is a split check due by ``now``? If so, the checks up to ``now`` are used up (one runs)."""
        if self.next_check > now:
            return False
        while self.next_check <= now:
            self.next_check += self.check_step(self.next_check)
        return True

    def check_step(self, t: float) -> float:
        """The split-check period at instant ``t`` (module docstring)."""
        assert self.check_interval_s is not None
        origin = self.origin()
        if self.startup_check_s is not None and (origin is None or t < origin + self.startup_span_s):
            return self.startup_check_s
        return self.check_interval_s

    def advance_idle(self, until: float) -> int:
        """Drop every window end and split check before ``until`` as the no-op it would be; returns the windows
        skipped (their indices are used up). Only for a pool known to be idle at a fixed point until then (a
        driver that can jump an idle gap, e.g. the simulator): an empty window then closes with no effect."""
        skipped = grid_steps(self.next_window_end, self.window_s, until)
        self.next_window_end += skipped * self.window_s
        self.account.index += skipped
        if self.check_interval_s is not None:
            # the walk's grid: start-up steps up to the first instant at or past the start-up span's end (within
            # the gap, if the span ends there), normal steps after it; before any arrival only start-up steps
            origin = self.origin()
            if self.startup_check_s is not None and origin is not None:
                edge = min(until, origin + self.startup_span_s)
                self.next_check += grid_steps(self.next_check, self.startup_check_s, edge) * self.startup_check_s
            step = self.check_step(self.next_check)
            self.next_check += grid_steps(self.next_check, step, until) * step
        return skipped
