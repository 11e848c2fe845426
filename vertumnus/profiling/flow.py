"""`vertumnus profile` end to end: measure the grid, fit E_C per degree, check the fit, compute κ_C, write files.

::

    target (sim | torch | vllm)
      │ measure_grid: warm-up, shuffled repeats, medians            → NAME.samples.csv
      ▼
    fit_profile (NNLS per degree, fit.py)                           → NAME.fit.png (predicted vs measured)
      │ MAPE per degree > max_mape?  → refuse (explain degree + region), no YAML
      ▼
    measure_capacity per degree (trace, FCFS worker, SLO ladder)    → kappa, kappa_window_s
      ▼
    CostProfile.save                                                → NAME.yaml

The flow is a plain function returning a :class:`ProfileRun`; the CLI adds the progress bar and the tables.
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from vertumnus.config import VertumnusConfig
from vertumnus.cost_model import CostModel, CostProfile
from vertumnus.profiling.capacity import CapacityResult, load_workload, measure_capacity
from vertumnus.profiling.fit import DegreeFit, fit_profile
from vertumnus.profiling.measure import (
    GridPoint,
    GridSpec,
    Measurement,
    Timer,
    measure_grid,
    plot_path,
    read_samples,
    read_samples_header,
    samples_path,
    with_statistic,
    write_samples,
)
from vertumnus.profiling.provenance import of_samples, of_target, save_profile
from vertumnus.profiling.report import explain_bad_fit, plot_fit
from vertumnus.profiling.targets import ProfilingTarget

CAPACITY_ENGINES = ("model", "real")


class FitRejected(ValueError):
    """The fit's MAPE exceeds the threshold; ``lines`` say which degree and region fit badly."""

    def __init__(self, lines: list[str], max_mape: float, run: ProfileRun) -> None:
        self.lines = lines
        self.run = run  # the rejected fit and its measurements (for the region table)
        files = ", ".join(str(p) for p in run.written)
        super().__init__(
            f"refusing to write the profile: fit error above --max-mape {max_mape:.0%} "
            f"(use --force to write it anyway; samples and plot written to {files})\n  " + "\n  ".join(lines)
        )


@dataclass(slots=True)
class ProfileOptions:
    """Everything beyond the grid: fit threshold, κ settings and outputs."""

    out: Path
    max_mape: float = 0.15
    force: bool = False
    trace: Path | None = None  # None: no κ
    capacity_engine: str = "model"
    capacity_requests: int | None = None  # None: the whole trace (model) / 200 (real)
    from_samples: Path | None = None  # re-fit a samples CSV instead of measuring (grid options ignored)
    # --from-samples only: labels (source / engine / model / hardware) overriding the samples CSV's header
    labels: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.out.suffix not in (".yaml", ".yml"):
            raise ValueError(f"--out must name a .yaml file, got {self.out}")
        if not self.max_mape > 0:  # also rejects NaN
            raise ValueError(f"--max-mape must be > 0, got {self.max_mape}")
        if self.capacity_engine not in CAPACITY_ENGINES:
            raise ValueError(f"--capacity-engine must be one of {', '.join(CAPACITY_ENGINES)}")
        if self.labels and self.from_samples is None:
            flags = ", ".join(f"--{k}" for k in sorted(self.labels))
            raise ValueError(f"{flags}: provenance labels apply to --from-samples only (a measurement labels itself)")


@dataclass(slots=True)
class ProfileRun:
    profile: CostProfile
    fits: list[DegreeFit]
    measurements: list[Measurement]
    capacity: list[CapacityResult] = field(default_factory=list)
    written: list[Path] = field(default_factory=list)


