"""PNG plots of simulation runs (matplotlib, Agg backend: no display needed).

Each function takes one or more labelled runs, so ``simulate`` (one policy) and ``compare`` / the report
(several) draw the same figures.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from vertumnus.sim.metrics import per_interval


@dataclass(slots=True)
class PlotRun:
    """What a plot needs from a run: label, per-request columns, composition timeline."""

    label: str
    arrays: dict[str, np.ndarray]
    composition: list[tuple[float, dict[int, int]]]


def ttft_cdf(runs: Sequence[PlotRun], path: Path, title: str = "TTFT CDF") -> Path:
    """Empirical CDF of TTFT per run (completed requests), log-scaled x."""
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for run in runs:
        t = np.sort(run.arrays["ttft"][~np.isnan(run.arrays["ttft"])])
        if len(t):
            ax.plot(t, np.arange(1, len(t) + 1) / len(t), label=run.label, lw=1.4)
    ax.set_xscale("log")
    ax.set_xlabel("TTFT (s)")
    ax.set_ylabel("fraction of requests")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)


def auto_width(runs: Sequence[PlotRun]) -> float:
    """Interval of the time series: a minute for runs of 10 minutes or more, else about 1/30 of the run (≥ 5 s)."""
    span = max((float(r.arrays["arrival"].max()) for r in runs if len(r.arrays["arrival"])), default=0.0)
    return 60.0 if span >= 600 else max(5.0, round(span / 30.0 / 5.0) * 5.0)


def _label_width(width_s: float) -> str:
    return "minute" if width_s == 60.0 else f"{width_s:g} s"


def _steps(ax: plt.Axes, start: np.ndarray, ys: np.ndarray, width_s: float, label: str) -> None:
    """Step series over [start, start + width): the last interval is drawn to its end."""
    xs = np.append(start, start[-1] + width_s) / 60.0
    ax.step(xs, np.append(ys, ys[-1]), where="post", label=label, lw=1.3)


def ttft_timeline(
    runs: Sequence[PlotRun],
    path: Path,
    width_s: float | None = None,
    composition_of: str | None = None,
    title: str | None = None,
    phases: Sequence[tuple[float, float]] = (),
) -> Path:
    """Mean TTFT per ``width_s`` of arrival time (default :func:`auto_width`; top) and the composition over
    time (bottom) of the run labelled ``composition_of`` (default: the first run whose composition changed,
    else the first)."""
    width = width_s or auto_width(runs)
    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(7.5, 5.4), sharex=True, gridspec_kw={"height_ratios": [3, 1.4]})
    end = 0.0
    for run in runs:
        iv = per_interval(run.arrays, width)
        if len(iv["start"]):
            _steps(ax, iv["start"], iv["mean_ttft"], width, run.label)
            end = max(end, float(iv["start"][-1]) + width)
    for lo, _hi in phases[1:]:
        ax.axvline(lo / 60.0, color="grey", ls=":", lw=0.8)
        ax2.axvline(lo / 60.0, color="grey", ls=":", lw=0.8)
    ax.set_ylabel("mean TTFT (s)")
    ax.set_yscale("log")
    ax.set_title(f"{title or 'Mean TTFT'} (per {_label_width(width)} of arrival time)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    pick = _composition_run(runs, composition_of)
    if pick is not None and pick.composition:
        _composition_axes(ax2, pick, end)
    ax2.set_xlabel("time (min)")
    return _save(fig, path)


def _composition_run(runs: Sequence[PlotRun], label: str | None) -> PlotRun | None:
    if label is not None:
        return next((r for r in runs if r.label == label), None)
    return next((r for r in runs if len(r.composition) > 1), runs[0] if runs else None)


def _composition_axes(ax: plt.Axes, run: PlotRun, end: float) -> None:
    comp = run.composition
    degrees = sorted({c for _, counts in comp for c in counts})
    times = [t for t, _ in comp] + [max(end, comp[-1][0])]
    for c in degrees:
        ys = [counts.get(c, 0) for _, counts in comp]
        ax.step(np.array(times) / 60.0, [*ys, ys[-1]], where="post", label=f"CP{c} workers", lw=1.4)
    ax.set_ylabel("workers")
    ax.set_title(f"composition ({run.label})", fontsize=8)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper right")


def hit_rate_timeline(runs: Sequence[PlotRun], path: Path, width_s: float | None = None) -> Path:
    """Token prefix hit rate per ``width_s`` of arrival time (default :func:`auto_width`)."""
    width = width_s or auto_width(runs)
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    for run in runs:
        iv = per_interval(run.arrays, width)
        if len(iv["start"]):
            _steps(ax, iv["start"], iv["hit_rate"], width, run.label)
    ax.set_xlabel("time (min)")
    ax.set_ylabel("prefix hit rate (tokens)")
    ax.set_ylim(0, 1)
    ax.set_title(f"Prefix hit rate (per {_label_width(width)} of arrival time)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    return _save(fig, path)


def rate_lines(
    rates: Sequence[float], series: Mapping[str, Sequence[dict[str, Any]]], path: Path, title: str = ""
) -> Path:
    """Mean TTFT, P90 TTFT and token-weighted SLO attainment against request rate, one line per policy."""
    fig, axes = plt.subplots(1, 3, figsize=(12.5, 3.8))
    keys = (("mean_ttft_s", "mean TTFT (s)"), ("p90_ttft_s", "P90 TTFT (s)"),
            ("slo_attainment_token_weighted", "SLO attainment (token-weighted)"))  # fmt: skip
    for ax, (key, label) in zip(axes, keys, strict=True):
        for name, sums in series.items():
            ys = [np.nan if s.get(key) is None else s[key] for s in sums]
            ax.plot(rates, ys, marker="o", ms=3, lw=1.3, label=name, ls="--" if name == "lower-bound" else "-")
        ax.set_xlabel("request rate (req/s)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        if key != "slo_attainment_token_weighted":
            ax.set_yscale("log")
    axes[0].legend(fontsize=7)
    fig.suptitle(title)
    return _save(fig, path)


def bars(labels: Sequence[str], series: dict[str, Sequence[float]], path: Path, ylabel: str, title: str) -> Path:
    """Grouped bars: one group per label, one bar per series (e.g. rates × policies)."""
    fig, ax = plt.subplots(figsize=(7.5, 3.8))
    n = max(len(series), 1)
    width = 0.8 / n
    x = np.arange(len(labels))
    for k, (name, ys) in enumerate(series.items()):
        ax.bar(x + (k - (n - 1) / 2) * width, ys, width, label=name)
    ax.set_xticks(x, labels)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=7, ncol=3)
    return _save(fig, path)


def _save(fig: plt.Figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
