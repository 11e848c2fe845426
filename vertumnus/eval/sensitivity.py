"""Sensitivity of a set's verdict to the controller's thresholds, one threshold varied at a time.

For each (key, value) the policy reruns every workload of the set with only that key changed; the fixed
compositions are run once (``vertumnus-static`` turns the controller off, so ``controller.*`` keys cannot
change them; any other key reruns them too). The verdict per point is the geometric mean over the workloads of
the policy's mean TTFT ÷ the best fixed composition's (and ÷ its start held fixed) plus how many workloads meet
every done-when criterion. A value the config rejects (e.g. θ_low ≥ θ_up) is reported and skipped.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from vertumnus.config import ControllerConfig, PredictiveConfig, RulesConfig, VertumnusConfig, whole_windows
from vertumnus.config.renamed import RENAMED
from vertumnus.eval.evaluate import assemble, run_clairvoyant, run_prescient
from vertumnus.eval.tasks import Task, apply_overrides, fixed_tasks, merge_replicates, plan, policy_tasks, run_tasks
from vertumnus.eval.verdict import EvalResult, Overrides

# Not thresholds of the decision: the long-request class defines the workload, switch_s prices a simulated
# hardware time until it is observed.
NOT_THRESHOLDS = frozenset({"controller.rules.long_threshold_tokens", "controller.predictive.switch_s"})
# Horizons the controller counts in windows: swept a whole window at a time (any other value is a config error).
WINDOW_KEYS = frozenset({"controller.predictive.merge_persist_s", "controller.predictive.merge_stress_memory_s"})
FLOAT_STEPS = (0.8, 0.9, 1.0, 1.1, 1.2)
INT_STEPS = (-1, 0, 1, 2)
_SECTIONS: dict[str, type[RulesConfig] | type[PredictiveConfig]] = {
    "rules": RulesConfig,
    "predictive": PredictiveConfig,
}


def controller_thresholds(cfg: VertumnusConfig) -> list[str]:
    """``controller.window_s`` and every numeric field of the configured policy's section except
    :data:`NOT_THRESHOLDS` (new knobs included); the other policy's section is not read, so not swept."""
    policy = cfg.controller.policy
    section = getattr(cfg.controller, policy)
    out = ["controller.window_s"]
    for name in _SECTIONS[policy].model_fields:
        key, v = f"controller.{policy}.{name}", getattr(section, name)
        if key in NOT_THRESHOLDS or isinstance(v, bool) or not isinstance(v, (int, float)):
            continue
        out.append(key)
    return out


def around(
    value: float | int, float_steps: Sequence[float] = FLOAT_STEPS, int_steps: Sequence[int] = INT_STEPS
) -> list[float | int]:
    """Grid around a config value: ×0.8..×1.2 for floats, −1..+2 for small integers (≥ 1) by default; integers
    of 8 or more step like floats (rounded), so a count of 32 moves by more than ±1."""
    if isinstance(value, int) and value >= 8:
        return sorted({max(1, round(value * f)) for f in float_steps})
    if isinstance(value, int):
        return sorted({max(1, value + d) for d in int_steps})
    return sorted({round(value * f, 4) for f in float_steps})


def _around_key(
    cfg: VertumnusConfig, key: str, float_steps: Sequence[float], int_steps: Sequence[int]
) -> list[float | int]:
    """:func:`around` the config's value of ``key``; a horizon of :data:`WINDOW_KEYS` moves in whole windows."""
    value = _get(cfg, key)
    w = cfg.controller.window_s
    if key in WINDOW_KEYS and (n := whole_windows(value, w)):
        return [float(w * k) for k in around(n, float_steps, int_steps)]
    return around(value, float_steps, int_steps)


