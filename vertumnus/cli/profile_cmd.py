"""`vertumnus profile` (measure + fit + κ, or --show a profile) and `vertumnus bench profile`."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from vertumnus.config import VertumnusConfig, load_config
from vertumnus.cost_model import CostProfile
from vertumnus.profiling.flow import FitRejected, ProfileOptions, ProfileRun, run_profile
from vertumnus.profiling.measure import GridPoint, GridSpec, parse_float_list, parse_int_list, total_runs
from vertumnus.profiling.report import profile_table, region_table
from vertumnus.profiling.targets import ENGINES, ProfilingTarget, make_target

if TYPE_CHECKING:
    from vertumnus.profiling.aic_target import AicSpec

DEFAULT_TRACE = "../shared/traces/conversation_first15min.jsonl"


def default_lengths(max_tokens: int) -> tuple[int, ...]:
    """Powers of two from 256 up to ``max_tokens`` (the last 8 of them), plus ``max_tokens`` itself."""
    below = [n for n in (1 << k for k in range(8, 21)) if n < max_tokens][-7:]
    return (*below, max_tokens)


def _console() -> Console:
    """A console for tables: the terminal's width, or 140 columns when piped (logs, CI) so no column is cut."""
    return Console() if sys.stdout.isatty() else Console(width=140)


def _show(path: Path, console: Console) -> None:
    if path.is_dir():  # (a missing file: CostProfile.load says "cost profile not found")
        raise ValueError(f"--show {path} is a directory; give a cost profile YAML file")
    prof = CostProfile.load(path)
    console.print(profile_table(prof, title=f"{path}"))
    if prof.notes:
        console.print(prof.notes, highlight=False)