def run_profile(
    target: ProfilingTarget,
    spec: GridSpec,
    cfg: VertumnusConfig,
    opts: ProfileOptions,
    on_step: Callable[[GridPoint, str], None] | None = None,
    on_capacity: Callable[[int, int], Callable[[], None] | None] | None = None,
    timer: Timer | None = None,
) -> ProfileRun:
    """The whole flow; raises :class:`FitRejected` (after writing samples + plot) when the fit is too poor.

    ``on_capacity(degree, requests)`` is called before each degree's κ measurement and may return a callable
    ticked after every real-engine request (progress reporting). ``timer``: a controlled source of the
    recorded seconds (:data:`~vertumnus.profiling.measure.Timer`; tests) — the profile's source is then
    ``controlled``, not ``measured``.
    """
    controlled = timer is not None and opts.from_samples is None
    today = dt.date.today().isoformat()
    if opts.from_samples is None:
        load_before = _loadavg()
        rows = measure_grid(target, spec, on_step, timer)
        prov = of_target(target, today, controlled)
        where = f"1-min load average {_loadavg()} after measuring (before: {load_before})"
        grid = (
            f"grid: degrees {list(spec.degrees)}, lengths {list(spec.lengths)}, prefix ratios "
            f"{list(spec.prefix_ratios)}; {spec.warmup} warm-up pass(es), {spec.statistic} of {spec.repeats} "
            "shuffled repeats per point"
        )
    else:
        rows = with_statistic(read_samples(opts.from_samples), spec.statistic)
        # The samples' own labels (CSV header, then flags), never the target's: it did not produce them.
        prov = of_samples(read_samples_header(opts.from_samples), opts.labels, opts.from_samples.name)
        where = f"re-fitted from {opts.from_samples.name}, taken {prov.date}"
        grid = f"{len(rows)} grid points from {opts.from_samples.name}; {spec.statistic} of their repeats"
    profile, fits = fit_profile([m.sample() for m in rows], date=today, **prov.profile_labels())
    profile.kappa_window_s = cfg.controller.window_s
    run = ProfileRun(profile, fits, rows)
    csv_path, png_path = samples_path(opts.out), plot_path(opts.out)
    write_samples(csv_path, rows, prov.header())
    plot_fit(profile, rows, png_path)
    run.written += [csv_path, png_path]
    bad = explain_bad_fit(profile, rows, opts.max_mape)
    if bad and not opts.force:
        raise FitRejected(bad, opts.max_mape, run)
    notes = [*prov.notes, grid, f"samples: {csv_path.name}; fit plot: {png_path.name}; {where}"]
    if controlled:
        notes.append("timings: from a controlled timer; the engine ran every point but its clock was not recorded")
    if bad:
        notes.append("written with --force despite: " + " | ".join(bad))
    if opts.trace is not None:
        run.capacity = _capacity(target, profile, cfg, opts, on_capacity)
        for res in run.capacity:
            profile.degrees[res.degree].kappa = res.kappa
        res0 = run.capacity[0]
        notes.append(
            f"kappa: {res0.service} service times, {res0.requests} requests of {Path(opts.trace).name} "
            f"(lengths capped at {_max_tokens(cfg, target)}), one FCFS worker per degree, window "
            f"{cfg.controller.window_s:g} s, SLO tau = {cfg.slo.base_s:g} s + {cfg.slo.per_token_s:g} s/token "
            f"+ T_ext {cfg.slo.t_ext_s:g} s, target token-weighted attainment {cfg.slo.target_attainment:g}"
        )
    else:
        notes.append("kappa not measured (no --trace)")
    profile.notes = "\n".join(notes)
    save_profile(profile, opts.out)
    run.written.insert(0, opts.out)
    return run


def _loadavg() -> str:
    """The machine's 1-minute load average (a shared machine's noise level, recorded with the profile)."""
    try:
        return f"{os.getloadavg()[0]:.2f}"
    except OSError:
        return "unknown"


def _max_tokens(cfg: VertumnusConfig, target: ProfilingTarget) -> int:
    return min(cfg.pool.max_model_len, target.max_tokens)


def _capacity(
    target: ProfilingTarget,
    profile: CostProfile,
    cfg: VertumnusConfig,
    opts: ProfileOptions,
    on_capacity: Callable[[int, int], Callable[[], None] | None] | None,
) -> list[CapacityResult]:
    assert opts.trace is not None
    limit = opts.capacity_requests
    if limit is None and opts.capacity_engine == "real":
        limit = 200  # each request is a real prefill: keep the default run short
    work = load_workload(opts.trace, _max_tokens(cfg, target), limit)
    model = CostModel(profile)
    out = []
    for c in sorted(profile.degrees):
        tick = on_capacity(c, len(work.lengths)) if on_capacity else None
        real = target if opts.capacity_engine == "real" else None
        out.append(measure_capacity(c, model, work, cfg, real, tick))
    return out
