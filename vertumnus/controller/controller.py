"""The window-based controller: measure each window, ask the policy, run the moves it begins.

The shell owns what every policy shares: the window account and its reports, the timers (window ends, split
checks), the lattice and the epoch protocol, the switch price, and the life of a decision computed off the
pool's thread (prepared here, computed anywhere, acted on here unless the pool changed meanwhile). The policy
decides: :class:`~vertumnus.controller.rules_policy.RulesPolicy` (the paper's ρ / long-share thresholds) or
:class:`~vertumnus.controller.predictive_policy.PredictivePolicy` (replay a forecast on candidate moves).

Injection points (generic; the server and the simulator use them alike):
  - :meth:`Controller.add_observer`: told every computed predictive decision with the move it began;
  - :meth:`Controller.use_forecaster`: replaces the predictive policy's forecasts (span and burst);
  - :attr:`Controller.defer_decisions` / :meth:`take_pending` / :meth:`decide` / :meth:`finish`: compute the
    decision elsewhere (a thread, or a simulated delay);
  - :attr:`Controller.timers`: the clock grid (:meth:`~vertumnus.controller.timers.ControllerTimers.advance_idle`
    jumps an idle gap).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from vertumnus.config import VertumnusConfig
from vertumnus.controller.epochs import EpochManager
from vertumnus.controller.forecast import Forecaster
from vertumnus.controller.initial import History
from vertumnus.controller.lattice import Lattice, LatticeOp
from vertumnus.controller.params import ControllerParams, PredictiveParams, RulesParams
from vertumnus.controller.predictive import PendingDecision, Verdict
from vertumnus.controller.predictive_policy import PredictivePolicy
from vertumnus.controller.rules import WindowAccount, WindowReport
from vertumnus.controller.rules_policy import RulesPolicy
from vertumnus.controller.scoring import Move, observed_switch
from vertumnus.controller.timers import ControllerTimers
from vertumnus.cost_model import CostModel
from vertumnus.types import ReconfigKind, ReconfigPlan, WorkerState

SWITCH_MEMORY = 8  # committed reconfigurations whose switch stages the replay's switch price averages

QueueS = Callable[[int], float]  # worker id -> q_w(now)
# Told every computed predictive decision: its snapshot, its verdict and the move it began (None: none began,
# stale decisions included). E.g. the decision audit (vertumnus/eval/decision_audit.py), a log.
DecisionObserver = Callable[[PendingDecision, Verdict, Move | None], None]


class TrafficEstimator(Protocol):
    def reconcile_traffic(self, plan: ReconfigPlan) -> float: ...


class Policy(Protocol):
    """What a decision policy answers to: a window closed, a split check is due (plus the arrivals it sees)."""

    name: str

    @property
    def first_arrival(self) -> float | None: ...

    def observe(self, arrival_s: float, input_len: int, cached_tokens: int) -> None: ...

    def window_end(self, report: WindowReport, now: float, queue_s: QueueS) -> None: ...

    def check(self, now: float) -> None: ...


@dataclass(slots=True)
class Candidate:
    op: LatticeOp
    drain_s: float
    traffic: float | None = None


class Controller:
    """Owns the lattice, the window account, the timers and the epoch protocol (through :class:`EpochManager`)."""

    def __init__(
        self,
        cfg: VertumnusConfig,
        cost: CostModel,
        lattice: Lattice,
        epochs: EpochManager,
        traffic: TrafficEstimator,
        history: History | None = None,
    ) -> None:
        shell = ControllerParams.from_config(cfg)
        self.enabled = shell.enabled
        self.window_s = shell.window_s
        self.long_threshold = shell.long_threshold_tokens
        self.switch_prior = shell.switch_s
        self.rules = RulesParams.from_config(cfg)
        self.lattice = lattice
        self.epochs = epochs
        self.traffic = traffic
        self.account = WindowAccount(history.long_share if history is not None else None)
        self.reports: deque[WindowReport] = deque(maxlen=256)
        self._kappa: dict[int, float] = {}
        if self.enabled:
            self._kappa = {c: cost.kappa(c, self.window_s) for c in lattice.degrees}
        self._cost = cost
        self.predictive: PredictivePolicy | None = None
        self.policy: Policy = RulesPolicy(self, self.rules)
        self.demands: deque[float] = deque(maxlen=1)
        self.timers = ControllerTimers(self.window_s, self.account, lambda: self.policy.first_arrival)
        if shell.policy == "predictive":
            self.use_params(PredictiveParams.from_config(cfg))
        # Decisions off the pool's thread (the server sets this): see request_decision.
        self.defer_decisions = False
        self.pending: PendingDecision | None = None
        self._deciding: PendingDecision | None = None
        self.stale_decisions = 0
        self.last_decision: Verdict | None = None
        self.observers: list[DecisionObserver] = []

    # -- injection points -----------------------------------------------------------------------------------
    def add_observer(self, observer: DecisionObserver) -> None:
        """Tell ``observer`` every computed predictive decision (after it was acted on, or found stale)."""
        self.observers.append(observer)

    def use_forecaster(self, forecaster: Forecaster) -> None:
        """Replace the predictive policy's forecasts (span and burst alike) by ``forecaster``'s (ValueError
        without the predictive policy)."""
        if self.predictive is None:
            raise ValueError(f"a forecaster needs the predictive controller; this one runs {self.policy.name!r}")
        self.predictive.use_forecaster(forecaster)

    def use_params(self, params: PredictiveParams) -> None:
        """Run the predictive policy with ``params`` (the configured ones at construction; an experiment's or a
        test's before :meth:`start`)."""
        self.policy = self.predictive = PredictivePolicy(self, params, self._cost)
        # every window's demand D_k, the last few: the swings the merge stress is sized by
        self.demands = deque(maxlen=max(1, params.merge_stress_windows))
        checks = (params.check_interval_s, params.startup_check_interval_s, params.startup_span_s)
        self.timers = ControllerTimers(self.window_s, self.account, lambda: self.policy.first_arrival, *checks)

    @property
    def params(self) -> PredictiveParams | None:
        """The predictive policy's parameters (None under another policy)."""
        return self.predictive.params if self.predictive is not None else None

    # -- timers and windows ---------------------------------------------------------------------------------
    def start(self, now: float) -> None:
        """Open the first window at ``now``."""
        if self.enabled:
            self.timers.start(now)

    def next_timer(self) -> float:
        """The next instant the controller has work (window end or split check)."""
        return self.timers.next()

    def on_timer(self, now: float, queue_s: QueueS) -> None:
        """Close every window that ended by ``now``; run a due split check otherwise."""
        closed = False
        while self.timers.next_window_end <= now:
            self.end_window(now, queue_s)
            closed = True
        if self.timers.check_due(now) and not closed and self.epochs.current is None:
            self.policy.check(now)

    def capacity(self, composition: dict[int, int] | None = None) -> float:
        """K = Σ_w κ_{C_w} over a composition (default: the current one)."""
        comp = self.lattice.composition() if composition is None else composition
        return sum(self._kappa[c] * n for c, n in comp.items())

    def observe(
        self, predicted_s: float, input_len: int, cached_tokens: int = 0, arrival_s: float | None = None
    ) -> None:
        """A request's first placement in the current window (adds Ê_{i,w_i} to D_k; the policy sees it)."""
        self.account.observe(predicted_s, input_len > self.long_threshold)
        if arrival_s is not None:
            self.policy.observe(arrival_s, input_len, cached_tokens)

    def end_window(self, now: float, queue_s: QueueS) -> WindowReport:
        """Close the window ending at the timers' window end and let the policy decide (not while an operation
        runs: such a window does not count towards persistence)."""
        end = self.timers.close_window()
        r = self.rules
        report = self.account.close(end, self.capacity(), r.theta_low, r.theta_up, r.delta_long)
        self.reports.append(report)
        self.demands.append(report.demand_s)
        if self.epochs.current is not None:
            self.account.busy()
            return report
        self.policy.window_end(report, now, queue_s)
        return report

    # -- decisions (inline, or computed elsewhere) ----------------------------------------------------------
    def request_decision(self, report: WindowReport | None, now: float) -> None:
        """Prepare a predictive decision (``report`` None: a split check). With ``defer_decisions`` the caller
        computes it (:meth:`take_pending` → :meth:`decide` on any thread → :meth:`finish` on the pool's
        thread); otherwise it runs here."""
        if self.pending is not None or self._deciding is not None:
            if report is not None:
                report.reason = "previous decision still being computed"
            return
        assert self.predictive is not None
        job = self.predictive.prepare(report, now)
        if job is None:
            return
        if self.defer_decisions:
            self.pending = job
            return
        self.finish(job, self.decide(job), now)

    def take_pending(self) -> PendingDecision | None:
        """The prepared decision waiting to be computed (None if none); it is then *in flight* until
        :meth:`finish` — no other decision is prepared meanwhile."""
        job, self.pending = self.pending, None
        self._deciding = job
        return job

    def abandon(self, job: PendingDecision) -> None:
        """Forget an in-flight decision that could not be computed (the next window end prepares a new one)."""
        if self._deciding is job:
            self._deciding = None

    def decide(self, job: PendingDecision) -> Verdict:
        """The decision: pure in the prepared snapshot (reads no pool state), so it may run off the pool's thread."""
        assert self.predictive is not None
        return self.predictive.decide(job)

    def finish(self, job: PendingDecision, verdict: Verdict, now: float) -> None:
        """Act on a computed decision — unless the pool changed meanwhile (an operation began or ended, the
        composition moved): then it is dropped as stale (``stale_decisions``). Then tells the observers."""
        if self._deciding is job:
            self._deciding = None
        acted = None
        if self.epochs.current is not None or job.shape != self.shape() or job.inflight != self.inflight():
            self.stale_decisions += 1
        else:
            assert self.predictive is not None
            acted = self.predictive.act(job, verdict, now)
        for observer in self.observers:
            observer(job, verdict, acted)

    def begin_move(self, move: Move, now: float) -> None:
        """Begin every operation of ``move`` (later operations get fresh target ids: the first plan reserved its
        own)."""
        for i, op in enumerate(move.ops):
            if i:
                src = op.sources[0].worker_id
                again = self.lattice.split_of(src) if op.kind == ReconfigKind.SPLIT else self.lattice.merge_of(src)
                assert again is not None
                op = again
            drain = max(self.epochs.scheduler.queue_s(s.worker_id, now) for s in op.sources)
            self.epochs.begin(self.epochs.next_plan(op, drain), now)

    def switch_estimate(self) -> float:
        """What a move's switch is priced at: the mean switch stage of the last :data:`SWITCH_MEMORY` committed
        reconfigurations (the configured ``switch_s`` until one committed)."""
        recent = [r.switch_s for r in self.epochs.records[-SWITCH_MEMORY:]]
        return observed_switch(recent, self.switch_prior)

    def shape(self) -> tuple[tuple[int, int], ...]:
        """The composition's identity (worker id, degree): a decision computed on another one is stale."""
        return tuple(sorted((wid, g.degree) for wid, g in self.lattice.groups.items()))

    def inflight(self) -> tuple[int, ...]:
        """The plans in flight (their epochs): a decision prepared beside other plans is stale too."""
        return tuple(r.plan.epoch for r in self.epochs.inflight)

    # -- moves ------------------------------------------------------------------------------------------------
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
                if demand_s > self.rules.theta_up * merged:
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

    def plan(self, c: Candidate) -> ReconfigPlan:
        """The epoch plan of a chosen candidate (its drain and traffic estimates attached)."""
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
        plan = self.plan(cand)
        self.epochs.begin(plan, now)
        return plan
