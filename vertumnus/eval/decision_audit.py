"""Decision audit (simulation only): the predictive controller's forecasts and moves against what followed.

At every predictive decision the controller replays a *forecast* (the recent arrivals, see
:class:`~vertumnus.controller.predictive.ArrivalLog`) on each candidate move. After the run the simulator knows
the arrivals that actually came, so each decision can be re-scored with the same model, from the same snapshot
(queues, running prefills, candidate moves), on the *true* next span instead::

    decision at t ──►  forecast  = what the controller replayed (the past span, re-based to t)
                       truth     = the run's own arrivals in [t, t + span), each with the prefix it found
                       score     = the controller's replay (ReplayModel.score) of stay and of every move

and two questions answered per run:

- how far off is the forecast? — forecast work / true work (Σ Ê at the smallest degree), by pool age: a young
  pool's forecast tiles its first seconds (cold caches, a handful of requests), a warm one samples the last span;
- were the moves right? — a move begun is *endorsed* when the truth scores it below stay, *refuted* otherwise;
  a decision that began nothing *missed* a move when the truth scores a split more than ``split_margin`` (a merge
  more than ``merge_margin``) below stay — the margins the controller itself asks of its forecast. (A decision
  the controller dropped as stale, the pool having changed while it was computed, counts as one that began
  nothing.)

The truth uses the prefixes the requests found in this run (after the moves the run made) and the replay's model,
so it audits the forecast, not the model (the model is checked against the simulator elsewhere: configs/eval/
tuning.yaml's header). Decisions whose true span runs past the last arrival are left out (their truth is cut).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

from vertumnus.config import VertumnusConfig
from vertumnus.controller.params import PredictiveParams
from vertumnus.controller.predictive import PendingDecision, Verdict
from vertumnus.controller.replay import ReplayArrivals
from vertumnus.controller.scoring import Move
from vertumnus.cost_model import CostModel
from vertumnus.sim.runner import RunResult, Simulation
from vertumnus.types import Request

AGE_BUCKETS_S: tuple[tuple[float, float], ...] = ((0, 5), (5, 10), (10, 20), (20, 40), (40, math.inf))


@dataclass(slots=True)
class AuditedDecision:
    """One predictive decision, re-scored on the arrivals that followed it."""

    age_s: float  # seconds since the run's first arrival
    window: bool  # a window end (splits and merges) or a between-windows split check
    acted: str | None  # the move it began (Move.describe), None: it began nothing
    gate: str  # the gate that decided (Verdict.gate)
    trail: list[dict[str, object]]  # every check the decision consulted (Verdict.trail)
    reason: str  # the controller's own account of the decision (Verdict.reason)
    forecast_work_s: float  # Σ Ê at the smallest degree of the forecast it replayed
    true_work_s: float  # ... of the arrivals that followed, per forecast span (scaled when the audit's span differs)
    forecast_stay_s: float  # replayed mean TTFT of staying on the forecast itself (1x its rate, no spread)
    forecast_acted_s: float | None  # ... of the move it began
    true_stay_s: float  # replayed mean TTFT of staying, on the truth
    true_acted_s: float | None  # ... of the move it began
    true_best: str  # the candidate the truth scores lowest ("stay" included)
    true_best_s: float
    true_best_kind: str | None  # "split" / "merge"; None: stay

    @property
    def endorsed(self) -> bool:
        """A move begun that the truth scores below staying."""
        return self.true_acted_s is not None and self.true_acted_s < self.true_stay_s

    @property
    def work_ratio(self) -> float:
        return self.forecast_work_s / self.true_work_s if self.true_work_s > 0 else math.nan


@dataclass(slots=True)
class AgeBucket:
    """Forecast work / true work over the decisions taken at pool ages in [lo, hi)."""

    lo_s: float
    hi_s: float
    decisions: int
    median: float
    p25: float
    p75: float


@dataclass(slots=True)
class AuditReport:
    """A run's audited decisions and their summary."""

    span_s: float
    split_margin: float
    merge_margin: float
    decisions: list[AuditedDecision]
    skipped: int  # decisions whose true span ran past the last arrival
    operations_begun: int  # operations of every move begun, skipped decisions included (= the run's plans)
    run: RunResult
    buckets: list[AgeBucket] = field(default_factory=list)

    @property
    def moves(self) -> list[AuditedDecision]:
        return [d for d in self.decisions if d.acted is not None]

    @property
    def endorsed(self) -> int:
        """Moves begun that the truth scores below staying."""
        return sum(1 for d in self.moves if d.endorsed)

    def missed(self, kind: str) -> int:
        """Decisions that began nothing where the truth scores a ``kind`` ("split" / "merge") move more than that
        kind's margin below stay."""
        margin = self.split_margin if kind == "split" else self.merge_margin
        return sum(
            1
            for d in self.decisions
            if d.acted is None and d.true_best_kind == kind and d.true_best_s < (1.0 - margin) * d.true_stay_s
        )