def register(app: typer.Typer, bench_app: typer.Typer) -> None:
    @app.command("profile")
    def profile(
        config: Path | None = typer.Option(None, "--config", "-c", help="YAML config (pool, model, SLO, window)."),
        engine: str | None = typer.Option(
            None, "--engine", "-e", help=f"Engine to profile: {'|'.join(ENGINES)} (default sim)."
        ),
        degrees: str | None = typer.Option(None, help="CP degrees, e.g. 1,2,4 (default: pool.degrees)."),
        lengths: str | None = typer.Option(None, help="Prompt lengths L (default: powers of two up to the max)."),
        prefix_ratios: str = typer.Option("0,0.25,0.5,0.75", help="Cached-prefix ratios P/L in [0, 1)."),
        repeats: int = typer.Option(5, help="Timed repeats per point."),
        statistic: str = typer.Option("median", help="Per-point statistic of the repeats: median | min."),
        timing: str = typer.Option("wall", help="torch clock: wall (service time) | cpu (busy shared machines)."),
        warmup: int = typer.Option(1, help="Untimed warm-up passes over the grid per degree."),
        seed: int = typer.Option(0, help="Seed of the pass shuffles (and of the sim engine's noise)."),
        noise: float = typer.Option(0.0, help="sim engine only: multiplicative noise exp(noise·N(0,1))."),
        out: Path | None = typer.Option(None, "--out", "-o", help="Profile YAML to write (CSV and PNG go next to it)."),
        max_mape: float = typer.Option(0.15, help="Refuse to write a profile whose per-degree MAPE exceeds this."),
        force: bool = typer.Option(False, help="Write the profile even if the fit exceeds --max-mape."),
        trace: str | None = typer.Option(DEFAULT_TRACE, help="Mooncake JSONL trace for κ_C; '' skips κ."),
        capacity_engine: str = typer.Option("model", help="κ service times: model (fitted Ê) | real (engine)."),
        capacity_requests: int | None = typer.Option(None, help="Trace requests used for κ (default: all; real: 200)."),
        show: Path | None = typer.Option(None, "--show", help="Print this profile file as a table and exit."),
        from_samples: Path | None = typer.Option(
            None, help="Re-fit this samples CSV (with --statistic) instead of measuring; grid options are ignored."
        ),
        model: str | None = typer.Option(
            None, help="aiconfigurator: the model AIC predicts (e.g. Qwen/Qwen3-30B-A3B); --from-samples: a label."
        ),
        system: str | None = typer.Option(None, help="aiconfigurator: the system (GPU) in AIC's database (h200_sxm)."),
        backend: str | None = typer.Option(None, help="aiconfigurator: sglang (CP modelled) | vllm | trtllm."),
        moe: str = typer.Option("ep", help="aiconfigurator: MoE layers over a worker's C GPUs: ep | tp."),
        backend_version: str | None = typer.Option(None, help="aiconfigurator: database version (default: AIC's)."),
        source: str | None = typer.Option(None, help="--from-samples: the samples' source label (overrides the CSV)."),
        hardware: str | None = typer.Option(None, help="--from-samples: the samples' hardware label."),
    ) -> None:
        """Measure an engine queue-free, fit E_C per degree, compute κ_C, and write a cost profile."""
        console = _console()
        if show is not None:
            _show(show, console)
            return
        if out is None:
            raise ValueError("--out is required (e.g. --out configs/profiles/NAME.yaml), or use --show FILE")
        if out.is_dir():
            raise ValueError(f"--out {out} is a directory; give the profile YAML to write (e.g. {out}/NAME.yaml)")
        labels = _labels(from_samples, engine, model, source, hardware)
        aic = _aic_spec(engine, model, system, backend, moe, backend_version, from_samples)
        cfg = load_config(config)
        target = make_target(engine or "sim", cfg, noise=noise, seed=seed, timing=timing, aic=aic)
        max_tokens = min(cfg.pool.max_model_len, target.max_tokens)
        spec = GridSpec(
            degrees=parse_int_list(degrees, "--degrees") if degrees else tuple(cfg.pool.degrees),
            lengths=parse_int_list(lengths, "--lengths") if lengths else default_lengths(max_tokens),
            prefix_ratios=parse_float_list(prefix_ratios, "--prefix-ratios"),
            repeats=repeats,
            warmup=warmup,
            seed=seed,
            statistic=statistic,
        )
        if aic is not None and from_samples is None:
            for c in spec.degrees:  # AIC builds every degree's model first: a refusal comes before any modelling
                target.setup(c)
        trace_path = _trace_path(cfg, trace)
        opts = ProfileOptions(
            out, max_mape, force, trace_path, capacity_engine, capacity_requests, from_samples, labels
        )
        run_and_report(target, spec, cfg, opts, console)

    @app.command("calibrate", hidden=True, context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
    def calibrate() -> None:
        """Removed: it searched thresholds the default policies do not read."""
        typer.echo(
            "vertumnus calibrate was removed: it searched the rule controller's band and a cache threshold that the "
            "default policies do not read. Vary what they read on a tuning set with `vertumnus evaluate --set "
            "configs/eval/tuning.yaml --sweep predictive.merge_margin` (any KEY, or 'auto'; docs/tuning.md).",
            err=True,
        )
        raise typer.Exit(2)

    @bench_app.command("profile")
    def bench_profile(
        config: Path | None = typer.Option(None, "--config", "-c", help="YAML config (model dims, pool)."),
        engine: str = typer.Option("torch", "--engine", "-e", help=f"Engine: {'|'.join(ENGINES)}."),
        degrees: str = typer.Option("1,2", help="CP degrees."),
        lengths: str = typer.Option("256,512,1024,2048", help="Prompt lengths."),
        repeats: int = typer.Option(5, help="Timed repeats per point."),
        statistic: str = typer.Option("median", help="Per-point statistic of the repeats: median | min."),
        timing: str = typer.Option("wall", help="torch clock: wall | cpu."),
    ) -> None:
        """Profile an engine on a small grid (no κ, nothing kept) and print the MAPE per degree and the time."""
        import tempfile
        import time

        cfg = load_config(config)
        target = make_target(engine, cfg, timing=timing)
        spec = GridSpec(
            degrees=parse_int_list(degrees, "--degrees"),
            lengths=parse_int_list(lengths, "--lengths"),
            prefix_ratios=(0.0, 0.5),
            repeats=repeats,
            statistic=statistic,
        )
        console = _console()
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            opts = ProfileOptions(Path(tmp) / "bench.yaml", force=True, trace=None)
            run = run_and_report(target, spec, cfg, opts, console, show_files=False)
            wall = time.perf_counter() - t0
        for f in run.fits:
            console.print(f"bench profile: engine={engine} C={f.degree} MAPE={f.mape:.2%} max_error={f.max_error:.2%}")
        console.print(f"bench profile: {len(run.measurements)} points × {repeats} repeats in {wall:.1f} s")


def _labels(
    from_samples: Path | None, engine: str | None, model: str | None, source: str | None, hardware: str | None
) -> dict[str, str]:
    """--from-samples: the provenance labels given on the command line (they override the CSV's header)."""
    if from_samples is None:
        if source or hardware:
            raise ValueError("--source / --hardware label re-fitted samples: they apply to --from-samples only")
        return {}
    given = {"source": source, "engine": engine, "model": model, "hardware": hardware}
    return {k: v for k, v in given.items() if v}


def _aic_spec(
    engine: str | None,
    model: str | None,
    system: str | None,
    backend: str | None,
    moe: str,
    version: str | None,
    from_samples: Path | None,
) -> AicSpec | None:
    """What AIConfigurator should model (``--engine aiconfigurator``); None for the other engines."""
    from vertumnus.profiling.aic_target import AicSpec

    if engine != "aiconfigurator":
        if system or backend or version or moe != "ep":
            raise ValueError("--system / --backend / --moe / --backend-version apply to --engine aiconfigurator only")
        if model and from_samples is None:
            raise ValueError(
                "--model applies to --engine aiconfigurator (the model it predicts) or --from-samples (a label); "
                "the torch and vLLM engines take the model from the config"
            )
        return None
    if not model or not system:
        raise ValueError("--engine aiconfigurator needs --model (e.g. Qwen/Qwen3-30B-A3B) and --system (e.g. h200_sxm)")
    return AicSpec(model=model, system=system, backend=backend or "sglang", moe=moe, version=version)


def _trace_path(cfg: VertumnusConfig, trace: str | None) -> Path | None:
    if not trace:
        return None
    p = cfg.resolve_path(trace)
    if not p.is_file():
        raise ValueError(f"trace file not found: {trace} (give --trace PATH, or --trace '' to skip κ)")
    return p


def run_and_report(
    target: ProfilingTarget,
    spec: GridSpec,
    cfg: VertumnusConfig,
    opts: ProfileOptions,
    console: Console,
    show_files: bool = True,
) -> ProfileRun:
    """Run the flow under a rich progress bar, then print the region and profile tables."""
    total = 0 if opts.from_samples is not None else total_runs(spec, target)
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    ) as bar:
        task = bar.add_task(f"profiling {target.engine}", total=total)

        def step(pt: GridPoint, phase: str) -> None:
            tag = " (warm-up)" if phase == "warmup" else ""
            bar.update(task, advance=1, description=f"C={pt.degree} L={pt.length} P={pt.p}{tag}")

        def cap(degree: int, requests: int) -> Callable[[], None] | None:
            if opts.capacity_engine != "real":
                bar.update(task, description=f"κ for C={degree}")
                return None
            sub = bar.add_task(f"κ for C={degree}: {requests} real prefills", total=requests)
            return lambda: bar.update(sub, advance=1)

        try:
            run = run_profile(target, spec, cfg, opts, on_step=step, on_capacity=cap)
        except FitRejected as e:
            console.print(region_table(e.run.profile, e.run.measurements))
            raise
    console.print(region_table(run.profile, run.measurements))
    console.print(profile_table(run.profile, title=f"{opts.out}"))
    for res in run.capacity:
        if res.kappa == 0.0:
            console.print(
                f"[yellow]warning: degree {res.degree} misses the SLO target even at the lightest load "
                f"(attainment {res.points[0].attainment:.1%} < {res.target:.0%}): κ = 0[/yellow]"
            )
    if show_files:
        console.print("wrote " + ", ".join(str(p) for p in run.written))
    return run