def _key(name: str) -> str:
    """A sweep key as a full dotted key: ``predictive.split_margin`` and ``window_s`` are ``controller.`` keys; a
    key of the former flat controller section names where it went."""
    head = name.split(".", 1)[0]
    if head in ControllerConfig.model_fields:
        return f"controller.{name}"
    if "." not in name and name in RENAMED:
        raise ValueError(f"--sweep {name}: {RENAMED[name]} (sweep keys below controller drop the 'controller.')")
    return name if "." in name else f"controller.{name}"


def _get(cfg: VertumnusConfig, key: str) -> Any:
    node: Any = cfg
    for part in key.split("."):
        if not hasattr(node, part):
            raise ValueError(f"unknown config key {key!r}")
        node = getattr(node, part)
    return node


def _read_by_policy(cfg: VertumnusConfig, key: str) -> None:
    """Refuse a key of the policy section the config does not run (varying it would rerun the policy unchanged)."""
    policy = cfg.controller.policy
    for other in _SECTIONS:
        if other != policy and key.startswith(f"controller.{other}."):
            raise ValueError(f"--sweep {key}: read only by controller.policy {other} (the config runs {policy})")


def parse_sweep(
    specs: Sequence[str],
    cfg: VertumnusConfig,
    float_steps: Sequence[float] = FLOAT_STEPS,
    int_steps: Sequence[int] = INT_STEPS,
) -> dict[str, list[Any]]:
    """``["predictive.split_margin=0.01,0.03", "predictive.merge_persist_s"]`` → grid; a bare key (or ``auto``
    for every threshold of the configured policy) gets :func:`around` its config value. Keys below ``controller``
    (``rules.*``, ``predictive.*``, ``window_s``) may drop the ``controller.``."""
    grid: dict[str, list[Any]] = {}
    for spec in specs:
        if spec.strip() == "auto":
            for k in controller_thresholds(cfg):
                grid[k] = _around_key(cfg, k, float_steps, int_steps)
            continue
        name, sep, values = spec.partition("=")
        key = _key(name.strip())
        base = _get(cfg, key)
        if isinstance(base, bool) or not isinstance(base, (int, float)):
            raise ValueError(f"--sweep {key}: only numeric keys can be swept (it is {base!r})")
        _read_by_policy(cfg, key)
        if not sep:
            grid[key] = _around_key(cfg, key, float_steps, int_steps)
            continue
        try:
            kind = int if isinstance(base, int) else float
            grid[key] = [kind(v) for v in values.split(",") if v.strip()]
        except ValueError:
            raise ValueError(f"bad --sweep {spec!r}; expected KEY=V1,V2,... with numbers") from None
        if not grid[key]:
            raise ValueError(f"bad --sweep {spec!r}: no values")
    return grid


@dataclass(slots=True)
class SweepResult:
    base: EvalResult
    points: list[dict[str, Any]] = field(default_factory=list)  # key, value, is_base, ratio_best, ... or note
    results: dict[tuple[str, Any], EvalResult] = field(default_factory=dict)


def _point(key: str, value: Any, base_value: Any, res: EvalResult | None, note: str = "") -> dict[str, Any]:
    p: dict[str, Any] = {"key": key, "value": value, "is_base": value == base_value, "note": note}
    if res is not None:
        p.update({"ratio_best": res.geomean("ratio_best"), "ratio_start": res.geomean("ratio_start"),
                  "ratio_oracle": res.geomean("ratio_oracle"), "passed": res.passed,
                  "workloads": len(res.workloads)})  # fmt: skip
    return p


