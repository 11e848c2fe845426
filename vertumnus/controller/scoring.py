"""The predictive decision's scoring: candidate moves and the replay of a forecast on each of them.

    state     every ACTIVE worker's q_w (its queue runs dry at q_w), its running prefill's remaining time and its
              queued requests (:class:`WorkerNow`, snapshotted by :func:`worker_states`)
    moves     stay; per (kind, source degree) the best 1..``max_concurrent_splits`` disjoint splits or
              1..``max_concurrent_merges`` disjoint merges (smallest drain first, as the rule controller orders
              them): several splits at once are one candidate, so a burst far above capacity is answered by one
              decision; merges give capacity away a step per decision by default
    a move    sources leave now; their queued requests are re-placed at instant 0 (as the drain step does);
              targets start after the sources' running prefills finish + the switch time
    objective mean predicted TTFT of the forecast arrivals and of every queued request (from now on)
              (:meth:`ReplayModel.score`), averaged over the forecast at (1 − u)×, 1× and (1 + u)× its rate
              (:meth:`ReplayModel.expected`)

Capacity of a composition is therefore not Σ κ of isolated workers: the replay pools the workers behind the
cache-aware rule, queues included, which is what over- and under-load actually look like to requests.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from vertumnus.controller.forecast import Arrival
from vertumnus.controller.lattice import Lattice, LatticeOp
from vertumnus.controller.replay import ReplayArrivals, ReplayWorkers, replay_mean_ttft
from vertumnus.cost_model import CostModel
from vertumnus.scheduler.scheduler import Scheduler
from vertumnus.types import ReconfigKind, WorkerState


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
    objective: float = 0.0  # its expected mean TTFT on the span forecast (set when scored)

    @property
    def kind(self) -> ReconfigKind | None:
        return self.ops[0].kind if self.ops else None

    def describe(self) -> str:
        if not self.ops:
            return "stay"
        parts = [f"{o.kind.name.lower()} {'+'.join(str(s.worker_id) for s in o.sources)}" for o in self.ops]
        return ", ".join(parts)


@dataclass(slots=True)
class Prepared:
    """Per-worker parts every move of one decision shares."""

    workers: dict[int, WorkerNow]
    known: dict[int, list[float]]  # completion offsets of each worker's queued requests where they are
    est: dict[int, dict[int, np.ndarray]]  # worker -> degree -> Ê of its queued requests (re-placement)
    switch_s: float  # what a move's switch costs in this decision (see observed_switch)


def observed_stress(demands: Sequence[float], recent_windows: int, cap: float) -> float:
    """The merge stress factor sized by the load swings seen: the largest window demand of ``demands`` (the
    last windows, oldest first) over the mean demand of the ``recent_windows`` most recent ones, clamped to
    [1, ``cap``] (``cap`` when nothing was demanded lately).

    A merge must not lose if the load rises again to the peak of the remembered windows: at a steady load that
    is the window-to-window noise, after a burst it is the burst (up to ``cap``)."""
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

    Why: the switch is a property of the engine and the hardware, not of the policy. A replay that charged a
    configured 0.8 s for a 3-ms switch would refuse moves that pay, one that charged less than the engine takes
    would make moves that do not."""
    if not switches:
        return prior
    return sum(switches) / len(switches)


def running_left(scheduler: Scheduler, worker_id: int, now: float) -> float:
    """Remaining predicted time of the worker's running prefill (0 when idle)."""
    left = 0.0
    for t in scheduler.tickets_at(worker_id):
        if t.running:
            left = max(left, t.started_s + t.placement.predicted_s - now)
    return left


def worker_states(scheduler: Scheduler, lattice: Lattice, now: float) -> list[WorkerNow]:
    """Every ACTIVE worker of the current composition with its queue (from the scheduler's tickets)."""
    out: list[WorkerNow] = []
    for wid in sorted(lattice.groups):
        if wid not in scheduler.table.index or scheduler.state(wid) != WorkerState.ACTIVE:
            continue
        queued = [(t.request.input_len, t.placement.cached_tokens) for t in scheduler.tickets_at(wid) if not t.running]
        left = running_left(scheduler, wid, now)
        out.append(WorkerNow(wid, lattice.groups[wid].degree, scheduler.queue_s(wid, now), left, queued))
    return out


