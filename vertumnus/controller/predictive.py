"""The predictive (model-predictive) split / merge decision: a pure function of a snapshot and the parameters.

At a window end (and at the split checks between them) the controller asks the replay model
(:mod:`vertumnus.controller.scoring`) which composition serves the *forecast* arrivals best from the pool's
*current* queues, transition included, and moves there::

    decide(snapshot, params) -> Verdict
        scores = ScoreTable(snapshot, params)        the one place that calls the replay: every candidate move
                                                     × forecast variant (span, burst, rate spread, resamples,
                                                     stress), each scored when a gate first asks for it
        for gate in span_split, burst_split, burst_merge, merge:
            outcome = gate(scores, params)           pure in the scores; ≤ 20 lines each
            the trail records every check the gate consulted (passed / refused, value against threshold)
            a gate that decides (a move, or stay) ends the decision
        otherwise: stay

The gates, in priority order (when both directions win, the split does):

    span_split   the best split cuts the span objective by ``split_margin`` and (once the pool is
                 ``resample_after_s`` old) beats staying on each of ``split_resamples`` resamples of the mix
    burst_split  the best split on the *burst* forecast (the last seconds repeated) cuts its objective by
                 ``split_margin``, loses by at most ``burst_resample_slack`` on each resample of the span's mix,
                 and by at most ``burst_full_slack`` on the span itself (a cluster the whole span calls a light
                 load is not a surge; a surge that lasts wins on the span a check or two later): optimism about
                 splitting
    burst_merge  a merge must not lose on the burst forecast either: pessimism about giving capacity away
    merge        the best merge cuts the span objective by ``merge_margin`` and still wins with the forecast
                 compressed by the stress factor (the peak window demand remembered over the span's mean, at most
                 ``merge_stress_max``)

Persistence (a merge must be wanted ``merge_persist_s`` of window ends in a row) is not part of the decision:
the controller shell applies it (:class:`~vertumnus.controller.rules.Streak`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cached_property
from typing import Protocol

from vertumnus.controller.lattice import LatticeOp
from vertumnus.controller.params import PredictiveParams
from vertumnus.controller.replay import ReplayArrivals
from vertumnus.controller.rules import WindowReport
from vertumnus.controller.scoring import Move, ReplayModel, WorkerNow
from vertumnus.types import ReconfigKind


@dataclass(slots=True, kw_only=True)
class PendingDecision:
    """A predictive decision's inputs, snapshotted on the pool's thread: plain data (and the immutable replay
    model), so the decision may be computed on any thread."""

    report: WindowReport | None  # None: a between-windows split check (splits only)
    now: float
    model: ReplayModel
    workers: list[WorkerNow]
    arrivals: ReplayArrivals  # the span forecast
    burst: ReplayArrivals | None  # the burst forecast (None: none)
    ops: dict[ReconfigKind, list[LatticeOp]]  # candidate operations by kind, smallest drain first
    shape: tuple[tuple[int, int], ...]  # the composition it was prepared on: (worker id, degree)
    inflight: tuple[int, ...] = ()  # epochs of the plans in flight when it was prepared
    merge_stress: float | None = None  # this decision's stress factor (None: merge_stress_max)
    switch_s: float  # what a move's switch costs
    age_s: float = math.inf  # seconds since the pool's first arrival


@dataclass(frozen=True, slots=True)
class Check:
    """One condition a gate consulted: ``value`` (a candidate's objective ÷ stay's, or the worst such ratio over
    the resamples seen) against ``threshold``. ``passed``: a margin is passed below its threshold, a slack or the
    stress at or below it (computed on the objectives themselves, not on the rounded ratio)."""

    name: str
    passed: bool
    value: float
    threshold: float

    def describe(self) -> str:
        return f"{self.name} {'passed' if self.passed else 'refused'} ({self.value:.4f} vs {self.threshold:.4f})"


@dataclass(frozen=True, slots=True)
class Verdict:
    """What one predictive decision found: the move to make (None: stay), the gate that decided, and every
    check consulted on the way (in order)."""

    move: Move | None
    gate: str  # span-split | burst-split | burst-merge | merge | stay | idle
    trail: tuple[Check, ...] = ()
    stay_s: float = math.nan  # stay's objective (nan: nothing was scored)
    evaluated: int = 0  # candidate moves scored

    @property
    def want(self) -> ReconfigKind | None:
        return None if self.move is None else self.move.kind

    @property
    def reason(self) -> str:
        """One line for people: the gate, the move, and the trail."""
        what = "stay" if self.move is None else self.move.describe()
        head = f"{self.gate}: {what}" + ("" if math.isnan(self.stay_s) else f" (stay {self.stay_s:.3f} s)")
        return "; ".join([head, *(c.describe() for c in self.trail)])


@dataclass(frozen=True, slots=True)
class BurstScores:
    """The burst forecast's best split: ``score`` against ``stay`` on the burst, ``span`` its span objective."""

    move: Move
    score: float
    stay: float
    span: float


