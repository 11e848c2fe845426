"""`vertumnus bench profile-fit`: timed fits of the real engines on their own clocks (figures and a verdict)."""

from __future__ import annotations

import typer


def register(app: typer.Typer, bench_app: typer.Typer) -> None:
    """Add ``bench profile-fit``."""

    @bench_app.command("profile-fit")
    def bench_profile_fit(
        engine: str = typer.Option("torch", "--engine", "-e", help="torch | vllm | all (the presets)."),
        max_mape: float = typer.Option(0.15, help="Per-degree MAPE a fit must stay within."),
        repeats: int | None = typer.Option(None, help="Timed repeats per point (default: the preset's)."),
    ) -> None:
        """Profile the real engine on the grid the profiler's tests used to time (torch: degrees 1 and 2, CPU
        clock; vllm: degree 1) and print the fit's MAPE per degree. Exit status 1 when a degree's MAPE exceeds
        --max-mape: these are the timed fits that do not belong in unit tests (they depend on machine load)."""
        from vertumnus.bench.profile_fit import PRESETS, run_fit_bench

        engines = list(PRESETS) if engine == "all" else [engine]
        ok = True
        for name in engines:
            res = run_fit_bench(name, max_mape=max_mape, repeats=repeats)
            for line in res.lines():
                typer.echo(line)
            ok = ok and res.ok
        if not ok:
            raise typer.Exit(1)
