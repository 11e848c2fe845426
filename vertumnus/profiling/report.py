"""Fit quality: per-degree and per-region errors, the refusal explanation, rich tables and the fit plot.

Regions split a degree's samples two ways — *short* / *long* (L at most / above the median profiled length)
and *no-prefix* / *prefix* (P = 0 / P > 0) — so a bad fit says where it is bad (e.g. "degree 2, long+prefix:
MAPE 31%"), which points at the term that is off (α·W for long, b·P for prefix, d for short).
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from rich import box
from rich.table import Table

from vertumnus.cost_model import COEFFICIENTS, CostModel, CostProfile
from vertumnus.profiling.measure import Measurement


@dataclass(slots=True, frozen=True)
class RegionError:
    degree: int
    region: str  # "short/no-prefix", "long/prefix", ...
    samples: int
    mape: float
    max_error: float


def relative_errors(model: CostModel, rows: Sequence[Measurement]) -> np.ndarray:
    """|Ê − E| / E per row."""
    if not rows:
        return np.zeros(0)
    degs = np.array([m.point.degree for m in rows])
    r = np.array([m.point.r for m in rows], dtype=np.float64)
    p = np.array([m.point.p for m in rows], dtype=np.float64)
    y = np.array([m.seconds for m in rows], dtype=np.float64)
    return np.asarray(np.abs(model.predict_many(degs, r, p) - y) / y)


def region_errors(model: CostModel, rows: Sequence[Measurement]) -> list[RegionError]:
    """Errors of each degree's four regions (regions without samples are left out)."""
    out: list[RegionError] = []
    for c in sorted({m.point.degree for m in rows}):
        mine = [m for m in rows if m.point.degree == c]
        cut = float(np.median([m.point.length for m in mine]))
        rel = relative_errors(model, mine)
        for size in ("short", "long"):
            for pre in ("no-prefix", "prefix"):
                idx = [
                    i
                    for i, m in enumerate(mine)
                    if (m.point.length <= cut) == (size == "short") and (m.point.p > 0) == (pre == "prefix")
                ]
                if idx:
                    e = rel[idx]
                    out.append(RegionError(c, f"{size}/{pre}", len(idx), float(e.mean()), float(e.max())))
    return out


def explain_bad_fit(profile: CostProfile, rows: Sequence[Measurement], max_mape: float) -> list[str]:
    """One line per degree whose MAPE exceeds ``max_mape``: the worst region and the worst sample.

    Empty list: every degree fits within the threshold.
    """
    model = CostModel(profile)
    regions = region_errors(model, rows)
    lines: list[str] = []
    for c, prof in sorted(profile.degrees.items()):
        if prof.mape is None or prof.mape <= max_mape:
            continue
        mine = [m for m in rows if m.point.degree == c]
        bad = sorted((r for r in regions if r.degree == c), key=lambda r: -r.mape)
        rel = relative_errors(model, mine)
        w = mine[int(np.argmax(rel))]
        worst_region = f"worst region {bad[0].region} (MAPE {bad[0].mape:.1%} over {bad[0].samples} samples)"
        others = ", ".join(f"{r.region} {r.mape:.1%}" for r in bad[1:])
        lines.append(
            f"degree {c}: MAPE {prof.mape:.2%} > {max_mape:.2%}; {worst_region}"
            + (f"; other regions: {others}" if others else "")
            + f"; worst sample L={w.point.length} P={w.point.p}: measured {w.seconds:.4g} s, "
            f"predicted {model.predict(c, w.point.r, w.point.p):.4g} s"
        )
    return lines