class Scores(Protocol):
    """The score table the gates read (:class:`ScoreTable` computes it; a :class:`FixedScores` literal in tests).
    Objectives are expected mean TTFTs (s); resamples are (candidate, stay) score pairs, one per resample."""

    @property
    def stay(self) -> float: ...
    @property
    def best_split(self) -> Move | None: ...
    @property
    def best_merge(self) -> Move | None: ...
    @property
    def span_resamples(self) -> Iterable[tuple[float, ...]]: ...
    @property
    def burst(self) -> BurstScores | None: ...
    @property
    def burst_resamples(self) -> Iterable[tuple[float, ...]]: ...
    @property
    def burst_merge(self) -> float: ...
    @property
    def stressed(self) -> tuple[float, float]: ...


@dataclass(frozen=True, slots=True)
class FixedScores:
    """A score table written down (gate tests, examples); the moves carry their span objectives."""

    stay: float
    best_split: Move | None = None
    best_merge: Move | None = None
    span_resamples: tuple[tuple[float, ...], ...] = ()
    burst: BurstScores | None = None
    burst_resamples: tuple[tuple[float, ...], ...] = ()
    burst_merge: float = math.nan
    stressed: tuple[float, float] = (math.nan, math.nan)


class ScoreTable:
    """Every candidate move × forecast variant of one snapshot, each replayed when first asked for."""

    def __init__(self, snap: PendingDecision, p: PredictiveParams) -> None:
        self.snap, self.p, self.model = snap, p, snap.model
        moves = self.model.moves(snap.ops, p.max_concurrent_splits, p.max_concurrent_merges)
        if snap.report is None:  # a between-windows check: splits only
            moves = [m for m in moves if m.kind != ReconfigKind.MERGE]
        self.moves = moves
        self.splits = [m for m in moves if m.kind == ReconfigKind.SPLIT]
        self.merges = [m for m in moves if m.kind == ReconfigKind.MERGE]
        self.prep = self.model.prepare(snap.workers, snap.switch_s)
        self.resampling = p.split_resamples > 0 and snap.age_s >= p.resample_after_s
        self.evaluated = len(moves)

    @property
    def nothing_to_forecast(self) -> bool:
        """No arrival forecast and no request queued anywhere: every move scores alike."""
        return len(self.snap.arrivals) == 0 and not any(w.queued or w.queue_s > 0 for w in self.snap.workers)

    @cached_property
    def stay(self) -> float:
        for m in self.moves:
            m.objective = self.model.expected(m, self.prep, self.snap.arrivals, self.p.forecast_rate_spread)
        return self.moves[0].objective

    @cached_property
    def best_split(self) -> Move | None:
        self.stay  # noqa: B018 (scores every move)
        return min(self.splits, key=lambda m: m.objective) if self.splits else None

    @cached_property
    def best_merge(self) -> Move | None:
        self.stay  # noqa: B018
        return min(self.merges, key=lambda m: m.objective) if self.merges else None

    def _resamples(self, move: Move | None, slack: float | None) -> Iterable[tuple[float, ...]]:
        if move is None or not self.resampling or slack is None:
            return ()
        return self.model.resampled((move, self.moves[0]), self.prep, self.snap.arrivals, self.p.split_resamples)

    @property
    def span_resamples(self) -> Iterable[tuple[float, ...]]:
        return self._resamples(self.best_split, 0.0)

    @cached_property
    def burst(self) -> BurstScores | None:
        self.stay  # noqa: B018 (the span objectives first: the burst's move carries its own)
        b = self.snap.burst
        if b is None or not len(b) or not self.splits:
            return None
        stay_b = self.model.score(self.moves[0], self.prep, b)
        score, move = min(((self.model.score(m, self.prep, b), m) for m in self.splits), key=lambda x: x[0])
        self.evaluated += len(self.splits) + 1
        return BurstScores(move, score, stay_b, move.objective)

    @property
    def burst_resamples(self) -> Iterable[tuple[float, ...]]:
        burst = self.burst
        return self._resamples(None if burst is None else burst.move, self.p.burst_resample_slack)

    @cached_property
    def burst_merge(self) -> float:
        assert self.best_merge is not None and self.snap.burst is not None
        return self.model.score(self.best_merge, self.prep, self.snap.burst)

    @cached_property
    def stressed(self) -> tuple[float, float]:
        assert self.best_merge is not None
        stress = self.p.merge_stress_max if self.snap.merge_stress is None else self.snap.merge_stress
        arrivals = self.snap.arrivals.compressed(stress)
        merged = self.model.score(self.best_merge, self.prep, arrivals)
        return merged, self.model.score(self.moves[0], self.prep, arrivals)


