"""The verdict of one workload (best fixed in hindsight, per-phase oracle, ratios, done-when flags) and the result
of a whole set; pure arithmetic on :class:`~vertumnus.eval.digest.RunDigest` s (see :mod:`vertumnus.eval.evaluate`)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from vertumnus.eval.digest import LOST_KEYS, RunDigest, geometric_mean, json_finite, num
from vertumnus.eval.fmt import ratio

MEAN_VS_BEST = 1.00  # done when: whole-run mean TTFT ≤ 1.00× the best fixed composition's
MEAN_VS_START = 1.02  # ... and ≤ 1.02× the start composition held fixed
Overrides = tuple[tuple[str, Any], ...]  # (dotted config key, value): e.g. (("controller.rules.theta_up", 0.7),)


@dataclass(slots=True)
class PhaseOracle:
    """One phase: the policy against the best fixed composition of that phase."""

    phase: int
    label: str
    requests: int
    policy_mean: float
    best: str
    best_mean: float

    @property
    def ratio(self) -> float:
        if self.requests == 0:
            return math.nan  # an empty phase (load 0) has no verdict
        return ratio(self.policy_mean, self.best_mean)


@dataclass(slots=True)
class Verdict:
    """Derived figures of one workload (see the module docstring)."""

    best_fixed: str
    best_mean: float
    start: str
    start_mean: float
    oracle_mean: float
    ratio_best: float
    ratio_start: float
    ratio_oracle: float
    phases: list[PhaseOracle]
    flags: dict[str, bool]
    prescient_mean: float = math.nan  # the prescient start's mean TTFT (nan: not run)
    prescient_ratio: float = math.nan  # ... ÷ the best fixed composition's
    # Per request stream k: the policy's mean TTFT on stream k ÷ the best fixed composition's (the one chosen on
    # the means) on the same stream k — paired, since both ran the same requests. Empty: stream counts differ.
    stream_ratios: tuple[float, ...] = ()
    clairvoyant_mean: float = math.nan  # the clairvoyant controller's mean TTFT (nan: not run)
    clairvoyant_ratio: float = math.nan  # ... ÷ the best fixed composition's

    @property
    def passed(self) -> bool:
        return all(self.flags.values())


def best_fixed(fixed: Mapping[str, RunDigest]) -> str:
    """The fixed composition with the lowest whole-run mean TTFT (ties: name)."""
    return min(fixed, key=lambda n: (fixed[n].mean, n))


def derive(
    policy: RunDigest,
    fixed: Mapping[str, RunDigest],
    start: str,
    labels: Sequence[str] | None = None,
    prescient: RunDigest | None = None,
    clairvoyant: RunDigest | None = None,
) -> Verdict:
    """Best fixed, per-phase oracle, ratios and done-when flags from the per-run numbers alone; ``prescient``:
    the prescient start's run (None: not run, or — when the start is the best fixed composition — that run);
    ``clairvoyant``: the clairvoyant controller's run (None: not run)."""
    if start not in fixed:
        raise ValueError(f"start composition {start} has no fixed run (have {sorted(fixed)})")
    best_name = best_fixed(fixed)
    best = fixed[best_name]
    phases: list[PhaseOracle] = []
    total_n, weighted = 0, 0.0
    for k, ph in enumerate(policy.phases):
        means = {n: num(r.phases[k].get("mean_ttft_s")) for n, r in fixed.items()}
        name = min(means, key=lambda n: (means[n], n))
        n_req = int(ph.get("requests", 0))
        phases.append(PhaseOracle(k, labels[k] if labels else str(k), n_req, num(ph.get("mean_ttft_s")), name,
                                  means[name]))  # fmt: skip
        if n_req:
            total_n += n_req
            weighted += n_req * means[name]
    oracle = weighted / total_n if total_n else math.nan
    start_mean = fixed[start].mean
    flags = {
        "mean<=best": policy.mean <= MEAN_VS_BEST * best.mean,
        "mean<=1.02*start": policy.mean <= MEAN_VS_START * start_mean,
        "p90<=best": policy.p90 <= best.p90,
        "slo>=best": policy.slo >= best.slo,
        "lost==0": policy.lost == 0,
    }
    if prescient is None and start == best_name:
        prescient = best  # already there: nothing to move
    pre = prescient.mean if prescient is not None else math.nan
    ps, bs = policy.per_stream, best.per_stream
    streams = tuple(ratio(a, b) for a, b in zip(ps, bs, strict=True)) if len(ps) == len(bs) else ()
    clv = clairvoyant.mean if clairvoyant is not None else math.nan
    return Verdict(best_name, best.mean, start, start_mean, oracle, ratio(policy.mean, best.mean),
                   ratio(policy.mean, start_mean), ratio(policy.mean, oracle), phases, flags, pre,
                   ratio(pre, best.mean) if prescient is not None else math.nan, streams, clv,
                   ratio(clv, best.mean) if clairvoyant is not None else math.nan)  # fmt: skip


@dataclass(slots=True)
class WorkloadResult:
    """One workload: its layout, the policy's run, every fixed run and the verdict."""

    name: str
    pattern: str
    start: str
    requests: int
    duration_s: float
    phases: list[dict[str, Any]]  # label, bounds, load, long share, req/s
    policy: RunDigest
    fixed: dict[str, RunDigest]
    verdict: Verdict


@dataclass(slots=True)
class EvalResult:
    """A whole set under one config."""

    set_name: str
    set_source: str
    config: str
    profile: str
    policy: str
    overrides: Overrides
    workloads: list[WorkloadResult] = field(default_factory=list)
    replicates: int = 1  # request streams each figure is the mean over

    def geomean(self, attr: str) -> float:
        """Geometric mean of a verdict ratio over the workloads (``ratio_best``, ``ratio_start``, ...)."""
        return geometric_mean([getattr(w.verdict, attr) for w in self.workloads])

    def stream_geomeans(self) -> tuple[float, ...]:
        """Per request stream k, the geometric mean over the workloads of ``Verdict.stream_ratios[k]`` — the
        spread of the headline ``geomean("ratio_best")`` across the streams; empty where a workload lacks them."""
        per = [w.verdict.stream_ratios for w in self.workloads]
        if not per or any(len(r) != len(per[0]) or not r for r in per):
            return ()
        return tuple(geometric_mean([r[k] for r in per]) for k in range(len(per[0])))

    @property
    def passed(self) -> int:
        return sum(w.verdict.passed for w in self.workloads)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "set": self.set_name, "set_source": self.set_source, "config": self.config, "profile": self.profile,
            "policy": self.policy, "overrides": dict(self.overrides), "replicates": self.replicates,
            "geomean_ratio_best": self.geomean("ratio_best"), "geomean_ratio_start": self.geomean("ratio_start"),
            "geomean_ratio_oracle": self.geomean("ratio_oracle"),
            "geomean_clairvoyant_ratio": self.geomean("clairvoyant_ratio"),
            "geomean_ratio_best_per_stream": list(self.stream_geomeans()),
            "passed": self.passed, "workloads": [],
        }  # fmt: skip
        for w in self.workloads:
            d = asdict(w)
            d["verdict"]["passed"] = w.verdict.passed
            d["policy"]["lost"] = w.policy.lost
            for r in d["fixed"].values():
                r["lost"] = sum(r["summary"].get(k) or 0 for k in LOST_KEYS)
            out["workloads"].append(d)
        return json_finite(out)