def profile_table(profile: CostProfile, title: str | None = None) -> Table:
    """The profile as a rich table: one row per degree, coefficients, fit errors and κ."""
    # SIMPLE_HEAD (no vertical rules) keeps all nine columns readable in an 80-column terminal.
    t = Table(title=title or "cost profile", box=box.SIMPLE_HEAD)
    t.add_column("C", justify="right")
    for name in COEFFICIENTS:
        t.add_column(name, justify="right", no_wrap=True)
    t.add_column("MAPE", justify="right")
    t.add_column("max err", justify="right")
    t.add_column(f"κ/{profile.kappa_window_s:g}s", justify="right", no_wrap=True)
    for c, p in sorted(profile.degrees.items()):
        t.add_row(
            str(c),
            *(f"{getattr(p, name):.3g}" for name in COEFFICIENTS),
            "—" if p.mape is None else f"{p.mape:.2%}",
            "—" if p.max_error is None else f"{p.max_error:.2%}",
            "—" if p.kappa is None else f"{p.kappa:.4g}",
        )
    t.caption = (
        f"source: {profile.source} · engine: {profile.engine} · model: {profile.model}\n"
        f"hardware: {profile.hardware} · date: {profile.date}"
    )
    warning = source_warning(profile)
    if warning:
        t.caption += "\n" + warning
    return t


def source_warning(profile: CostProfile) -> str:
    """One line saying a profile's numbers were not measured (``""`` for measured / simulated / controlled)."""
    if profile.source == "modelled":
        return (
            f"MODELLED by {profile.engine}, NOT MEASURED OR CALIBRATED: predicted kernel sums (optimistic), "
            "extrapolated beyond the model's data range (see notes)"
        )
    if profile.source == "calibrated":
        return "CALIBRATED, NOT MEASURED: coefficients chosen to match published figures (see notes)"
    if profile.source == "unknown":
        return "PROVENANCE UNKNOWN: the samples this profile was fitted to did not record where they came from"
    return ""


def region_table(profile: CostProfile, rows: Sequence[Measurement]) -> Table:
    """Per-degree, per-region MAPE and max error."""
    t = Table(title="fit error by region (short/long: L ≤ / > median profiled length)")
    for col in ("C", "region", "samples", "MAPE", "max error"):
        t.add_column(col, justify="right" if col != "region" else "left")
    for r in region_errors(CostModel(profile), rows):
        t.add_row(str(r.degree), r.region, str(r.samples), f"{r.mape:.2%}", f"{r.max_error:.2%}")
    return t


def plot_fit(profile: CostProfile, rows: Sequence[Measurement], path: str | Path) -> Path:
    """Predicted vs measured scatter per degree with the y = x line (the paper's Figure 4), as a PNG."""
    import matplotlib

    matplotlib.use("Agg")  # headless: no display on servers and CI
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    model = CostModel(profile)
    degrees = sorted({m.point.degree for m in rows})
    fig, axes = plt.subplots(1, len(degrees), figsize=(4.2 * len(degrees), 4.2), squeeze=False)
    for ax, c in zip(axes[0], degrees, strict=True):
        mine = [m for m in rows if m.point.degree == c]
        y = np.array([m.seconds for m in mine])
        pred = np.array([model.predict(c, m.point.r, m.point.p) for m in mine])
        has_prefix = np.array([m.point.p > 0 for m in mine])
        ax.scatter(y[~has_prefix], pred[~has_prefix], s=22, label="P = 0", marker="o")
        ax.scatter(y[has_prefix], pred[has_prefix], s=22, label="P > 0", marker="^")
        lo, hi = float(min(y.min(), pred.min())) * 0.8, float(max(y.max(), pred.max())) * 1.25
        ax.plot([lo, hi], [lo, hi], "k--", lw=1, label="y = x")
        ax.set_xscale("log")
        ax.set_yscale("log")
        for axis in (ax.xaxis, ax.yaxis):  # minor labels of a narrow log range overlap each other
            axis.set_minor_formatter(NullFormatter())
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
        mape = profile.degrees[c].mape
        ax.set_title(f"C = {c}" + ("" if mape is None else f"  (MAPE {mape:.1%})"))
        ax.set_xlabel(f"{'modelled' if profile.source == 'modelled' else 'measured'} prefill time (s)")
        ax.set_ylabel("predicted Ê (s)")
        ax.legend(loc="upper left", fontsize=8)
        ax.grid(True, which="both", alpha=0.3)
    title = f"{profile.engine} ({profile.source}): {profile.model} — {profile.hardware}"
    fig.suptitle("\n".join(textwrap.wrap(title, width=int(60 * len(degrees)))), fontsize=8)
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