class _Recorder:
    """A controller decision observer: keeps every (snapshot, verdict, move begun)."""

    def __init__(self) -> None:
        self.records: list[tuple[PendingDecision, Verdict, Move | None]] = []

    def __call__(self, job: PendingDecision, verdict: Verdict, acted: Move | None) -> None:
        self.records.append((job, verdict, acted))


def age_buckets(decisions: Sequence[AuditedDecision]) -> list[AgeBucket]:
    """Median and quartiles of forecast work / true work per pool-age bucket (empty buckets left out)."""
    out: list[AgeBucket] = []
    for lo, hi in AGE_BUCKETS_S:
        r = np.array([d.work_ratio for d in decisions if lo <= d.age_s < hi and math.isfinite(d.work_ratio)])
        if len(r):
            p25, med, p75 = (float(x) for x in np.percentile(r, [25, 50, 75]))
            out.append(AgeBucket(lo, hi, len(r), med, p25, p75))
    return out


def audit_run(
    requests: Sequence[Request],
    cfg: VertumnusConfig,
    cost: CostModel,
    composition: str | None = None,
    span_s: float | None = None,
) -> AuditReport:
    """Run the ``vertumnus`` policy (``controller.policy: predictive``) from ``composition`` and audit every
    decision it computed (ValueError for another controller policy). ``span_s``: how much of what followed each
    decision to score (default: the controller's own forecast span; a longer one shows what a move paid later)."""
    if cfg.controller.policy != "predictive":
        raise ValueError(f"the decision audit needs controller.policy: predictive, not {cfg.controller.policy!r}")
    if not requests:
        raise ValueError("the decision audit needs at least one request")
    if span_s is not None and not span_s > 0:
        raise ValueError(f"the audit span must be > 0 s, got {span_s}")
    sim = Simulation(requests, cfg, cost, "vertumnus", composition)
    ctrl = sim.pool.controller
    params = ctrl.params
    assert params is not None
    recorder = _Recorder()
    ctrl.add_observer(recorder)
    run = sim.run()
    a = run.arrays
    t, lengths, cached = a["arrival"], a["input_len"], a["cached"]  # arrival order
    span = params.span_s if span_s is None else span_s
    c_min = min(params.degrees)
    first, last = float(t[0]), float(t[-1])
    audited: list[AuditedDecision] = []
    skipped = 0
    for job, verdict, acted in recorder.records:
        if job.now + span > last:
            skipped += 1
            continue
        lo, hi = np.searchsorted(t, job.now, "left"), np.searchsorted(t, job.now + span, "left")
        offsets = (t[lo:hi] - job.now).tolist()
        truth = job.model.arrivals(list(zip(offsets, lengths[lo:hi].tolist(), cached[lo:hi].tolist(), strict=True)))
        audited.append(_audit_one(params, job, verdict, acted, truth, c_min, first, params.span_s / span))
    begun = sum(len(acted.ops) for _, _, acted in recorder.records if acted is not None)
    report = AuditReport(span, params.split_margin, params.merge_margin, audited, skipped, begun, run)
    report.buckets = age_buckets(audited)
    return report