def sweep(
    set_path: str,
    config: str,
    grid: Mapping[str, Sequence[Any]],
    policy: str = "vertumnus",
    start: str | None = None,
    jobs: int = 1,
    progress: Callable[[int, int, Task], None] | None = None,
    workloads: Sequence[str] | None = None,
    replicates: int | None = None,
) -> SweepResult:
    """Run the sweep (see the module docstring); the config's own values are always included as the base.
    ``workloads``: only these workloads of the set (a quick look; the verdict is over the set's workloads);
    ``replicates``: request streams per run instead of the set's."""
    p = plan(set_path, config, policy, start, workloads, replicates)
    base_values = {k: _get(p.cfg, k) for k in grid}
    settings: list[tuple[str, Any, Overrides]] = []
    notes: list[tuple[str, Any, str]] = []
    for key, values in grid.items():
        for v in values:
            if v == base_values[key]:
                continue
            ov: Overrides = ((key, v),)
            try:
                apply_overrides(p.cfg, ov)
            except ValueError as e:
                notes.append((key, v, str(e)))
                continue
            settings.append((key, v, ov))
    tagged: list[tuple[bool, Task]] = [(False, t) for t in fixed_tasks(p, set_path, config)]
    tagged += [(True, t) for t in policy_tasks(p, set_path, config, policy)]
    for key, _, ov in settings:
        if not key.startswith("controller."):
            tagged += [(False, replace(t, overrides=ov)) for t in fixed_tasks(p, set_path, config)]
        tagged += [(True, t) for t in policy_tasks(p, set_path, config, policy, ov)]
    order = {n: i for i, n in enumerate(p.workloads)}
    # stable: a workload's runs on one stream together (workers cache two streams)
    tagged.sort(key=lambda x: (order[x[1].workload], x[1].replicate))
    tasks = [t for _, t in tagged]
    merged = merge_replicates(dict(zip(tasks, run_tasks(tasks, jobs, progress), strict=True)))
    fixed: dict[Overrides, dict[tuple[str, str], Any]] = {}
    pol: dict[Overrides, dict[str, Any]] = {}
    for is_policy, t in tagged:
        if t.replicate:
            continue
        d = merged[t]
        if is_policy:
            pol.setdefault(t.overrides, {})[t.workload] = d
        else:
            fixed.setdefault(t.overrides, {})[(t.workload, t.composition)] = d
    pre = run_prescient(p, set_path, config, fixed[()], jobs, progress)
    clv = run_clairvoyant(p, set_path, config, policy, jobs, progress)
    base = assemble(p, config, policy, pol[()], fixed[()], prescient_runs=pre, clairvoyant_runs=clv)
    out = SweepResult(base)
    for key in grid:
        for v in sorted({*grid[key], base_values[key]}):
            if v == base_values[key]:
                out.points.append(_point(key, v, base_values[key], base))
                continue
            note = next((n for k, vv, n in notes if k == key and vv == v), None)
            if note is not None:
                out.points.append(_point(key, v, base_values[key], None, note))
                continue
            ov = ((key, v),)
            res = assemble(p, config, policy, pol[ov], fixed.get(ov, fixed[()]), ov)
            out.results[(key, v)] = res
            out.points.append(_point(key, v, base_values[key], res))
    return out


def plot_sweep(points: Sequence[dict[str, Any]], path: Path, title: str = "") -> Path:
    """One panel per key: geometric-mean ratio to the best fixed (and to the start held fixed) against the value."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = list(dict.fromkeys(p["key"] for p in points))
    cols = min(3, max(1, len(keys)))
    rows = math.ceil(len(keys) / cols) if keys else 1
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.2 * rows), squeeze=False)
    for ax, key in zip(axes.flat, keys, strict=False):
        pts = [p for p in points if p["key"] == key and p.get("ratio_best") is not None]
        xs = [p["value"] for p in pts]
        ax.plot(xs, [p["ratio_best"] for p in pts], "o-", label="÷ best fixed")
        ax.plot(xs, [p["ratio_start"] for p in pts], "s--", label="÷ start held fixed", alpha=0.7)
        for p in pts:
            if p["is_base"]:
                ax.axvline(p["value"], color="grey", lw=0.8, ls=":")
        ax.axhline(1.0, color="black", lw=0.8)
        if xs and all(isinstance(x, int) for x in xs):
            ax.set_xticks(xs)  # integer knobs (persist windows): no fractional ticks
        ax.set_xlabel(key.removeprefix("controller."))
        ax.set_ylabel("geomean mean-TTFT ratio")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(keys) :]:
        ax.set_visible(False)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
