"""The predictive policy's side of the controller: snapshot the pool, hand the snapshot to the pure decision
(:func:`vertumnus.controller.predictive.decide`), and act on its verdict (persistence included)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from vertumnus.controller.forecast import ArrivalLog, BurstForecaster, Forecaster, SpanForecaster
from vertumnus.controller.params import PredictiveParams
from vertumnus.controller.predictive import PendingDecision, Verdict, decide
from vertumnus.controller.rules import Direction, WindowReport
from vertumnus.controller.scoring import Move, ReplayModel, observed_stress, worker_states
from vertumnus.cost_model import CostModel
from vertumnus.types import ReconfigKind, WorkerState

if TYPE_CHECKING:
    from vertumnus.controller.controller import Controller

_DIRECTION = {None: Direction.NONE, ReconfigKind.SPLIT: Direction.SPLIT, ReconfigKind.MERGE: Direction.MERGE}


class PredictivePolicy:
    """Window ends decide splits and merges, split checks between them decide splits (``controller.policy:
    predictive``); the shell (:class:`~vertumnus.controller.controller.Controller`) runs the decision inline
    or off the pool's thread."""

    name = "predictive"

    def __init__(self, ctl: Controller, params: PredictiveParams, cost: CostModel) -> None:
        self.ctl = ctl
        self.params = params
        self.model = ReplayModel(cost, params.degrees, params.beta, params.lam)
        self.log = ArrivalLog(params.span_s, params.min_forecast_requests)
        self.span_forecast: Forecaster = SpanForecaster(self.log, params.span_s, params.min_forecast_requests)
        self.burst_forecast: Forecaster = BurstForecaster(self.log, params.burst_span_s, params.span_s)

    @property
    def first_arrival(self) -> float | None:
        return self.log.origin

    def use_forecaster(self, forecaster: Forecaster) -> None:
        """Replace both forecasts (span and burst) by ``forecaster``'s."""
        self.span_forecast = self.burst_forecast = forecaster

    def observe(self, arrival_s: float, input_len: int, cached_tokens: int) -> None:
        self.log.add(arrival_s, input_len, cached_tokens)

    def window_end(self, report: WindowReport, now: float, queue_s: Callable[[int], float]) -> None:
        self.ctl.request_decision(report, now)

    def check(self, now: float) -> None:
        """A between-windows split check, skipped when no ACTIVE worker can split (it could only say stay)."""
        state = self.ctl.epochs.scheduler.state
        split_of = self.ctl.lattice.split_of
        if any(state(wid) == WorkerState.ACTIVE and split_of(wid) is not None for wid in self.ctl.lattice.groups):
            self.ctl.request_decision(None, now)

    def too_young(self, now: float) -> bool:
        """The forecast is drawn from the arrivals seen, the first came less than a span ago, fewer than
        ``min_forecast_requests`` arrived and none is waiting: too little to forecast from (a young log's forecast
        would tile a second's handful of requests over the span; a waiting request is evidence of its own)."""
        p = self.params
        if not self.span_forecast.needs_history or not self.log.too_young(now, p.span_s, p.min_forecast_requests):
            return False
        sched = self.ctl.epochs.scheduler
        return not any(sched.waiting_at(wid) for wid in self.ctl.lattice.groups)

    def prepare(self, report: WindowReport | None, now: float) -> PendingDecision | None:
        """The decision's snapshot (None: too young to forecast, said in the report)."""
        if self.too_young(now):
            if report is not None:
                report.reason = "too few arrivals seen yet to forecast"
            return None
        ctl, sched = self.ctl, self.ctl.epochs.scheduler
        kinds = (ReconfigKind.SPLIT,) if report is None else (ReconfigKind.SPLIT, ReconfigKind.MERGE)
        ops = {
            kind: [
                c.op
                for c in sorted(
                    ctl.candidates(kind, 0.0, lambda w: sched.queue_s(w, now), admit=False),
                    key=lambda c: (c.drain_s, c.op.sources[0].worker_id),
                )
            ]
            for kind in kinds  # a between-windows check scores splits only: no merge candidates to build
        }
        arrivals = self.model.arrivals(self.span_forecast(now))
        same = self.burst_forecast is self.span_forecast  # one forecast for both: replayed read-only, shared
        burst = arrivals if same else self.model.arrivals(self.burst_forecast(now))
        stress = None
        if report is not None and self.params.merge_stress_windows > 0:
            stress = observed_stress(ctl.demands, self.params.span_windows, self.params.merge_stress_max)
        origin = self.log.origin
        return PendingDecision(
            report=report, now=now, model=self.model, workers=worker_states(sched, ctl.lattice, now),
            arrivals=arrivals, burst=burst, ops=ops, shape=ctl.shape(), inflight=ctl.inflight(),
            merge_stress=stress, switch_s=ctl.switch_estimate(), age_s=now - origin if origin is not None else 0.0,
        )  # fmt: skip

    def decide(self, job: PendingDecision) -> Verdict:
        return decide(job, self.params)

    def act(self, job: PendingDecision, verdict: Verdict, now: float) -> Move | None:
        """Begin the verdict's move once it has persisted (a split at once, a merge ``merge_persist_s`` of window
        ends in a row): the move begun, or None."""
        ctl = self.ctl
        direction = _DIRECTION[verdict.want]
        report = job.report
        if report is None:  # a check acts on a split only
            if direction != Direction.SPLIT:
                return None
            report = ctl.account.check_report(now, verdict.reason)
            report.trail = verdict.trail
            ctl.reports.append(report)
        else:
            report.signal, report.reason, report.trail = direction, verdict.reason, verdict.trail
            persist = 1 if direction == Direction.SPLIT else self.params.merge_persist_windows
            if not ctl.account.persist(report, direction, persist):
                ctl.last_decision = verdict
                return None
        ctl.last_decision = verdict
        assert verdict.move is not None and verdict.move.ops
        ctl.account.acted(report)
        ctl.begin_move(verdict.move, now)
        return verdict.move
