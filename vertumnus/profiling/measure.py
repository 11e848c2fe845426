"""The queue-free measurement grid: (C, L, P/L) points, warm-up, repeats, medians, and the samples CSV.

Robustness on a shared machine: each degree is warmed up first (``warmup`` untimed runs of every grid point
shape, so allocator / thread-pool / gloo start-up costs never land in a sample), then the grid is measured
``repeats`` times in *passes*, each pass in a fresh seeded shuffle of the points. A burst of foreign load then
spreads over many points instead of inflating one point's every repeat, and the per-point *median* discards it.

``statistic = "min"`` keeps the fastest repeat instead (the rule of Python's ``timeit``): interference from other
processes only ever *adds* time, so on a heavily shared machine — where a burst can cover more than half of a
point's repeats and inflate even the median — the minimum is the robust estimate of the uncontended service
time. The CSV keeps median, min and max either way; the profile notes name the statistic used.

A :data:`Timer` decides which seconds a timed run records. Unset, it is the engine's own time. The profiler's
unit tests supply a controlled timer (e.g. a planted E_C(r, p)): the real engine still runs every point, with
its prefix-reuse checks, but the recorded times — and so the fitted coefficients — are exact and independent
of machine load. Timed fits on real clocks are benchmarks (``vertumnus bench profile-fit``), not tests.
"""

from __future__ import annotations

import csv
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TypeVar

import numpy as np

from vertumnus.profiling.fit import ProfileSample
from vertumnus.profiling.targets import ProfilingTarget

_T = TypeVar("_T", int, float)
Timer = Callable[["GridPoint", float], float]
"""``timer(point, engine_s)`` → the seconds recorded for one timed run of ``point`` (``engine_s``: the target's)."""
CSV_FIELDS = ("degree", "length", "prefix_ratio", "r", "p", "seconds", "median_s", "min_s", "max_s", "repeats")
STATISTICS = ("median", "min")
SAMPLES_COMMENT = "#"  # provenance lines above the CSV columns start with this (write_samples header)


@dataclass(slots=True, frozen=True)
class GridSpec:
    """What to measure. ``prefix_ratios`` are P/L in [0, 1); P is rounded down to the target's prefix_align."""

    degrees: tuple[int, ...]
    lengths: tuple[int, ...]
    prefix_ratios: tuple[float, ...] = (0.0, 0.5)
    repeats: int = 3
    warmup: int = 1
    seed: int = 0
    statistic: str = "median"  # per point: "median" or "min" of the repeats (module docstring)

    def __post_init__(self) -> None:
        if self.statistic not in STATISTICS:
            raise ValueError(f"--statistic must be one of {', '.join(STATISTICS)}, got {self.statistic!r}")
        if not self.degrees or any(c < 1 or c & (c - 1) for c in self.degrees):
            raise ValueError(f"--degrees must be powers of two ≥ 1, got {list(self.degrees)}")
        if not self.lengths or any(n < 2 for n in self.lengths):
            raise ValueError(f"--lengths must be integers ≥ 2, got {list(self.lengths)}")
        if not self.prefix_ratios or any(not 0.0 <= x < 1.0 for x in self.prefix_ratios):
            raise ValueError(f"--prefix-ratios must lie in [0, 1), got {list(self.prefix_ratios)}")
        if self.repeats < 1 or self.warmup < 0:
            raise ValueError(f"--repeats must be ≥ 1 and --warmup ≥ 0 (got {self.repeats}, {self.warmup})")


@dataclass(slots=True, frozen=True)
class GridPoint:
    degree: int
    length: int
    prefix_ratio: float
    r: int  # uncached tokens (≥ 1)
    p: int  # cached prefix tokens (multiple of the target's prefix_align)


