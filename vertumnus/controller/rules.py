"""Window accounting and the split / merge rules (DESIGN.md §2).

Per window H_k the pool reports each request's first placement: D_k = Σ Ê_{i,w_i}, the request count and
the count of long requests (L > long_threshold_tokens). At the window end, with K = Σ_w κ_{C_w}:

    ρ_k > θ_up                                   → SPLIT   (capacity signal)
    ρ_k < θ_low                                  → MERGE   (capacity signal)
    θ_low ≤ ρ_k ≤ θ_up and |f_k − f_ref| > Δ_long → MERGE if f_k > f_ref else SPLIT   (long-share signal)

The capacity signal is evaluated first, so it wins whenever the two conflict. The long-share reference f_ref
is the share at the last reconfiguration (initially the history's share, else the first non-empty window's).
Persistence: a direction acts only after ``persist_windows`` consecutive windows wanting it *and* having an
admissible operation; any other window resets the streak, and so does acting (:class:`Streak`; the predictive
policy's merges persist the same way). Windows that end while an
operation is in flight do not count (their demand was measured on a composition in transition).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vertumnus.controller.predictive import Check
from enum import IntEnum


class Direction(IntEnum):
    NONE = 0
    SPLIT = 1
    MERGE = 2


@dataclass(slots=True)
class WindowReport:
    """What one window end measured and decided (kept for snapshots, tests and reports)."""

    index: int
    end_s: float
    demand_s: float
    capacity_s: float
    rho: float
    requests: int
    long_fraction: float | None
    signal: Direction  # raw rule output before admission
    reason: str
    direction: Direction = Direction.NONE  # after admission (an operation exists)
    streak: int = 0
    acted: bool = False
    trail: tuple[Check, ...] = ()  # predictive: every gate check of the decision taken here


@dataclass(slots=True)
class Streak:
    """Consecutive window ends that wanted one direction (any other direction, or none, starts over)."""

    direction: Direction = Direction.NONE
    count: int = 0

    def update(self, direction: Direction) -> int:
        """Count one more window end wanting ``direction``; returns the streak's length (0 for NONE)."""
        if direction == Direction.NONE:
            self.direction, self.count = Direction.NONE, 0
        elif direction == self.direction:
            self.count += 1
        else:
            self.direction, self.count = direction, 1
        return self.count

    def reset(self) -> None:
        self.direction, self.count = Direction.NONE, 0


def signal(
    rho: float, long_fraction: float | None, ref_long: float | None, theta_low: float, theta_up: float, delta: float
) -> tuple[Direction, str]:
    """The rule of the module docstring (before persistence and merge admission)."""
    if rho > theta_up:
        return Direction.SPLIT, f"rho {rho:.3f} > theta_up {theta_up}"
    if rho < theta_low:
        return Direction.MERGE, f"rho {rho:.3f} < theta_low {theta_low}"
    if long_fraction is not None and ref_long is not None and abs(long_fraction - ref_long) > delta:
        if long_fraction > ref_long:
            return Direction.MERGE, f"long share {long_fraction:.3f} rose from {ref_long:.3f}"
        return Direction.SPLIT, f"long share {long_fraction:.3f} fell from {ref_long:.3f}"
    return Direction.NONE, "within band"


class WindowAccount:
    """Running sums of the current window plus the persistence streak."""

    __slots__ = ("demand_s", "index", "long", "ref_long", "requests", "run")

    def __init__(self, ref_long: float | None = None) -> None:
        self.index = 0
        self.demand_s = 0.0
        self.requests = 0
        self.long = 0
        self.ref_long = ref_long
        self.run = Streak()

    @property
    def streak(self) -> int:
        return self.run.count

    @property
    def streak_dir(self) -> Direction:
        return self.run.direction

    def observe(self, predicted_s: float, is_long: bool) -> None:
        """Count one request's first placement in the current window."""
        self.demand_s += predicted_s
        self.requests += 1
        self.long += is_long

    def close(self, end_s: float, capacity_s: float, theta_low: float, theta_up: float, delta: float) -> WindowReport:
        """End the window: compute ρ and the raw signal, reset the sums (streak is updated by :meth:`persist`)."""
        frac = self.long / self.requests if self.requests else None
        if self.ref_long is None and frac is not None:
            self.ref_long = frac
        rho = self.demand_s / capacity_s if capacity_s > 0 else float("inf")
        sig, reason = signal(rho, frac, self.ref_long, theta_low, theta_up, delta)
        report = WindowReport(self.index, end_s, self.demand_s, capacity_s, rho, self.requests, frac, sig, reason)
        self.index += 1
        self.demand_s = 0.0
        self.requests = 0
        self.long = 0
        return report

    def persist(self, report: WindowReport, direction: Direction, persist_windows: int) -> bool:
        """Update the streak with the admitted direction; True when it has held long enough to act."""
        report.direction = direction
        report.streak = self.run.update(direction)
        return direction != Direction.NONE and report.streak >= persist_windows

    def check_report(self, now: float, reason: str) -> WindowReport:
        """A report for a between-windows split check that acts (the window's sums are left open)."""
        frac = self.long / self.requests if self.requests else None
        r = WindowReport(self.index, now, self.demand_s, float("nan"), float("nan"), self.requests, frac,
                         Direction.SPLIT, "check: " + reason)  # fmt: skip
        r.direction, r.streak = Direction.SPLIT, 1
        return r

    def acted(self, report: WindowReport) -> None:
        """An operation started: reset the streak and move the long-share reference to this window's."""
        report.acted = True
        self.run.reset()
        if report.long_fraction is not None:
            self.ref_long = report.long_fraction

    def busy(self) -> None:
        """A window ended during an operation: it does not count towards persistence."""
        self.run.reset()
