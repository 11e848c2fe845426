"""`vertumnus simulate`, `vertumnus compare` and `vertumnus bench sim`: the trace-driven simulator."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import typer

from vertumnus.cli.paths import OUT_DIR_HELP, output_dir
from vertumnus.config import VertumnusConfig
from vertumnus.cost_model import CostModel
from vertumnus.sim.inputs import Workload, load_cost, load_sim_config, load_workload_requests, report_issues
from vertumnus.sim.policies import POLICIES, check_policy

TRACE_HELP = "Mooncake JSONL trace (timestamp ms, input_length, output_length, hash_ids)."
WORKLOAD_HELP = "Generated time-varying workload: 'phases:DUR@RATE/LONG,...[;seed=N]' or a YAML file."
PROGRESS_MIN_REQUESTS = 2000  # show a progress bar from this many requests on


@contextmanager
def _progress(enabled: bool, label: str) -> Iterator[Callable[[int, int], None] | None]:
    if not enabled:
        yield None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        transient=True, console=None,
    ) as bar:  # fmt: skip
        task = bar.add_task(label, total=None)

        def update(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        yield update


def _load(
    config: str | None,
    trace: str | None,
    workload: str | None,
    rate_scale: float | None,
    target_rps: float | None,
    slice_spec: str | None,
    strict: bool,
) -> tuple[VertumnusConfig, CostModel, Workload]:
    cfg = load_sim_config(config)
    cost = load_cost(cfg)
    wl = load_workload_requests(cfg, trace, workload, rate_scale, target_rps, slice_spec, strict)
    report_issues(wl.issues)
    return cfg, cost, wl


def register(app: typer.Typer, bench_app: typer.Typer) -> None:
    """Add `simulate`, `compare` and `bench sim` (heavy imports happen when a command runs)."""

    @app.command("simulate")
    def simulate(
        trace: str | None = typer.Option(None, "--trace", help=TRACE_HELP),
        workload: str | None = typer.Option(None, "--workload", help=WORKLOAD_HELP),
        config: str | None = typer.Option(None, "--config", "-c", help="Config YAML (default configs/sim-40gpu.yaml)."),
        policy: str = typer.Option("vertumnus", "--policy", "-p", help=f"One of: {', '.join(POLICIES)}."),
        composition: str | None = typer.Option(
            None, "--composition", help="Fixed/initial composition, e.g. 4xCP4+3xCP8."
        ),
        rate_scale: float | None = typer.Option(
            None, "--rate-scale", help="Divide arrival times by X (X > 1: faster)."
        ),
        target_rps: float | None = typer.Option(
            None, "--target-rps", help="Rescale arrivals to R requests/s on average."
        ),
        slice_spec: str | None = typer.Option(None, "--slice", help="START:END seconds of the trace to keep."),
        strict: bool = typer.Option(False, "--strict", help="Reject the trace at its first malformed line."),
        out: Path = typer.Option(Path("runs/simulate"), "--out", "-o", help=OUT_DIR_HELP),
        progress: bool = typer.Option(True, "--progress/--no-progress", help="Progress bar on long runs."),
    ) -> None:
        """Simulate one policy; writes summary.json, requests.csv and PNG plots to --out."""
        from vertumnus.sim.output import markdown_table, write_run
        from vertumnus.sim.runner import run_policy

        check_policy(policy)
        output_dir(out)
        cfg, cost, wl = _load(config, trace, workload, rate_scale, target_rps, slice_spec, strict)
        show = progress and len(wl.requests) >= PROGRESS_MIN_REQUESTS and sys.stderr.isatty()
        with _progress(show, f"{policy} on {wl.name}") as cb:
            result = run_policy(wl.requests, cfg, cost, policy, composition, cb)
        extra = {"workload": wl.name, "skipped_lines": len(wl.issues), "profile": cost.profile.source}
        write_run(result, out, extra)
        typer.echo(markdown_table([result.summary]), nl=False)
        typer.echo(f"wrote {out}/summary.json, requests.csv and plots")

    @app.command("compare")
    def compare(
        trace: str | None = typer.Option(None, "--trace", help=TRACE_HELP),
        workload: str | None = typer.Option(None, "--workload", help=WORKLOAD_HELP),
        config: str | None = typer.Option(None, "--config", "-c", help="Config YAML (default configs/sim-40gpu.yaml)."),
        policies: str = typer.Option(
            "vertumnus,vertumnus-norepl,vertumnus-static,least-work,sglang-cache-aware,dynamo-kv,lower-bound",
            "--policies",
            help="Comma-separated policy names.",
        ),
        composition: str | None = typer.Option(None, "--composition", help="Composition of the fixed policies."),
        rate_scale: float | None = typer.Option(None, "--rate-scale"),
        target_rps: float | None = typer.Option(None, "--target-rps"),
        slice_spec: str | None = typer.Option(None, "--slice"),
        strict: bool = typer.Option(False, "--strict"),
        out: Path = typer.Option(Path("runs/compare"), "--out", "-o", help=OUT_DIR_HELP),
    ) -> None:
        """Run several policies on one workload; print a table and write compare.md plus plots."""
        from vertumnus.sim.output import markdown_table, plot_runs, table_rows, write_run
        from vertumnus.sim.plots import hit_rate_timeline, ttft_cdf, ttft_timeline
        from vertumnus.sim.runner import run_policy

        names = [p.strip() for p in policies.split(",") if p.strip()]
        if not names:
            raise ValueError("--policies is empty")
        for name in names:
            check_policy(name)
        output_dir(out)
        cfg, cost, wl = _load(config, trace, workload, rate_scale, target_rps, slice_spec, strict)
        results = []
        for name in names:
            r = run_policy(wl.requests, cfg, cost, name, composition)
            results.append(r)
            write_run(r, out / name, {"workload": wl.name})
            typer.echo(f"  {name}: done in {r.summary['sim_wall_s']:.2f} s", err=True)
        table = markdown_table([r.summary for r in results])
        out.mkdir(parents=True, exist_ok=True)
        (out / "compare.md").write_text(f"# {wl.name}: {len(wl.requests)} requests\n\n{table}")
        runs = plot_runs(results)
        ttft_cdf(runs, out / "ttft_cdf.png")
        ttft_timeline(runs, out / "ttft_per_minute.png")
        hit_rate_timeline(runs, out / "prefix_hit_rate.png")
        if sys.stdout.isatty():
            _print_table(table_rows([r.summary for r in results]))
        else:  # pipes and files get the plain markdown table (no wrapping to a guessed width)
            typer.echo(table, nl=False)
        typer.echo(f"wrote {out}/compare.md")

    @bench_app.command("sim")
    def bench_sim(
        trace: str = typer.Option("../shared/traces/conversation_first15min.jsonl", "--trace", help=TRACE_HELP),
        config: str | None = typer.Option(None, "--config", "-c"),
        policy: str = typer.Option("vertumnus", "--policy", "-p"),
        rate_scale: float | None = typer.Option(None, "--rate-scale"),
        repeat: int = typer.Option(1, "--repeat", min=1, help="Runs; the figures of each are printed."),
    ) -> None:
        """Simulator speed: wall time and events/s of one policy on a trace (default: conversation, 15 min)."""
        from vertumnus.sim.runner import run_policy

        check_policy(policy)
        cfg, cost, wl = _load(config, trace, None, rate_scale, None, None, False)
        for i in range(repeat):
            r = run_policy(wl.requests, cfg, cost, policy)
            s = r.summary
            eps = s.get("events_per_s") or 0.0
            cpu = s.get("sim_cpu_s") or 0.0
            typer.echo(
                f"run {i + 1}: {policy} on {wl.name}: {s['requests']} requests, {s.get('events', 0)} events, "
                f"{s['sim_wall_s']:.2f} s wall ({cpu:.2f} s CPU), {eps:,.0f} events/s wall, "
                f"{s.get('events', 0) / max(cpu, 1e-9):,.0f} events/CPU-s, simulated {s.get('sim_time_s', 0):.0f} s"
            )
        typer.echo(json.dumps({k: r.summary.get(k) for k in ("mean_ttft_s", "p90_ttft_s", "reconfigurations")}))


def _print_table(rows: list[list[str]]) -> None:
    from rich.console import Console
    from rich.table import Table

    from vertumnus.sim.output import COLUMNS

    t = Table()
    for _, title, _ in COLUMNS:
        t.add_column(title, justify="left" if title == "policy" else "right")
    for row in rows:
        t.add_row(*row)
    Console().print(t)
