"""The window-based controller: measure each window, decide a direction, pick lattice moves, run them.

Two decision policies share the window accounting, the lattice and the epoch protocol:
``rules`` (the paper's ρ / long-share thresholds, :mod:`vertumnus.controller.rules`, one operation at a time)
and ``predictive`` (:mod:`vertumnus.controller.predictive`: replay the recent arrivals on the current,
adjacent and multi-operation compositions and move where the predicted mean TTFT is lowest).

Rule-policy operation choice among topology-compatible moves of the decided direction (all participants ACTIVE):
  1. smallest predicted drain time = max q_w(now) over the participating workers (they drain in parallel);
  2. then the least expected KV-reconciliation traffic (``cache.reconcile_traffic(plan)``), evaluated only
     for the moves tied on (1);
  3. then the lowest source worker id (deterministic).
A merge of two degree-C siblings is admitted only if the merged composition still has D_k ≤ θ_up·K', with
K' = K − 2κ_C + κ_{2C}.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from vertumnus.config import VertumnusConfig
from vertumnus.controller.epochs import EpochManager
from vertumnus.controller.initial import History
from vertumnus.controller.lattice import Lattice, LatticeOp
from vertumnus.controller.predictive import (
    ArrivalLog,
    Decision,
    Move,
    PredictiveModel,
    WorkerNow,
    incoming_workers,
    observed_stress,
    observed_switch,
    worker_states,
)
from vertumnus.controller.replay import ReplayArrivals
from vertumnus.controller.rules import Direction, WindowAccount, WindowReport
from vertumnus.cost_model import CostModel
from vertumnus.types import ReconfigKind, ReconfigPlan, WorkerState

SWITCH_MEMORY = 8  # committed reconfigurations whose switch stages the replay's switch price averages
# Former config fields, their values unchanged (the controller's named constants replace these).
_MAX_CONCURRENT_SPLITS = 4
_STARTUP_CHECK_INTERVAL_S = 0.1
_STARTUP_SPAN_S = 5.0
_MERGE_STRESS_MAX = 2.0
_FORECAST_RATE_SPREAD = 0.2
_MIN_FORECAST_REQUESTS = 32
_RESAMPLE_AFTER_S = 15.0


class TrafficEstimator(Protocol):
    def reconcile_traffic(self, plan: ReconfigPlan) -> float: ...


# (now, span_s) -> the arrivals of [now, now + span_s) as the forecast gives them: (offset from now, input length,
# prefix tokens). Only the evaluation's clairvoyant reference sets one (vertumnus.sim.clairvoyant).
FutureArrivals = Callable[[float, float], list[tuple[float, int, int]]]


@dataclass(slots=True)
class Candidate:
    op: LatticeOp
    drain_s: float
    traffic: float | None = None


@dataclass(slots=True)
class PendingDecision:
    """A predictive decision's inputs, snapshotted on the pool's thread: plain data only."""

    report: WindowReport | None  # None: a between-windows split check
    now: float
    workers: list[WorkerNow]
    arrivals: ReplayArrivals
    ops: dict[ReconfigKind, list[LatticeOp]]
    burst: ReplayArrivals | None
    shape: tuple[tuple[int, int], ...]
    merge_stress: float | None = None  # this decision's stress factor (None: the configured one)
    inflight: tuple[int, ...] = ()  # epochs of the plans in flight when it was prepared
    switch_s: float | None = None  # what a move's switch costs (None: the configured switch_s)
    age_s: float = math.inf  # seconds since the pool's first arrival (inf: not known)


class Controller:
    """Owns the lattice, the window account and the epoch protocol (through :class:`EpochManager`)."""

    def __init__(
        self,
        cfg: VertumnusConfig,
        cost: CostModel,
        lattice: Lattice,
        epochs: EpochManager,
        traffic: TrafficEstimator,
        history: History | None = None,
    ) -> None:
        cc = cfg.controller
        rc, pc = cc.rules, cc.predictive
        self.enabled = cc.enabled
        self.window_s = cc.window_s
        self.theta_up = rc.theta_up
        self.theta_low = rc.theta_low
        self.delta_long = rc.delta_long
        self.long_threshold = rc.long_threshold_tokens
        self.persist_windows = rc.persist_windows
        self.lattice = lattice
        self.epochs = epochs
        self.traffic = traffic
        self.account = WindowAccount(history.long_share if history is not None else None)
        self.reports: deque[WindowReport] = deque(maxlen=256)
        self.next_window_end = float("inf")
        self._kappa: dict[int, float] = {}
        if self.enabled:
            self._kappa = {c: cost.kappa(c, self.window_s) for c in lattice.degrees}
        self.policy = cc.policy
        self.lookback_s = pc.span_s
        self.min_forecast = _MIN_FORECAST_REQUESTS
        self.persist_split = 1
        self.persist_merge = max(1, round(pc.merge_persist_s / cc.window_s))
        self.persist_patient = 10
        self.log = ArrivalLog(self.lookback_s, _MIN_FORECAST_REQUESTS)
        # every window's demand D_k, the last merge_stress_windows of them: the swings the merge stress is sized by
        stress_windows = round(pc.merge_stress_memory_s / cc.window_s)
        self.demands: deque[float] = deque(maxlen=max(1, stress_windows))
        self.stress_windows = stress_windows
        self.check_interval_s = pc.check_interval_s if cc.policy == "predictive" else None
        self.startup_check_s = _STARTUP_CHECK_INTERVAL_S
        self.startup_span_s = _STARTUP_SPAN_S
        self.burst_s = pc.burst_span_s
        # predictive: keep looking for splits (on ACTIVE workers) while plans are in flight
        self.split_in_flight = False
        self.next_check = float("inf")  # predictive: next between-windows split check
        self.model = PredictiveModel(
            cost, lattice.degrees, cfg.scheduler.beta, cfg.scheduler.lam, pc.switch_s, _MAX_CONCURRENT_SPLITS,
            pc.split_margin, pc.merge_margin, _MERGE_STRESS_MAX, pc.split_margin, pc.max_concurrent_merges,
            pc.burst_full_slack, _FORECAST_RATE_SPREAD, pc.split_resamples, _RESAMPLE_AFTER_S,
            pc.burst_resample_slack, None,
        )  # fmt: skip
        self.wait_for_forecast = True
        self.switch_from_observed = True
        self.last_decision: Decision | None = None
        # The clairvoyant reference's hook: the requests that will arrive replace the forecast (span and burst
        # alike), and no decision waits for a log to forecast from. None (always, outside that reference): the
        # forecast comes from the arrival log.
        self.future: FutureArrivals | None = None
        # Predictive decisions off the pool's thread (the server sets this): see _predictive.
        self.defer_decisions = False
        self.pending: PendingDecision | None = None
        self._deciding: PendingDecision | None = None
        self.stale_decisions = 0
        # Called after every computed predictive decision with the move it began (None: none began, stale
        # decisions included): the simulator's decision audit (vertumnus/sim/decision_audit.py) listens here.
        self.decision_listeners: list[Callable[[PendingDecision, Decision, Move | None], None]] = []

    def start(self, now: float) -> None:
        """Open the first window at ``now``."""
        if self.enabled:
            self.next_window_end = now + self.window_s
            if self.check_interval_s is not None:
                self.next_check = now + self._check_step(now)

    def next_timer(self) -> float:
        """The next instant the controller has work (window end or split check)."""
        return min(self.next_window_end, self.next_check)

    def on_timer(self, now: float, queue_s: Callable[[int], float]) -> None:
        """Close every window that ended by ``now``; run a due split check (predictive) otherwise."""
        closed = False
        while self.next_window_end <= now:
            self.end_window(now, queue_s)
            closed = True
        if self.next_check <= now:
            assert self.check_interval_s is not None
            while self.next_check <= now:
                self.next_check += self._check_step(self.next_check)
            if not closed and (self.epochs.current is None or self.split_in_flight) and self._splittable():
                self._predictive(None, now)

    def _splittable(self) -> bool:
        """Some ACTIVE worker can be split. A split check scores splits only, so without one it could only
        say "stay": it is skipped (at the smallest degree everywhere — e.g. 10xCP4 — a quarter to a third of a
        busy trace's checks, each a few hundred µs of replay)."""
        state = self.epochs.scheduler.state
        split_of = self.lattice.split_of
        return any(state(wid) == WorkerState.ACTIVE and split_of(wid) is not None for wid in self.lattice.groups)

    def skip_idle(self, until: float) -> int:
        """Drop every window end and split check before ``until`` as the no-op it would be; returns the windows
        skipped (their indices are used up). Only for an idle pool at a fixed point (the simulator's idle-gap
        jump, :meth:`vertumnus.pool.PrefillPool.skip_idle`): an empty window then closes with no effect."""
        skipped = _grid_steps(self.next_window_end, self.window_s, until)
        self.next_window_end += skipped * self.window_s
        self.account.index += skipped
        if self.check_interval_s is not None:
            # the walk's grid: start-up steps up to the first instant at or past the start-up span's end (within
            # the gap, if the span ends there), normal steps after it; before any arrival only start-up steps
            origin = self.log.origin
            if self.startup_check_s is not None and origin is not None:
                edge = min(until, origin + self.startup_span_s)
                self.next_check += _grid_steps(self.next_check, self.startup_check_s, edge) * self.startup_check_s
            step = self._check_step(self.next_check)
            self.next_check += _grid_steps(self.next_check, step, until) * step
        return skipped

    def _check_step(self, t: float) -> float:
        """The split-check period at instant ``t``: ``startup_check_interval_s`` before the pool's first arrival
        and within ``startup_span_s`` of it, ``check_interval_s`` after. Why: from a start composition far below
        a load near capacity the backlog built before the first split outlasts the start-up (each half second
        of delay cost ~2% of a whole run's mean TTFT on the tuning set), while later splits answer a forecast
        that changes over seconds."""
        assert self.check_interval_s is not None
        origin = self.log.origin
        if self.startup_check_s is not None and (origin is None or t < origin + self.startup_span_s):
            return self.startup_check_s
        return self.check_interval_s

    def capacity(self, composition: dict[int, int] | None = None) -> float:
        """K = Σ_w κ_{C_w} over a composition (default: the current one)."""
        comp = self.lattice.composition() if composition is None else composition
        return sum(self._kappa[c] * n for c, n in comp.items())

    def observe(
        self, predicted_s: float, input_len: int, cached_tokens: int = 0, arrival_s: float | None = None
    ) -> None:
        """A request's first placement in the current window (adds Ê_{i,w_i} to D_k; logs it for the forecast)."""
        self.account.observe(predicted_s, input_len > self.long_threshold)
        if arrival_s is not None and self.policy == "predictive":
            self.log.add(arrival_s, input_len, cached_tokens)

    def end_window(self, now: float, queue_s: Callable[[int], float]) -> WindowReport:
        """Close the window ending at ``self.next_window_end`` and maybe begin one operation."""
        end = self.next_window_end
        self.next_window_end = end + self.window_s
        cap = self.capacity()
        report = self.account.close(end, cap, self.theta_low, self.theta_up, self.delta_long)
        self.reports.append(report)
        self.demands.append(report.demand_s)
        if self.epochs.current is not None:
            self.account.busy()
            if self.split_in_flight:  # a window end while plans run: a split check, as between windows
                self._predictive(None, now)
            return report
        if self.policy == "predictive":
            self._predictive(report, now)
            return report
        chosen: Candidate | None = None
        if report.signal != Direction.NONE:
            kind = ReconfigKind.SPLIT if report.signal == Direction.SPLIT else ReconfigKind.MERGE
            chosen = self.choose(kind, report.demand_s, queue_s)
        direction = report.signal if chosen is not None else Direction.NONE
        if self.account.persist(report, direction, self.persist_windows) and chosen is not None:
            self.account.acted(report)
            self.epochs.begin(self._plan(chosen), now)
        return report

    def _predictive(self, report: WindowReport | None, now: float) -> None:
        """The predictive policy's window end, or (``report`` None) a between-windows split check. With
        ``defer_decisions`` the replay is left to the caller (:meth:`take_pending` → :meth:`decide` on any
        thread → :meth:`finish` on the pool's thread); otherwise it runs here."""
        if self.pending is not None or self._deciding is not None:
            if report is not None:
                report.reason = "previous decision still being computed"
            return
        if self.future is None and self.wait_for_forecast and self._too_young(now):
            if report is not None:
                report.reason = "too few arrivals seen yet to forecast"
            return
        job = self._prepare(report, now)
        if self.defer_decisions:
            self.pending = job
            return
        self.finish(job, self.decide(job), now)

    def _too_young(self, now: float) -> bool:
        """The pool's first arrival came less than a forecast span ago, it has seen fewer than
        ``min_forecast_requests`` arrivals and none is waiting: too little to forecast from. (The young log's
        forecast tiles what it saw over the span: a second's handful of long requests would be forecast as ten
        seconds of them. A waiting request is evidence of overload of its own, and decides at once.)"""
        if not self.log.too_young(now, self.lookback_s, self.min_forecast):
            return False
        sched = self.epochs.scheduler
        return not any(sched.waiting_at(wid) for wid in self.lattice.groups)

    def take_pending(self) -> PendingDecision | None:
        """The prepared decision waiting to be computed (None if none); it is then *in flight* until
        :meth:`finish` — no other predictive decision is prepared meanwhile."""
        job, self.pending = self.pending, None
        self._deciding = job
        return job

    def abandon(self, job: PendingDecision) -> None:
        """Forget an in-flight decision that could not be computed (the next window end prepares a new one)."""
        if self._deciding is job:
            self._deciding = None

    def decide(self, job: PendingDecision) -> Decision:
        """The replay: pure in the prepared snapshot (reads no pool state), so it may run off the pool's thread."""
        return self.model.decide(
            job.workers, job.arrivals, job.ops, job.burst, splits_only=job.report is None,
            merge_stress=job.merge_stress, switch_s=job.switch_s, age_s=job.age_s,
        )  # fmt: skip

    def _prepare(self, report: WindowReport | None, now: float) -> PendingDecision:
        sched = self.epochs.scheduler
        ops = {
            kind: [
                c.op
                for c in sorted(
                    self.candidates(kind, 0.0, lambda w: sched.queue_s(w, now), admit=False),
                    key=lambda c: (c.drain_s, c.op.sources[0].worker_id),
                )
            ]
            # a between-windows check scores splits only: no merge candidates to build
            for kind in ((ReconfigKind.SPLIT,) if report is None else (ReconfigKind.SPLIT, ReconfigKind.MERGE))
        }
        if self.future is not None:  # the requests to come are the span and the burst alike (read-only in the replay)
            arrivals = burst = self.model.arrivals(self.future(now, self.lookback_s))
        else:
            arrivals = self.model.arrivals(self.log.forecast(now, self.lookback_s, self.min_forecast))
            burst = self.model.arrivals(self.log.burst(now, self.burst_s, self.lookback_s))
        workers = worker_states(sched, self.lattice, now)
        switch = self.switch_estimate()
        if self.epochs.inflight:  # (split_in_flight) the targets on their way count as capacity
            workers += incoming_workers(self.epochs, switch, now)
        stress = None
        if report is not None and self.stress_windows > 0:
            recent = max(1, round(self.lookback_s / self.window_s))
            stress = observed_stress(self.demands, recent, self.model.merge_stress)
        age = now - self.log.origin if self.log.origin is not None else 0.0
        return PendingDecision(
            report, now, workers, arrivals, ops, burst, self._shape(), stress, self._inflight(),
            switch, age,
        )  # fmt: skip

    def switch_estimate(self) -> float:
        """What the replay charges a move's switch: with ``switch_from_observed``, the mean switch stage of the
        last :data:`SWITCH_MEMORY` committed reconfigurations (the configured ``switch_s`` until one committed)."""
        if not self.switch_from_observed:
            return self.model.switch_s
        recent = [r.switch_s for r in self.epochs.records[-SWITCH_MEMORY:]]
        return observed_switch(recent, self.model.switch_s)

    def _shape(self) -> tuple[tuple[int, int], ...]:
        """The composition's identity (worker id, degree): a decision computed on another one is stale."""
        return tuple(sorted((wid, g.degree) for wid, g in self.lattice.groups.items()))

    def _inflight(self) -> tuple[int, ...]:
        """The plans in flight (their epochs): a decision prepared beside other plans is stale too."""
        return tuple(r.plan.epoch for r in self.epochs.inflight)

    def finish(self, job: PendingDecision, decision: Decision, now: float) -> None:
        """Act on a computed decision — unless the pool changed meanwhile (an operation began or ended, the
        composition moved): then it is dropped as stale (``stale_decisions``). With plans in flight only a split
        check's decision is acted on (``split_while_reconfiguring``); its operations are on ACTIVE workers,
        disjoint from the plans in flight. Then tells ``decision_listeners``."""
        acted = self._act(job, decision, now)
        for listener in self.decision_listeners:
            listener(job, decision, acted)

    def _act(self, job: PendingDecision, decision: Decision, now: float) -> Move | None:
        """Begin the decision's move if it still applies and has persisted long enough: the move begun, or None."""
        if self._deciding is job:
            self._deciding = None
        busy = self.epochs.current is not None and (not self.split_in_flight or job.report is not None)
        if busy or job.shape != self._shape() or job.inflight != self._inflight():
            self.stale_decisions += 1
            return None
        report = job.report
        direction = {None: Direction.NONE, ReconfigKind.SPLIT: Direction.SPLIT, ReconfigKind.MERGE: Direction.MERGE}[
            decision.want
        ]
        if report is None:  # a check acts on a split only, at once when splits need one window
            if direction != Direction.SPLIT or self.persist_split > 1:
                return None
            report = self.account.check_report(now, decision.reason)
            self.reports.append(report)
        else:
            report.signal = direction
            report.reason = decision.reason
            persist = self.persist_split if direction == Direction.SPLIT else self.persist_merge
            if direction == Direction.MERGE and decision.patient:
                persist = max(persist, self.persist_patient)
            if not self.account.persist(report, direction, persist):
                self.last_decision = decision
                return None
        self.last_decision = decision
        move = decision.best_split if direction == Direction.SPLIT else decision.best_merge
        assert move is not None and move.ops
        self.account.acted(report)
        for i, op in enumerate(move.ops):
            if i:  # later operations get fresh target ids (the first plan reserved its own)
                src = op.sources[0].worker_id
                again = self.lattice.split_of(src) if op.kind == ReconfigKind.SPLIT else self.lattice.merge_of(src)
                assert again is not None
                op = again
            drain = max(self.epochs.scheduler.queue_s(s.worker_id, now) for s in op.sources)
            self.epochs.begin(self.epochs.next_plan(op, drain), now)
        return move

    def candidates(
        self, kind: ReconfigKind, demand_s: float, queue_s: Callable[[int], float], admit: bool = True
    ) -> list[Candidate]:
        """Moves of one kind with their predicted drain times (merge admission applied when ``admit``)."""
        cap = self.capacity()
        out: list[Candidate] = []
        for op in self.lattice.ops(kind):
            if any(self.epochs.scheduler.state(s.worker_id) != WorkerState.ACTIVE for s in op.sources):
                continue
            if kind == ReconfigKind.MERGE and admit:
                c = op.sources[0].degree
                merged = cap - 2 * self._kappa[c] + self._kappa[2 * c]
                if demand_s > self.theta_up * merged:
                    continue
            out.append(Candidate(op, max(queue_s(s.worker_id) for s in op.sources)))
        return out

    def choose(self, kind: ReconfigKind, demand_s: float, queue_s: Callable[[int], float]) -> Candidate | None:
        """The move to make: smallest drain, then least reconciliation traffic, then lowest source id."""
        cands = self.candidates(kind, demand_s, queue_s)
        if not cands:
            return None
        best_drain = min(c.drain_s for c in cands)
        tied = [c for c in cands if c.drain_s == best_drain]
        for c in tied:
            c.traffic = self.traffic.reconcile_traffic(self.epochs.next_plan(c.op, c.drain_s))
        return min(tied, key=lambda c: (c.traffic, c.op.sources[0].worker_id))

    def _plan(self, c: Candidate) -> ReconfigPlan:
        return self.epochs.next_plan(c.op, c.drain_s, c.traffic or 0.0)

    def manual(self, kind: ReconfigKind, worker_id: int, now: float, queue_s: Callable[[int], float]) -> ReconfigPlan:
        """Admin split / merge of a given worker; ValueError with a clear message when impossible."""
        if self.epochs.current is not None:
            raise ValueError(f"a {self.epochs.current.plan.kind.name.lower()} is in progress; one operation at a time")
        if worker_id not in self.lattice.groups:
            raise ValueError(f"no worker {worker_id} in the pool (workers: {sorted(self.lattice.groups)})")
        g = self.lattice.groups[worker_id]
        if kind == ReconfigKind.SPLIT:
            op = self.lattice.split_of(worker_id)
            if op is None:
                raise ValueError(
                    f"cannot split worker {worker_id} (CP{g.degree}): degree {g.degree // 2} is not allowed "
                    f"(degrees {list(self.lattice.degrees)})"
                )
        else:
            op = self.lattice.merge_of(worker_id)
            if op is None:
                raise ValueError(
                    f"cannot merge worker {worker_id} (CP{g.degree}, node {g.node}, ranks {g.first_rank}.."
                    f"{g.first_rank + g.degree - 1}): no CP{g.degree} sibling or CP{2 * g.degree} not allowed"
                )
        for s in op.sources:
            st = self.epochs.scheduler.state(s.worker_id)
            if st != WorkerState.ACTIVE:
                raise ValueError(f"worker {s.worker_id} is {st.name}, not ACTIVE")
        cand = Candidate(op, max(queue_s(s.worker_id) for s in op.sources))
        cand.traffic = self.traffic.reconcile_traffic(self.epochs.next_plan(op, cand.drain_s))
        plan = self._plan(cand)
        self.epochs.begin(plan, now)
        return plan


def _grid_steps(t: float, step: float, until: float) -> int:
    """How many instants t, t + step, ... lie before ``until`` (0 for t = inf)."""
    return math.ceil((until - t) / step) if t < until else 0
