"""What the evaluation keeps of a run (:class:`RunDigest`), the mean over request streams, and the arithmetic
on those figures (geometric means, JSON without infinities)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from vertumnus.eval.protocol import mean_of_runs

SUMMARY_KEYS = (
    "requests", "completed", "mean_ttft_s", "p50_ttft_s", "p90_ttft_s", "p99_ttft_s", "max_ttft_s",
    "slo_attainment_token_weighted", "slo_attainment", "prefix_hit_rate_tokens", "rejected", "failed", "unfinished",
    "reconfigurations", "splits", "merges", "replications", "reclamations", "initial_composition",
    "final_composition", "sim_wall_s", "sim_cpu_s",
)  # fmt: skip
PHASE_KEYS = ("requests", "completed", "mean_ttft_s", "p90_ttft_s", "slo_attainment_token_weighted")


@dataclass(slots=True)
class RunDigest:
    """What the evaluation keeps of one run."""

    policy: str
    composition: str  # the start (or fixed) composition
    summary: dict[str, Any]
    phases: list[dict[str, Any]]  # PHASE_KEYS per phase
    # Whole-run mean TTFT of each request stream the digest folds (:func:`mean_digest`); empty for one run.
    stream_means: tuple[float, ...] = ()

    @property
    def per_stream(self) -> tuple[float, ...]:
        """Mean TTFT per request stream (inf: a stream that completed nothing); one run: its own mean."""
        return self.stream_means or (self.mean,)

    @property
    def lost(self) -> int:
        s = self.summary
        return int(sum(s.get(k) or 0 for k in LOST_KEYS))

    @property
    def mean(self) -> float:
        return num(self.summary.get("mean_ttft_s"))

    @property
    def p90(self) -> float:
        return num(self.summary.get("p90_ttft_s"))

    @property
    def slo(self) -> float:
        v = self.summary.get("slo_attainment_token_weighted")
        return 0.0 if v is None else float(v)


LOST_KEYS = ("rejected", "failed", "unfinished")


def mean_digest(runs: Sequence[RunDigest]) -> RunDigest:
    """One digest for the replicate runs of one (workload, policy, composition).

    Each numeric figure is its mean over the runs; request counts and lost requests (rejected, failed,
    unfinished) are sums, so nothing lost on any stream disappears in a mean; a figure some run lacks (no
    completed request) is None; text (compositions) is the first run's. ``summary["replicates"]`` = len(runs);
    ``stream_means`` keeps each run's mean TTFT in order, for the per-stream (paired) ratios."""
    if not runs:
        raise ValueError("mean_digest needs at least one run")
    first = runs[0]
    if any(len(r.phases) != len(first.phases) for r in runs):
        raise ValueError("replicate runs have different phase counts")
    counts = ("requests", "completed", *LOST_KEYS)
    summary = {**mean_of_runs([r.summary for r in runs], counts), "replicates": len(runs)}
    phases = [mean_of_runs([r.phases[k] for r in runs], counts) for k in range(len(first.phases))]
    streams = tuple(m for r in runs for m in r.per_stream)
    return RunDigest(first.policy, first.composition, summary, phases, streams)


def num(v: Any) -> float:
    """A TTFT statistic; no completed request at all counts as infinitely slow."""
    return math.inf if v is None else float(v)


def geometric_mean(vals: Sequence[float]) -> float:
    """Geometric mean of positive ratios; inf when there are none, or one is not positive or infinite."""
    if not vals or any(not (v > 0) or math.isinf(v) for v in vals):
        return math.inf
    return math.exp(sum(math.log(v) for v in vals) / len(vals))


def json_finite(x: Any) -> Any:
    """``x`` for JSON, which has no infinity: inf / nan become None (in dicts, lists and tuples too)."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: json_finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_finite(v) for v in x]
    return x