class ReplayModel:
    """The replay of a forecast on candidate moves (pure: reads only its arguments and the cost model)."""

    def __init__(self, cost: CostModel, degrees: Sequence[int], beta: float, lam: float) -> None:
        self.cost = cost
        self.degrees = tuple(sorted(degrees))
        self.beta = beta
        self.lam = lam

    def _est(self, lengths: np.ndarray, prefixes: np.ndarray) -> dict[int, np.ndarray]:
        p = np.minimum(prefixes, np.maximum(lengths - 1, 0)).astype(np.float64)
        r = lengths.astype(np.float64) - p
        return {c: self.cost.predict_degree(c, r, p) for c in self.degrees}

    def arrivals(self, picked: Sequence[Arrival]) -> ReplayArrivals:
        """The forecast (offsets from the decision instant) with Ê per degree."""
        t = np.array([e[0] for e in picked], dtype=np.float64)
        lengths = np.array([e[1] for e in picked], dtype=np.int64)
        prefixes = np.array([e[2] for e in picked], dtype=np.int64)
        return ReplayArrivals(t, self._est(lengths, prefixes))

    @staticmethod
    def moves(ops_by_kind: dict[ReconfigKind, list[LatticeOp]], max_splits: int, max_merges: int) -> list[Move]:
        """Stay, plus per (kind, source degree) the best 1..max_splits splits or 1..max_merges merges (in the
        given order)."""
        out = [Move(())]
        for kind, ops in ops_by_kind.items():
            cap = max_merges if kind == ReconfigKind.MERGE else max_splits
            by_degree: dict[int, list[LatticeOp]] = {}
            for op in ops:
                by_degree.setdefault(op.sources[0].degree, []).append(op)
            for group in by_degree.values():
                for k in range(1, min(cap, len(group)) + 1):
                    out.append(Move(tuple(group[:k])))
        return out

    def prepare(self, workers: Sequence[WorkerNow], switch_s: float) -> Prepared:
        """Per-worker parts every move shares: completion offsets and Ê per degree of the queued requests, and
        the switch a move is charged."""
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
        return Prepared({w.worker_id: w for w in workers}, known, est, switch_s)

    def score(self, move: Move, prep: Prepared, arrivals: ReplayArrivals) -> float:
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

    def expected(self, move: Move, prep: Prepared, arrivals: ReplayArrivals, spread: float) -> float:
        """The move's objective: the mean of :meth:`score` over the forecast at (1 − u)×, 1× and (1 + u)× its
        rate (u = ``spread``; the forecast alone when u = 0).

        The forecast is one sample of the next seconds: a Poisson count of a few hundred arrivals moves by ~5%,
        the long-request mix by more. TTFT is convex in the load, so a composition that is just big enough for
        the sampled rate is worse in expectation than the sample says; averaging over the spread prices that
        risk."""
        if spread <= 0.0:
            return self.score(move, prep, arrivals)
        u = spread
        return sum(self.score(move, prep, arrivals.compressed(f)) for f in (1.0 - u, 1.0, 1.0 + u)) / 3.0

    def resampled(
        self, moves: Iterable[Move], prep: Prepared, arrivals: ReplayArrivals, resamples: int
    ) -> Iterator[tuple[float, ...]]:
        """The scores of ``moves`` on each of ``resamples`` bootstrap resamples of the forecast's mix, one tuple
        per resample, lazily (a consumer that has seen enough stops the replays); none for fewer than 2 arrivals.

        A resample keeps the arrival instants and draws the requests (Ê per degree: length and prefix found)
        with replacement from the forecast's own: the forecast's mix is a sample too, and a split that wins only
        on the mix that happened to arrive is a coin toss. The generator is seeded by the forecast's size and
        the resample count, so a decision is reproducible."""
        n = len(arrivals)
        if resamples <= 0 or n < 2:
            return
        listed = tuple(moves)
        rng = np.random.default_rng(n * 7919 + resamples)
        for _ in range(resamples):
            idx = rng.integers(0, n, n)
            sample = ReplayArrivals(arrivals.t, {c: e[idx] for c, e in arrivals.est.items()})
            yield tuple(self.score(m, prep, sample) for m in listed)
