"""The predictive (model-predictive) split / merge decision (``controller.policy: predictive``).

At a window end, instead of comparing ρ = D/K with thresholds, the controller asks the replay model
(:mod:`vertumnus.controller.replay`) which composition serves the *recent* arrivals best from the pool's
*current* queues, transition included, and moves there:

    forecast  the arrivals of the last ``lookback_windows`` windows, each with the prefix it found, re-based
              so the replay starts at the decision instant; a quiet pool replays the mix of the last
              ``min_forecast_requests`` arrivals at the span's (low) rate (:meth:`ArrivalLog.forecast`)
    state     every ACTIVE worker's q_w (its queue runs dry at q_w), its running prefill's remaining time and
              its queued requests
    moves     stay; per (kind, source degree) the best 1..``max_concurrent_ops`` disjoint splits or
              1..``max_concurrent_merges`` disjoint merges (smallest drain first, as the rule controller orders
              them)
    a move    sources leave now; their queued requests are re-placed at instant 0 (as the drain step does);
              targets start after the sources' running prefills finish + the switch time
    objective mean predicted TTFT of the forecast arrivals and of every queued request (from now on), averaged
              over the forecast at (1 − u)×, 1× and (1 + u)× its rate (u = ``forecast_rate_spread``: the
              forecast is one noisy sample, and TTFT is convex in the load)

Asymmetric caution: a split is taken when it cuts the objective by ``split_margin`` for
``split_persist_windows`` windows (default 1: react at once), or when it cuts the objective of the *burst*
forecast (the last ``burst_lookback_s`` of arrivals repeated) by ``burst_split_margin`` (its own knob: a
forecast of a few requests is noisy and at a steady load "wins" a few percent by chance; the tuning set still
kept it at ``split_margin``, see the config) *and* predicts at most ``burst_split_full_slack`` worse than stay on
the full forecast (the last seconds' cluster must not be one the whole span calls a light load; a surge that lasts
wins on the span too a check or two later); a merge needs ``merge_margin``, must also win
with the forecast compressed ``merge_stress`` × (it must not give capacity away that a modest rise in load
would need back; with ``merge_stress_windows`` > 0 the factor is the peak window demand of that many windows
over the forecast span's mean, at most ``merge_stress``: the swings the pool has actually seen, see
:func:`observed_stress`), and must be wanted for ``merge_persist_windows`` windows. When both directions win, the
split does. Several splits at once are a single candidate, so a burst far above capacity is answered by one
decision that starts them together on different blocks (the epoch protocol runs them concurrently). Merges
go one at a time by default (``max_concurrent_merges`` 1): capacity is given away a step per decision, each
answering to the load that follows the last, so a forecast that is a few percent off at a steady load moves
the pool by one block instead of several that the next burst must split back.

Capacity of a composition is therefore not Σ κ of isolated workers: the replay pools the workers behind the
cache-aware rule, queues included, which is what over- and under-load actually look like to requests.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from vertumnus.controller.epochs import EpochManager, Phase
from vertumnus.controller.lattice import Lattice, LatticeOp
from vertumnus.controller.replay import ReplayArrivals, ReplayWorkers, replay_mean_ttft
from vertumnus.cost_model import CostModel
from vertumnus.scheduler.scheduler import Scheduler
from vertumnus.types import ReconfigKind, WorkerState

MAX_TILES = 20  # a log younger than span / 20 is tiled only 20 times (the replay's cost stays bounded)


@dataclass(slots=True)
class ArrivalLog:
    """First placements of recent requests: arrival instant, input length, prefix found (tokens)."""

    keep_s: float
    keep_n: int
    entries: deque[tuple[float, int, int]] = field(default_factory=deque)
    origin: float | None = None  # the earliest arrival ever logged: nothing is known before it

    def add(self, t: float, input_len: int, cached: int) -> None:
        self.origin = t if self.origin is None else min(self.origin, t)
        self.entries.append((t, input_len, cached))
        # Entries older than keep_s go, except the keep_n most recent (a quiet pool still has a forecast).
        while len(self.entries) > self.keep_n and self.entries[0][0] < t - self.keep_s:
            self.entries.popleft()

    def too_young(self, now: float, span_s: float, min_n: int) -> bool:
        """Fewer than ``min_n`` arrivals logged, the first of them less than ``span_s`` ago (or none yet): the
        forecast would tile a handful of arrivals over the span."""
        if self.origin is not None and self.origin <= now - span_s:
            return False
        return len(self.entries) < min_n

    def forecast(self, now: float, span_s: float, min_n: int) -> list[tuple[float, int, int]]:
        """The arrivals to replay, as (offset from the decision instant, input length, prefix tokens).

        Busy pool (≥ ``min_n`` arrivals in the last ``span_s``): those arrivals at their own offsets within the
        span, burstiness included. A log younger than the span (the pool just started) holds only the last
        ``now − origin`` seconds; those are repeated back to back to fill the span, so the forecast has the
        observed rate over the whole span instead of an empty head that the queues would drain in::

            span       |<-------------------- span_s -------------------->|
            observed                                      |<-- now−origin -->|
            forecast   |  A B C  |  A B C  |  A B C  |  A B C  |  A B C  |   (not: |      empty      |  A B C  |)

        Quiet pool: the request *mix* of the ``min_n`` most recent arrivals at the
        *rate* of the span (evenly spaced, one per ``span_s / n`` seconds; one per span when none arrived), so
        that a quiet spell is forecast as quiet, not as the burst that preceded it. A young log with fewer than
        ``min_n`` arrivals (n ≥ 2) is forecast at the rate it has seen, (n − 1) per ``now − origin`` seconds,
        with its mix repeated over the span.
        """
        ordered = sorted(self.entries)  # re-placed backlog can be logged after later arrivals
        start = now - span_s
        in_span = [e for e in ordered if e[0] >= start]
        seen = now - max(start, self.origin if self.origin is not None else start)
        if len(in_span) >= min_n:
            if seen >= span_s or seen <= 0:
                return [(t - start, n, p) for t, n, p in in_span]
            base = now - seen
            reps = min(math.ceil(span_s / seen), MAX_TILES)
            tiled = [(t - base + k * seen, n, p) for k in range(reps) for t, n, p in in_span]
            return [e for e in tiled if e[0] < span_s] if reps * seen > span_s else tiled
        mix = ordered[-min_n:]
        if 0 < seen < span_s and len(in_span) >= 2:
            # A young log with fewer than min_n arrivals: the rate it has seen (the first arrival marks the
            # origin, so n − 1 arrivals fell in ``seen``), the mix repeated over the span — not n arrivals
            # spread over a span the pool has not lived yet, which forecasts a busy start-up as quiet.
            gap = seen / (len(in_span) - 1)
            count = max(len(mix), min(math.ceil(span_s / gap), MAX_TILES * len(mix)))
            return [(k * gap, *mix[k % len(mix)][1:]) for k in range(count)]
        gap = span_s / max(len(in_span), 1)
        return [(k * gap, n, p) for k, (_, n, p) in enumerate(mix)]

    def burst(self, now: float, recent_s: float, span_s: float) -> list[tuple[float, int, int]]:
        """The arrivals of only the last ``recent_s`` seconds, repeated back to back over ``span_s``: the
        forecast if the current rate lasts (empty when nothing arrived that recently)."""
        start = now - recent_s
        recent = sorted(e for e in self.entries if e[0] >= start)
        reps = max(1, round(span_s / recent_s))
        return [(t - start + k * recent_s, n, p) for k in range(reps) for t, n, p in recent]


@dataclass(slots=True)
class WorkerNow:
    """One ACTIVE worker at the decision instant."""

    worker_id: int
    degree: int
    queue_s: float  # q_w(now)
    running_left_s: float  # remaining predicted time of its running prefill (0 when idle)
    queued: list[tuple[int, int]]  # (input length, prefix tokens) of its queued requests, FCFS


@dataclass(slots=True)
class Move:
    """A candidate: 0 (stay), 1 or several operations of one kind on disjoint workers."""

    ops: tuple[LatticeOp, ...]
    objective: float = 0.0
    stressed: float | None = None

    @property
    def kind(self) -> ReconfigKind | None:
        return self.ops[0].kind if self.ops else None

    def describe(self) -> str:
        if not self.ops:
            return "stay"
        parts = [f"{o.kind.name.lower()} {'+'.join(str(s.worker_id) for s in o.sources)}" for o in self.ops]
        return ", ".join(parts)


@dataclass(slots=True)
class _Prepared:
    workers: dict[int, WorkerNow]
    known: dict[int, list[float]]  # completion offsets of each worker's queued requests where they are
    est: dict[int, dict[int, np.ndarray]]  # worker -> degree -> Ê of its queued requests (re-placement)
    switch_s: float  # what a move's switch costs in this decision (see observed_switch)


@dataclass(slots=True)
class Decision:
    """What one predictive window end found."""

    stay: Move
    best_split: Move | None
    best_merge: Move | None
    want: ReconfigKind | None
    reason: str
    evaluated: int
    patient: bool = False  # a merge won by less than merge_margin: acted on after merge_patient_windows windows


def observed_stress(demands: Sequence[float], recent_windows: int, cap: float) -> float:
    """The merge stress factor sized by the load swings seen: the largest window demand of ``demands`` (the
    last windows, oldest first) over the mean demand of the ``recent_windows`` most recent ones, clamped to
    [1, ``cap``] (``cap`` when nothing was demanded lately).

    A merge must not lose if the load rises again to the peak of the remembered windows: at a steady load that
    is the window-to-window noise (~1.2-1.5× on the traces), after a burst it is the burst (up to ``cap``)."""
    if not demands:
        return cap
    recent = list(demands)[-max(1, recent_windows) :]
    mean = sum(recent) / len(recent)
    if mean <= 0:
        return cap
    return min(cap, max(1.0, max(demands) / mean))


def observed_switch(switches: Sequence[float], prior: float) -> float:
    """What a move's switch costs: the mean of ``switches`` (the last committed reconfigurations' switch
    stages, activate → every target rank acked, as the epoch protocol measured them), ``prior`` (the configured
    ``switch_s``) before any was observed.

    Why: the switch is a property of the engine and the hardware, not of the policy. The simulator's is the
    configured one (so there the two agree); the torch engine's is milliseconds (README, *Performance*) and a
    vLLM engine's may be longer than configured. A replay that charged the configured 0.8 s for a 3-ms switch
    would refuse moves that pay, one that charged less than the engine takes would make moves that do not."""
    if not switches:
        return prior
    return sum(switches) / len(switches)


def worker_states(scheduler: Scheduler, lattice: Lattice, now: float) -> list[WorkerNow]:
    """Every ACTIVE worker of the current composition with its queue (from the scheduler's tickets)."""
    out: list[WorkerNow] = []
    for wid in sorted(lattice.groups):
        if wid not in scheduler.table.index or scheduler.state(wid) != WorkerState.ACTIVE:
            continue
        running_left = 0.0
        queued: list[tuple[int, int]] = []
        for t in scheduler.tickets_at(wid):
            if t.running:
                running_left = max(running_left, t.started_s + t.placement.predicted_s - now)
            else:
                queued.append((t.request.input_len, t.placement.cached_tokens))
        out.append(WorkerNow(wid, lattice.groups[wid].degree, scheduler.queue_s(wid, now), running_left, queued))
    return out


def running_left(scheduler: Scheduler, worker_id: int, now: float) -> float:
    """Remaining predicted time of the worker's running prefill (0 when idle)."""
    left = 0.0
    for t in scheduler.tickets_at(worker_id):
        if t.running:
            left = max(left, t.started_s + t.placement.predicted_s - now)
    return left


def incoming_workers(epochs: EpochManager, switch_s: float, now: float) -> list[WorkerNow]:
    """The targets of the plans in flight, as idle workers that become free when their plan is predicted to
    commit: a draining plan once its sources' running prefills end + the switch, a switching one at the end of
    its switch. A decision taken while operations run must count the capacity already on its way, or it would
    split again for the load that the running splits answer."""
    out: list[WorkerNow] = []
    for r in epochs.inflight:
        if r.phase == Phase.DRAIN:
            ready = max(running_left(epochs.scheduler, s.worker_id, now) for s in r.plan.sources) + switch_s
        else:
            ready = max(0.0, r.switch_start_s + switch_s - now)
        out.extend(WorkerNow(t.worker_id, t.degree, ready, ready, []) for t in r.plan.targets)
    return out


class PredictiveModel:
    """Builds candidate moves and scores them with the replay; the :class:`Controller` acts on its decision."""

    def __init__(
        self,
        cost: CostModel,
        degrees: Sequence[int],
        beta: float,
        lam: float,
        switch_s: float,
        max_ops: int,
        split_margin: float,
        merge_margin: float,
        merge_stress: float,
        burst_split_margin: float | None = None,
        max_merges: int | None = None,
        burst_full_slack: float | None = None,
        rate_spread: float = 0.0,
        split_resamples: int = 0,
        resample_after_s: float = 0.0,
        burst_resample_slack: float | None = None,
        patient_margin: float | None = None,
    ) -> None:
        """``burst_full_slack``: a split won on the burst forecast must also predict at most (1 + this) × stay's
        objective on the full forecast (None: the burst alone decides). ``rate_spread`` u: a move's objective is
        its mean over the forecast at (1 − u)×, 1× and (1 + u)× its rate (0: the forecast alone).
        ``split_resamples`` B, ``resample_after_s``: once the pool is that old, a split won on the span forecast
        must also beat staying on each of B resamples of the forecast's request mix (0: off; :meth:`split_holds`).
        ``burst_resample_slack`` s: from then on a split won on the burst forecast must also predict less than
        (1 + s) × stay on each of those resamples (None: off). ``patient_margin``: a merge that cuts the objective
        by less than ``merge_margin`` but by more than this is still wanted, as a *patient* merge (the controller
        acts on it only after ``merge_patient_windows`` windows; None: off)."""
        self.cost = cost
        self.degrees = tuple(sorted(degrees))
        self.beta = beta
        self.lam = lam
        self.switch_s = switch_s
        self.max_ops = max_ops
        self.max_merges = max_ops if max_merges is None else max_merges
        self.split_margin = split_margin
        # A split on the burst forecast (a couple of seconds of arrivals repeated) answers to its own margin:
        # that forecast holds few requests, so at a steady load its Poisson noise alone can "win" a few percent.
        self.burst_split_margin = split_margin if burst_split_margin is None else burst_split_margin
        self.merge_margin = merge_margin
        self.burst_full_slack = burst_full_slack
        self.merge_stress = merge_stress
        self.rate_spread = rate_spread
        self.split_resamples = split_resamples
        self.resample_after_s = resample_after_s
        self.burst_resample_slack = burst_resample_slack
        self.patient_margin = patient_margin

    def _est(self, lengths: np.ndarray, prefixes: np.ndarray) -> dict[int, np.ndarray]:
        p = np.minimum(prefixes, np.maximum(lengths - 1, 0)).astype(np.float64)
        r = lengths.astype(np.float64) - p
        return {c: self.cost.predict_degree(c, r, p) for c in self.degrees}

    def arrivals(self, picked: Sequence[tuple[float, int, int]]) -> ReplayArrivals:
        """The forecast (offsets from the decision instant) with Ê per degree."""
        t = np.array([e[0] for e in picked], dtype=np.float64)
        lengths = np.array([e[1] for e in picked], dtype=np.int64)
        prefixes = np.array([e[2] for e in picked], dtype=np.int64)
        return ReplayArrivals(t, self._est(lengths, prefixes))

    def moves(self, ops_by_kind: dict[ReconfigKind, list[LatticeOp]]) -> list[Move]:
        """Stay, plus per (kind, source degree) the best 1..max_ops splits or 1..max_merges merges (in the
        given order)."""
        out = [Move(())]
        for kind, ops in ops_by_kind.items():
            cap = self.max_merges if kind == ReconfigKind.MERGE else self.max_ops
            by_degree: dict[int, list[LatticeOp]] = {}
            for op in ops:
                by_degree.setdefault(op.sources[0].degree, []).append(op)
            for group in by_degree.values():
                for k in range(1, min(cap, len(group)) + 1):
                    out.append(Move(tuple(group[:k])))
        return out

    def prepare(self, workers: Sequence[WorkerNow], switch_s: float | None = None) -> _Prepared:
        """Per-worker parts every move shares: completion offsets and Ê per degree of the queued requests, and
        the switch a move is charged (``switch_s``; default: the configured one)."""
        known: dict[int, list[float]] = {}
        est: dict[int, dict[int, np.ndarray]] = {}
        for w in workers:
            if not w.queued:
                known[w.worker_id] = []
                continue
            l_arr = np.array([x[0] for x in w.queued], dtype=np.int64)
            p_arr = np.array([x[1] for x in w.queued], dtype=np.int64)
            est[w.worker_id] = e = self._est(l_arr, p_arr)
            known[w.worker_id] = (w.running_left_s + np.cumsum(e[w.degree])).tolist()
        switch = self.switch_s if switch_s is None else switch_s
        return _Prepared({w.worker_id: w for w in workers}, known, est, switch)

    def score(self, move: Move, prep: _Prepared, arrivals: ReplayArrivals) -> float:
        """Mean predicted TTFT (from now) of the forecast and of every queued request under ``move``, its targets
        starting ``prep.switch_s`` after the sources' running prefills end."""
        sources = {s.worker_id for op in move.ops for s in op.sources}
        free: dict[int, list[float]] = {c: [] for c in self.degrees}
        known: list[float] = []  # queued requests that stay where they are: completion offsets
        moved = [wid for wid in sources if wid in prep.est]
        for wid, w in prep.workers.items():
            if wid not in sources:
                free[w.degree].append(w.queue_s)
                known.extend(prep.known[wid])
        for op in move.ops:
            ready = max(prep.workers[s.worker_id].running_left_s for s in op.sources) + prep.switch_s
            for t in op.targets:
                free[t.degree].append(ready)
        replay = arrivals
        if moved:  # the sources' queued requests are re-placed at the drain instant, ahead of the forecast
            n_moved = sum(len(prep.workers[wid].queued) for wid in moved)
            replay = ReplayArrivals(
                np.concatenate([np.zeros(n_moved), arrivals.t]),
                {c: np.concatenate([*(prep.est[wid][c] for wid in moved), arrivals.est[c]]) for c in self.degrees},
            )
        return replay_mean_ttft(ReplayWorkers(free), replay, self.beta, self.lam, known)

    def expected(self, move: Move, prep: _Prepared, arrivals: ReplayArrivals) -> float:
        """The move's objective: the mean of :meth:`score` over the forecast at (1 − u)×, 1× and (1 + u)× its
        rate (u = ``rate_spread``; the forecast alone when u = 0).

        The forecast is one sample of the next seconds: a Poisson count of a few hundred arrivals moves by ~5%,
        the long-request mix by more. TTFT is convex in the load, so a composition that is just big enough for
        the sampled rate is worse in expectation than the sample says; averaging over the spread prices that
        risk (a composition the sampled rate nearly fills is charged the queue it builds at (1 + u)×)."""
        if self.rate_spread <= 0.0:
            return self.score(move, prep, arrivals)
        u = self.rate_spread
        return sum(self.score(move, prep, arrivals.compressed(f)) for f in (1.0 - u, 1.0, 1.0 + u)) / 3.0

    def split_holds(
        self, split: Move, stay: Move, prep: _Prepared, arrivals: ReplayArrivals, slack: float = 0.0
    ) -> bool:
        """Does ``split`` beat (1 + ``slack``) × staying on every one of ``split_resamples`` bootstrap resamples
        of the forecast?

        A resample keeps the arrival instants and draws the requests (Ê per degree: length and prefix found)
        with replacement from the forecast's own. The forecast's mix is a sample too — a few long requests more
        or less move a near-capacity replay by several percent — and a split that wins only on the mix that
        happened to arrive is the coin toss the decision audit found (docs/controller-log.md). The generator is
        seeded by the forecast's size and B, so a decision is reproducible. ``slack`` > 0 is the burst forecast's
        split (:meth:`decide`), which the span forecast itself already lets lose by ``burst_full_slack``."""
        n = len(arrivals)
        if self.split_resamples <= 0 or n < 2:
            return True
        rng = np.random.default_rng(n * 7919 + self.split_resamples)
        for _ in range(self.split_resamples):
            idx = rng.integers(0, n, n)
            sample = ReplayArrivals(arrivals.t, {c: e[idx] for c, e in arrivals.est.items()})
            if self.score(split, prep, sample) >= (1.0 + slack) * self.score(stay, prep, sample):
                return False
        return True

    def decide(
        self,
        workers: Sequence[WorkerNow],
        arrivals: ReplayArrivals,
        ops_by_kind: dict[ReconfigKind, list[LatticeOp]],
        burst: ReplayArrivals | None = None,
        splits_only: bool = False,
        merge_stress: float | None = None,
        switch_s: float | None = None,
        age_s: float = math.inf,
    ) -> Decision:
        """Score every move and say which direction (if any) pays, with the module docstring's margins.

        ``burst`` (the last seconds' arrivals repeated): a split that wins on it is taken too — optimism about
        splitting; a merge must win on every forecast — pessimism about giving capacity away.
        ``splits_only``: a between-windows check (merges are decided at window ends only).
        ``merge_stress``: this decision's stress factor (default: the configured ``merge_stress``; the controller
        passes a smaller one when the load it has seen swings less, see :func:`observed_stress`).
        ``switch_s``: what a move's switch costs (default: the configured one; the controller passes the
        engine's observed switch, see :func:`observed_switch`).
        ``age_s``: seconds since the pool's first arrival; from ``resample_after_s`` on, a span split must also
        hold on the resampled mixes (:meth:`split_holds`). Before, the start-up's splits are left to the margins:
        a start composition far below the load must split at once, and every second of delay there is paid by
        the backlog (the tuning set's steady 1.0 under the AIC profile: 1.031 → 1.063 × the best fixed
        composition with the test from t = 0).
        """
        stress = self.merge_stress if merge_stress is None else merge_stress
        moves = self.moves(ops_by_kind)
        if splits_only:
            moves = [m for m in moves if m.kind != ReconfigKind.MERGE]
        prep = self.prepare(workers, switch_s)
        stay = moves[0]
        if len(arrivals) == 0 and not any(w.queued or w.queue_s > 0 for w in workers):
            return Decision(stay, None, None, None, "no arrivals to forecast", len(moves))
        for m in moves:
            m.objective = self.expected(m, prep, arrivals)
        splits = [m for m in moves if m.kind == ReconfigKind.SPLIT]
        merges = [m for m in moves if m.kind == ReconfigKind.MERGE]
        best_split = min(splits, key=lambda m: m.objective) if splits else None
        best_merge = min(merges, key=lambda m: m.objective) if merges else None
        refused = False  # the span forecast's split did not hold on the resamples of its mix
        burst_refused: tuple[Move, float, float] | None = None  # nor the burst's (its move, burst, stay objectives)
        resampling = self.split_resamples > 0 and age_s >= self.resample_after_s
        if best_split is not None and best_split.objective < (1.0 - self.split_margin) * stay.objective:
            if not resampling or self.split_holds(best_split, stay, prep, arrivals):
                why = f"{best_split.describe()}: predicted {best_split.objective:.3f} s vs stay {stay.objective:.3f} s"
                return Decision(stay, best_split, best_merge, ReconfigKind.SPLIT, why, len(moves))
            # it may still be taken on the burst forecast below (a surge that lasts wins there); the reason says
            # so when nothing else moves
            refused = True
        if burst is not None and len(burst) and splits:
            stay_b = self.score(stay, prep, burst)
            scored = [(self.score(m, prep, burst), m) for m in splits]
            obj_b, move_b = min(scored, key=lambda x: x[0])
            burst_wins = obj_b < (1.0 - self.burst_split_margin) * stay_b
            # The last seconds are a sample of a sample: a burst split must also not lose by more than the slack on
            # any resample of the span's mix (a pulse's split holds there; a Poisson cluster's split on a steady
            # load often does not). Refused, it falls through to the merge checks.
            slack = self.burst_resample_slack
            if (
                burst_wins
                and resampling
                and slack is not None
                and not self.split_holds(move_b, stay, prep, arrivals, slack)
            ):
                burst_wins = False
                burst_refused = (move_b, obj_b, stay_b)
            if burst_wins:
                if self.burst_full_slack is None or move_b.objective <= (1.0 + self.burst_full_slack) * stay.objective:
                    why = (
                        f"{move_b.describe()}: on the last seconds' rate predicted {obj_b:.3f} s vs stay {stay_b:.3f} s"
                    )
                    return Decision(stay, move_b, best_merge, ReconfigKind.SPLIT, why, len(moves) + len(splits) + 1)
                # The last seconds ask for a split that the whole span says loses: at a steady load that is a
                # Poisson cluster, not a surge (a surge that lasts wins on the span too, a check or two later).
                why = (
                    f"{move_b.describe()} wins on the last seconds' rate ({obj_b:.3f} s vs stay {stay_b:.3f} s) but"
                    f" not on the span ({move_b.objective:.3f} s vs {stay.objective:.3f} s)"
                )
                return Decision(stay, move_b, best_merge, None, why, len(moves) + len(splits) + 1)
            if best_merge is not None and self.score(best_merge, prep, burst) > stay_b:
                # a merge must not lose on the burst forecast either
                why = "a merge would lose at the last seconds' rate"
                return Decision(stay, best_split, best_merge, None, why, len(moves))
        # A patient merge: a gain below merge_margin that the controller acts on only once it has been wanted for
        # merge_patient_windows windows in a row (a persistent small gain is real; one window's is noise).
        margin = self.merge_margin
        floor = margin if self.patient_margin is None else min(margin, self.patient_margin)
        if best_merge is not None and best_merge.objective < (1.0 - floor) * stay.objective:
            patient = best_merge.objective >= (1.0 - margin) * stay.objective
            stressed = arrivals.compressed(stress)
            best_merge.stressed = self.score(best_merge, prep, stressed)
            stay.stressed = self.score(stay, prep, stressed)
            if best_merge.stressed <= stay.stressed:
                why = (
                    f"{best_merge.describe()}: predicted {best_merge.objective:.3f} s vs stay {stay.objective:.3f} s"
                    f" (×{stress:.2f} load: {best_merge.stressed:.3f} vs {stay.stressed:.3f})"
                    + (f", by less than {margin:.0%}: a patient merge" if patient else "")
                )
                return Decision(stay, best_split, best_merge, ReconfigKind.MERGE, why, len(moves), patient)
            why = f"merge would lose at ×{stress:.2f} load ({best_merge.stressed:.3f} vs {stay.stressed:.3f})"
            return Decision(stay, best_split, best_merge, None, why, len(moves))
        why = f"stay is best ({stay.objective:.3f} s)"
        if burst_refused is not None:
            move_r, obj_r, stay_r = burst_refused
            why = (
                f"{move_r.describe()} wins on the last seconds' rate ({obj_r:.3f} s vs stay {stay_r:.3f} s) but loses"
                f" by more than {self.burst_resample_slack:.0%} on a resample of the span's mix"
            )
        if refused and best_split is not None:
            why = (
                f"{best_split.describe()} wins on the forecast ({best_split.objective:.3f} s vs stay"
                f" {stay.objective:.3f} s) but not on all {self.split_resamples} resamples of its mix"
            )
        return Decision(stay, best_split, best_merge, None, why, len(moves))