def _audit_one(
    params: PredictiveParams,
    job: PendingDecision,
    verdict: Verdict,
    acted: Move | None,
    truth: ReplayArrivals,
    c_min: int,
    first: float,
    work_scale: float,
) -> AuditedDecision:
    model = job.model
    prep = model.prepare(job.workers, job.switch_s)
    moves = model.moves(job.ops, params.max_concurrent_splits, params.max_concurrent_merges)
    scored = [(model.score(m, prep, truth), m) for m in moves]
    stay_s = scored[0][0]  # moves() lists stay first
    best_s, best = min(scored, key=lambda x: x[0])  # ties: the first listed (stay)
    acted_s = None if acted is None else model.score(acted, prep, truth)
    forecast_acted_s = None if acted is None else model.score(acted, prep, job.arrivals)
    return AuditedDecision(
        age_s=job.now - first,
        window=job.report is not None,
        acted=None if acted is None else acted.describe(),
        gate=verdict.gate,
        trail=[asdict(c) for c in verdict.trail],
        reason=verdict.reason,
        forecast_work_s=float(job.arrivals.est[c_min].sum()) if len(job.arrivals) else 0.0,
        true_work_s=float(truth.est[c_min].sum()) * work_scale if len(truth) else 0.0,
        forecast_stay_s=model.score(scored[0][1], prep, job.arrivals),
        forecast_acted_s=forecast_acted_s,
        true_stay_s=stay_s,
        true_acted_s=acted_s,
        true_best=best.describe(),
        true_best_s=best_s,
        true_best_kind=None if best.kind is None else best.kind.name.lower(),
    )


def gate_counts(decisions: Sequence[AuditedDecision]) -> dict[str, int]:
    """How many decisions each gate decided (Verdict.gate), most first."""
    counts: dict[str, int] = {}
    for d in decisions:
        counts[d.gate] = counts.get(d.gate, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def format_report(name: str, report: AuditReport, moves: bool = False) -> str:
    """The audit of one run as text: forecast error by pool age, moves endorsed / refuted, moves missed."""
    lines = [
        f"{name}: {len(report.decisions)} decisions audited ({report.skipped} whose next {report.span_s:g} s ran"
        f" past the last arrival left out), mean TTFT {report.run.summary['mean_ttft_s']:.3f} s,"
        f" {len(report.moves)} moves begun",
        "  forecast work / work that followed, per second (median, interquartile range, decisions) by pool age:",
    ]
    for b in report.buckets:
        hi = "end" if math.isinf(b.hi_s) else f"{b.hi_s:g} s"
        lines.append(f"    [{b.lo_s:g} s, {hi}): {b.median:.2f} ({b.p25:.2f}-{b.p75:.2f}, {b.decisions})")
    lines.append(
        f"  on the arrivals that followed: {report.endorsed} of {len(report.moves)} moves beat staying;"
        f" stays where a split would have won by split_margin {report.missed('split')},"
        f" a merge by merge_margin {report.missed('merge')}"
    )
    lines.append("  decided by: " + ", ".join(f"{g} {n}" for g, n in gate_counts(report.decisions).items()))
    if moves:
        for d in report.moves:
            verdict = "beat staying" if d.endorsed else "lost to staying"
            lines.append(
                f"    {d.age_s:8.2f} s {'window' if d.window else 'check '} {d.acted}: {d.true_acted_s:.3f} s vs stay"
                f" {d.true_stay_s:.3f} s ({verdict}); on its forecast at 1x {d.forecast_acted_s:.3f} vs"
                f" {d.forecast_stay_s:.3f} s, forecast work {d.work_ratio:.2f}x — {d.reason}"
            )
    return "\n".join(lines) + "\n"


def report_json(report: AuditReport) -> dict[str, object]:
    """A JSON-ready summary and every audited decision."""
    return {
        "span_s": report.span_s,
        "skipped": report.skipped,
        "mean_ttft_s": report.run.summary["mean_ttft_s"],
        "moves": len(report.moves),
        "endorsed": report.endorsed,
        "missed_splits": report.missed("split"),
        "missed_merges": report.missed("merge"),
        "gates": gate_counts(report.decisions),
        "buckets": [{**asdict(b), "hi_s": None if math.isinf(b.hi_s) else b.hi_s} for b in report.buckets],
        "decisions": [asdict(d) for d in report.decisions],
    }