@dataclass(slots=True, frozen=True)
class Measurement:
    """A point's time (``seconds``: the spec's statistic of its repeats), with the median and spread."""

    point: GridPoint
    seconds: float
    median_s: float
    min_s: float
    max_s: float
    repeats: int

    def sample(self) -> ProfileSample:
        return ProfileSample(self.point.degree, self.point.r, self.point.p, self.seconds)


def parse_int_list(text: str, what: str) -> tuple[int, ...]:
    """``"1,2,4"`` -> (1, 2, 4); ValueError naming the option on bad input."""
    return _parse_list(text, what, int, "integers")


def parse_float_list(text: str, what: str) -> tuple[float, ...]:
    """``"0,0.5"`` -> (0.0, 0.5); ValueError naming the option on bad input."""
    return _parse_list(text, what, float, "numbers")


def _parse_list(text: str, what: str, conv: Callable[[str], _T], kind: str) -> tuple[_T, ...]:
    try:
        out = tuple(conv(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ValueError(f"{what}: expected comma-separated {kind}, got {text!r}") from None
    if not out:
        raise ValueError(f"{what}: empty list")
    return out


def grid_points(spec: GridSpec, prefix_align: int, max_tokens: int) -> list[GridPoint]:
    """The (C, L, P/L) grid as points with integral R and P; duplicates (after alignment) are merged."""
    too_long = [n for n in spec.lengths if n > max_tokens]
    if too_long:
        raise ValueError(f"--lengths {too_long} exceed what the engine runs (max {max_tokens} tokens)")
    seen: set[tuple[int, int, int]] = set()
    out: list[GridPoint] = []
    for c in spec.degrees:
        for n in spec.lengths:
            for x in spec.prefix_ratios:
                p = int(x * n) // prefix_align * prefix_align
                if n - p < 1:
                    p -= prefix_align
                if (c, n, p) in seen or p < 0:
                    continue
                seen.add((c, n, p))
                out.append(GridPoint(c, n, x, n - p, p))
    return out


def measure_grid(
    target: ProfilingTarget,
    spec: GridSpec,
    on_step: Callable[[GridPoint, str], None] | None = None,
    timer: Timer | None = None,
) -> list[Measurement]:
    """Run the grid on ``target`` degree by degree (setup → warm-up → shuffled passes → teardown).

    ``on_step(point, phase)`` is called after every run (phase ``"warmup"`` or ``"measure"``) for a progress
    bar. ``timer``: where each timed run's seconds come from (module docstring; default: the engine's time).
    Returns one :class:`Measurement` per grid point, in grid order.
    """
    points = grid_points(spec, target.prefix_align, target.max_tokens)
    rng = np.random.default_rng(spec.seed)
    out: list[Measurement] = []
    for c in spec.degrees:
        mine = [pt for pt in points if pt.degree == c]
        target.setup(c)
        try:
            for _ in range(spec.warmup):
                for pt in mine:
                    target.measure(c, pt.r, pt.p)
                    if on_step:
                        on_step(pt, "warmup")
            times: list[list[float]] = [[] for _ in mine]
            for _ in range(spec.repeats):
                for i in rng.permutation(len(mine)):
                    s = target.measure(c, mine[i].r, mine[i].p)
                    if not s > 0:
                        raise ValueError(f"engine returned a non-positive time {s} for {mine[i]}")
                    if timer is not None:
                        s = timer(mine[i], s)
                        if not s > 0:
                            raise ValueError(f"timer returned a non-positive time {s} for {mine[i]}")
                    times[i].append(s)
                    if on_step:
                        on_step(mine[i], "measure")
        finally:
            target.teardown(c)
        for pt, ts in zip(mine, times, strict=True):
            med = statistics.median(ts)
            out.append(Measurement(pt, med if spec.statistic == "median" else min(ts), med, min(ts), max(ts), len(ts)))
    return out


def with_statistic(rows: Sequence[Measurement], statistic: str) -> list[Measurement]:
    """The same measurements with ``seconds`` set to another statistic of their repeats (median or min)."""
    if statistic not in STATISTICS:
        raise ValueError(f"--statistic must be one of {', '.join(STATISTICS)}, got {statistic!r}")
    return [replace(m, seconds=m.median_s if statistic == "median" else m.min_s) for m in rows]


def total_runs(spec: GridSpec, target: ProfilingTarget) -> int:
    """How many prefills :func:`measure_grid` runs (for the progress bar)."""
    return len(grid_points(spec, target.prefix_align, target.max_tokens)) * (spec.warmup + spec.repeats)


def samples_path(profile_path: str | Path) -> Path:
    """``configs/profiles/NAME.yaml`` -> ``configs/profiles/NAME.samples.csv``."""
    p = Path(profile_path)
    return p.with_name(p.stem + ".samples.csv")


def plot_path(profile_path: str | Path) -> Path:
    """``configs/profiles/NAME.yaml`` -> ``configs/profiles/NAME.fit.png``."""
    p = Path(profile_path)
    return p.with_name(p.stem + ".fit.png")


def write_samples(
    path: str | Path, rows: Sequence[Measurement], header: Mapping[str, str | Sequence[str]] | None = None
) -> None:
    """Write the measurements (one row per grid point) as CSV with a header.

    ``header``: provenance lines written first as ``# key: value`` comments (a list value repeats its key, one
    line per item; :mod:`vertumnus.profiling.provenance`), read back by :func:`read_samples_header`.
    """
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as f:
        for key, value in (header or {}).items():
            for v in [value] if isinstance(value, str) else value:
                f.write(f"{SAMPLES_COMMENT} {key}: {' '.join(str(v).split())}\n")
        w = csv.writer(f)
        w.writerow(CSV_FIELDS)
        for m in rows:
            pt = m.point
            w.writerow((pt.degree, pt.length, pt.prefix_ratio, pt.r, pt.p, *_times(m), m.repeats))


def read_samples_header(path: str | Path) -> dict[str, str | list[str]]:
    """The ``# key: value`` provenance lines above a samples CSV's columns (``note`` as a list; {} if none)."""
    out: dict[str, str | list[str]] = {}
    notes: list[str] = []
    with Path(path).open(encoding="utf-8") as f:
        for line in f:
            if not line.startswith(SAMPLES_COMMENT):
                break
            key, _, value = line[len(SAMPLES_COMMENT) :].strip().partition(":")
            if key.strip() == "note":
                notes.append(value.strip())
            elif key.strip():
                out[key.strip()] = value.strip()
    if notes:
        out["note"] = notes
    return out


def read_samples(path: str | Path) -> list[Measurement]:
    """Read a samples CSV written by :func:`write_samples` (ValueError naming the line on bad input)."""
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"samples file not found: {p}")
    out: list[Measurement] = []
    with p.open(newline="", encoding="utf-8") as f:
        lines = f.readlines()
    skip = next((i for i, line in enumerate(lines) if not line.startswith(SAMPLES_COMMENT)), len(lines))
    reader = csv.DictReader(lines[skip:])
    missing = set(CSV_FIELDS) - set(reader.fieldnames or ())
    if missing:
        raise ValueError(f"{p}: missing columns {sorted(missing)}")
    for no, row in enumerate(reader, start=skip + 2):
        try:
            pt = GridPoint(
                int(row["degree"]), int(row["length"]), float(row["prefix_ratio"]), int(row["r"]), int(row["p"])
            )
            secs, med, lo, hi = (float(row[k]) for k in ("seconds", "median_s", "min_s", "max_s"))
            out.append(Measurement(pt, secs, med, lo, hi, int(row["repeats"])))
        except (TypeError, ValueError) as e:
            raise ValueError(f"{p}: line {no}: {e}") from None
    return out


def _times(m: Measurement) -> tuple[str, ...]:
    return tuple(repr(float(x)) for x in (m.seconds, m.median_s, m.min_s, m.max_s))