@dataclass(frozen=True, slots=True)
class Outcome:
    """A gate's answer: the checks it consulted and, when ``decided``, the move (None: stay)."""

    checks: tuple[Check, ...] = ()
    decided: bool = False
    move: Move | None = None


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else math.inf


def margin_check(name: str, candidate: float, stay: float, margin: float) -> Check:
    """``candidate`` < (1 − margin) × ``stay``."""
    return Check(name, candidate < (1.0 - margin) * stay, _ratio(candidate, stay), 1.0 - margin)


def resample_check(name: str, pairs: Iterable[tuple[float, ...]], slack: float) -> Check | None:
    """The candidate scores below (1 + slack) × stay on every (candidate, stay) resample pair (it stops at the
    first that fails); None when there was none to consult. Value: the worst ratio seen."""
    worst, seen = -math.inf, False
    for move_s, stay_s in pairs:
        seen, worst = True, max(worst, _ratio(move_s, stay_s))
        if move_s >= (1.0 + slack) * stay_s:
            return Check(name, False, worst, 1.0 + slack)
    return Check(name, True, worst, 1.0 + slack) if seen else None


def _checks(*checks: Check | None) -> tuple[Check, ...]:
    return tuple(c for c in checks if c is not None)


def span_split(s: Scores, p: PredictiveParams) -> Outcome:
    """The best split on the span forecast: by ``split_margin``, and on every resample of its mix."""
    split = s.best_split
    if split is None:
        return Outcome()
    margin = margin_check("span-split margin", split.objective, s.stay, p.split_margin)
    if not margin.passed:
        return Outcome((margin,))
    held = resample_check("span-split resamples", s.span_resamples, 0.0)
    if held is not None and not held.passed:
        return Outcome(_checks(margin, held))
    return Outcome(_checks(margin, held), True, split)


def burst_split(s: Scores, p: PredictiveParams) -> Outcome:
    """The best split on the burst forecast: by ``split_margin``, within ``burst_resample_slack`` on the span's
    resamples, and within ``burst_full_slack`` of stay on the span itself (refused there: stay)."""
    b = s.burst
    if b is None:
        return Outcome()
    margin = margin_check("burst-split margin", b.score, b.stay, p.split_margin)
    if not margin.passed:
        return Outcome((margin,))
    slack = p.burst_resample_slack
    held = None if slack is None else resample_check("burst-split resamples", s.burst_resamples, slack)
    if held is not None and not held.passed:
        return Outcome(_checks(margin, held))
    if p.burst_full_slack is None:
        return Outcome(_checks(margin, held), True, b.move)
    limit = 1.0 + p.burst_full_slack
    span = Check("burst-split span", b.span <= limit * s.stay, _ratio(b.span, s.stay), limit)
    return Outcome(_checks(margin, held, span), True, b.move if span.passed else None)


def burst_merge(s: Scores, p: PredictiveParams) -> Outcome:
    """Where the burst was scored, the best merge must not lose on it (else: stay)."""
    b = s.burst
    if b is None or s.best_merge is None:
        return Outcome()
    merged = s.burst_merge
    check = Check("merge on burst", not merged > b.stay, _ratio(merged, b.stay), 1.0)
    return Outcome((check,), not check.passed, None)


def merge(s: Scores, p: PredictiveParams) -> Outcome:
    """The best merge on the span forecast: by ``merge_margin``, and not losing at the stressed rate."""
    best = s.best_merge
    if best is None:
        return Outcome()
    margin = margin_check("merge margin", best.objective, s.stay, p.merge_margin)
    if not margin.passed:
        return Outcome((margin,))
    merged, stay = s.stressed
    stress = Check("merge stress", merged <= stay, _ratio(merged, stay), 1.0)
    return Outcome((margin, stress), True, best if stress.passed else None)


Gate = Callable[[Scores, PredictiveParams], Outcome]
GATES: tuple[tuple[str, Gate], ...] = (
    ("span-split", span_split),
    ("burst-split", burst_split),
    ("burst-merge", burst_merge),
    ("merge", merge),
)


def apply_gates(s: Scores, p: PredictiveParams) -> Verdict:
    """Run :data:`GATES` in order on a score table; the first that decides gives the verdict (else: stay)."""
    trail: list[Check] = []
    for name, gate in GATES:
        out = gate(s, p)
        trail.extend(out.checks)
        if out.decided:
            return Verdict(out.move, name, tuple(trail), s.stay)
    return Verdict(None, "stay", tuple(trail), s.stay)


def decide(snap: PendingDecision, p: PredictiveParams) -> Verdict:
    """The predictive decision on a snapshot (module docstring): pure in its inputs."""
    table = ScoreTable(snap, p)
    if table.nothing_to_forecast:
        return Verdict(None, "idle", evaluated=len(table.moves))
    verdict = apply_gates(table, p)
    return Verdict(verdict.move, verdict.gate, verdict.trail, verdict.stay_s, table.evaluated)
