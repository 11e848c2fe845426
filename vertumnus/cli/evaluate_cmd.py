"""`vertumnus evaluate`: the out-of-sample protocol (a policy against every fixed composition on a set)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import typer

from vertumnus.cli.paths import OUT_DIR_HELP, output_dir
from vertumnus.sim.policies import POLICIES


def register(app: typer.Typer, bench_app: typer.Typer) -> None:
    """Add `evaluate` (heavy imports happen when it runs)."""

    @app.command("evaluate")
    def evaluate_cmd(
        set_path: str = typer.Option("configs/eval/test.yaml", "--set", help="Evaluation set YAML (configs/eval/)."),
        config: str = typer.Option("configs/sim-40gpu.yaml", "--config", "-c", help="Simulator config YAML."),
        policy: str = typer.Option("vertumnus", "--policy", "-p", help=f"Adaptive policy: {', '.join(POLICIES)}."),
        start: str | None = typer.Option(
            None, "--start", help="Start composition for every workload (default: each workload's own)."
        ),
        workload: list[str] = typer.Option([], "--workload", "-w", help="Only these workloads (repeatable)."),
        jobs: int = typer.Option(1, "--jobs", "-j", min=1, help="Simulations run in parallel (processes)."),
        replicates: int | None = typer.Option(
            None,
            "--replicates",
            "-r",
            min=1,
            max=20,
            help="Request streams per run (figures are their means; default: the set's `replicates`).",
        ),
        sweep: list[str] = typer.Option(
            [],
            "--sweep",
            help="Sensitivity: KEY=V1,V2 (e.g. predictive.merge_margin=0.04,0.06; rules.*, predictive.* and "
            "window_s are controller keys, others dotted from the root), a bare KEY, or 'auto'.",
        ),
        plot: Path | None = typer.Option(None, "--plot", help="Sensitivity plot path (default OUT/sensitivity.png)."),
        tuning_set: str | None = typer.Option(
            None,
            "--tuning-set",
            help="Also run every fixed composition on this set, pick the one a search there would choose (lowest "
            "geometric mean of mean TTFT ÷ best fixed) and set the policy against it on --set.",
        ),
        out: Path = typer.Option(Path("runs/evaluate"), "--out", "-o", help=OUT_DIR_HELP),
        progress: bool = typer.Option(True, "--progress/--no-progress", help="Progress on stderr."),
    ) -> None:
        """Run the policy and vertumnus-static on every composition; print verdicts, write JSON + markdown."""
        from vertumnus.eval.eval_report import print_table, sensitivity_table, write_outputs
        from vertumnus.eval.evaluate import evaluate
        from vertumnus.eval.tasks import Task, plan

        output_dir(out)
        t0 = time.perf_counter()

        def tick(done: int, total: int, task: Task) -> None:
            if progress:
                what = f"{task.policy} {task.composition}" + (f" {dict(task.overrides)}" if task.overrides else "")
                what += f" stream {task.replicate}" if task.replicate else ""
                typer.echo(f"  [{done}/{total}] {task.workload}: {what} ({time.perf_counter() - t0:.0f} s)", err=True)

        if sweep and tuning_set:
            raise ValueError("--tuning-set goes with an evaluation, not with --sweep")
        if tuning_set:
            plan(tuning_set, config, policy, None, None, replicates)  # a set that cannot run fails before any run
        if sweep:
            import json

            from vertumnus.eval.sensitivity import parse_sweep, plot_sweep
            from vertumnus.eval.sensitivity import sweep as run_sweep

            p = plan(set_path, config, policy, start, workload or None, replicates)
            grid = parse_sweep(sweep, p.cfg)
            sw = run_sweep(set_path, config, grid, policy, start, jobs, tick, workload or None, replicates)
            paths = write_outputs(sw.base, out)
            (out / "sensitivity.json").write_text(json.dumps(sw.points, indent=1, default=str) + "\n")
            (out / "sensitivity.md").write_text(sensitivity_table(sw.points))
            which = f" ({len(sw.base.workloads)} of {len(p.eval_set.workloads)} workloads)" if workload else ""
            title = f"{policy} on {sw.base.set_name}{which}, {sw.base.profile} profile"
            fig = plot_sweep(sw.points, plot or out / "sensitivity.png", title)
            typer.echo(sensitivity_table(sw.points), nl=False)
            typer.echo(f"wrote {', '.join(str(x) for x in paths)}, {out}/sensitivity.json, {fig}")
            return
        res = evaluate(set_path, config, policy, start, jobs, workload or None, tick, replicates)
        tuned = None
        if tuning_set:
            from vertumnus.eval.fixed_pick import tuning_pick

            tuned = tuning_pick(tuning_set, config, jobs, tick, replicates)
        paths = write_outputs(res, out, tuned)
        if sys.stdout.isatty():
            print_table(res, tuned)
        else:  # pipes and files get the markdown
            from vertumnus.eval.eval_report import markdown_standings, markdown_summary

            typer.echo(markdown_summary(res), nl=False)
            typer.echo("\nAcross the workloads (mean TTFT ÷ each workload's best fixed composition):\n")
            typer.echo(markdown_standings(res, tuned), nl=False)
        typer.echo(f"wrote {', '.join(str(x) for x in paths)} ({time.perf_counter() - t0:.0f} s)")
