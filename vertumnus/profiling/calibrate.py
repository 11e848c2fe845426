"""`vertumnus calibrate`: search the controller and cache thresholds in the simulator.

Two stages within one run budget, each a bounded grid (sampled with a seed when larger than its share):

1. controller: θ_up × θ_low (θ_low < θ_up), cache thresholds as configured;
2. cache: θ_inter × θ_intra × θ_reclaim × decay (θ_reclaim < θ_intra), controller thresholds from stage 1.

Trial 0 is the configuration as given, so the table always shows what the search gained over it. Every trial
runs the full Vertumnus policy (:func:`vertumnus.sim.runner.run_policy`) on the same requests and cost model.
Ranking: fewest incomplete requests (rejected / unfinished count as SLO misses and have no TTFT), then the
objective — ``ttft``: mean TTFT, then token-weighted attainment; ``slo``: attainment, then mean TTFT.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import yaml

from vertumnus.config import VertumnusConfig, config_from_dict
from vertumnus.cost_model import CostModel
from vertumnus.types import Request

OBJECTIVES = ("ttft", "slo")
CONTROLLER_KEYS = ("theta_up", "theta_low")
CACHE_KEYS = ("theta_inter", "theta_intra", "theta_reclaim", "decay")


@dataclass(slots=True)
class CalibrationSpec:
    """The search space and budget. Grids are candidate values per threshold."""

    budget: int = 24
    objective: str = "ttft"
    seed: int = 0
    theta_up: tuple[float, ...] = (0.6, 0.7, 0.8, 0.9, 1.0)
    theta_low: tuple[float, ...] = (0.2, 0.3, 0.4, 0.5)
    theta_inter: tuple[float, ...] = (0.1, 0.5, 2.0)
    theta_intra: tuple[float, ...] = (4.0, 8.0, 16.0)
    theta_reclaim: tuple[float, ...] = (0.25, 0.5, 1.0)
    decay: tuple[float, ...] = (0.3, 0.5, 0.8)

    def __post_init__(self) -> None:
        if self.budget < 2:
            raise ValueError(f"--budget must be ≥ 2 (the given config plus one candidate), got {self.budget}")
        if self.objective not in OBJECTIVES:
            raise ValueError(f"--objective must be one of {', '.join(OBJECTIVES)}, got {self.objective!r}")
        for name in (*CONTROLLER_KEYS, *CACHE_KEYS):
            vals = getattr(self, name)
            if not vals or any(not math.isfinite(v) or v < 0 for v in vals):
                raise ValueError(f"--{name.replace('_', '-')}: need non-negative numbers, got {list(vals)}")
        if any(not 0 < d < 1 for d in self.decay):
            raise ValueError(f"--decay values must lie in (0, 1), got {list(self.decay)}")


@dataclass(slots=True)
class Trial:
    """One simulator run: the thresholds tried and what they gave."""

    index: int
    stage: str  # "given" | "controller" | "cache"
    values: dict[str, float]
    summary: dict[str, Any] = field(default_factory=dict)

    @property
    def incomplete(self) -> int:
        s = self.summary
        return int(s.get("rejected", 0) or 0) + int(s.get("unfinished", 0) or 0) + int(s.get("failed", 0) or 0)

    def key(self, objective: str) -> tuple[float, float, float]:
        ttft = self.summary.get("mean_ttft_s")
        att = self.summary.get("slo_attainment_token_weighted")
        t = math.inf if ttft is None else float(ttft)
        a = -1.0 if att is None else float(att)
        return (self.incomplete, t, -a) if objective == "ttft" else (self.incomplete, -a, t)


def thresholds(cfg: VertumnusConfig) -> dict[str, float]:
    """The six thresholds of a config, by name."""
    out = {k: float(getattr(cfg.controller, k)) for k in CONTROLLER_KEYS}
    out.update({k: float(getattr(cfg.cache, k)) for k in CACHE_KEYS})
    return out


def with_thresholds(cfg: VertumnusConfig, values: dict[str, float]) -> VertumnusConfig:
    """A validated copy of ``cfg`` with ``values`` applied (ConfigError if they break an invariant)."""
    data = cfg.model_dump(mode="json")
    for k, v in values.items():
        data["controller" if k in CONTROLLER_KEYS else "cache"][k] = v
    return config_from_dict(data, "<calibration candidate>")


def _stage_grid(spec: CalibrationSpec, keys: Sequence[str], fixed: dict[str, float]) -> list[dict[str, float]]:
    """Valid combinations of ``keys`` (others from ``fixed``), excluding the fixed point itself."""
    out = []
    for combo in itertools.product(*(getattr(spec, k) for k in keys)):
        vals = {**fixed, **dict(zip(keys, combo, strict=True))}
        if vals["theta_low"] >= vals["theta_up"] or vals["theta_reclaim"] >= vals["theta_intra"]:
            continue
        if vals != fixed:
            out.append(vals)
    return out


def _take(cands: list[dict[str, float]], n: int, rng: np.random.Generator) -> list[dict[str, float]]:
    if len(cands) <= n:
        return cands
    idx = sorted(rng.choice(len(cands), size=n, replace=False).tolist())  # keep grid order in the table
    return [cands[i] for i in idx]


def calibrate(
    requests: Sequence[Request],
    cfg: VertumnusConfig,
    cost: CostModel,
    spec: CalibrationSpec,
    on_trial: Callable[[Trial], None] | None = None,
) -> list[Trial]:
    """Run the two-stage search; returns every trial in run order (trial 0 = the given config)."""
    from vertumnus.sim.runner import run_policy

    if not requests:
        raise ValueError("calibrate: the workload has no requests")
    rng = np.random.default_rng(spec.seed)
    trials: list[Trial] = []

    def run(stage: str, values: dict[str, float]) -> Trial:
        t = Trial(len(trials), stage, values)
        t.summary = run_policy(requests, with_thresholds(cfg, values), cost, "vertumnus").summary
        trials.append(t)
        if on_trial:
            on_trial(t)
        return t

    best = run("given", thresholds(cfg))
    left = spec.budget - 1
    stage1 = _take(_stage_grid(spec, CONTROLLER_KEYS, best.values), (left + 1) // 2, rng)
    for vals in stage1:
        best = min(best, run("controller", vals), key=lambda t: t.key(spec.objective))
    stage2 = _take(_stage_grid(spec, CACHE_KEYS, best.values), spec.budget - len(trials), rng)
    for vals in stage2:
        run("cache", vals)
    return trials


def best_trial(trials: Sequence[Trial], objective: str) -> Trial:
    """The winner by the spec's ranking (earliest on exact ties)."""
    return min(trials, key=lambda t: (t.key(objective), t.index))


def paste_yaml(trial: Trial) -> str:
    """The YAML fragment to paste into a config."""
    v = trial.values
    data = {
        "controller": {k: v[k] for k in CONTROLLER_KEYS},
        "cache": {k: v[k] for k in CACHE_KEYS},
    }
    return yaml.safe_dump(data, sort_keys=False)
