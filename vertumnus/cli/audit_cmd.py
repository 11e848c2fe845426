"""`vertumnus audit`: the predictive controller's decisions against the arrivals that followed them (simulated)."""

from __future__ import annotations

import json
from pathlib import Path

import typer


def register(app: typer.Typer, bench_app: typer.Typer) -> None:
    """Add `audit` (heavy imports happen when it runs)."""

    @app.command("audit")
    def audit_cmd(
        set_path: str = typer.Option(
            "configs/eval/tuning.yaml", "--set", help="Evaluation set YAML (default: the tuning set)."
        ),
        config: str = typer.Option("configs/sim-40gpu.yaml", "--config", "-c", help="Simulator config YAML."),
        workload: list[str] = typer.Option([], "--workload", "-w", help="Only these workloads (repeatable)."),
        stream: int = typer.Option(0, "--stream", min=0, max=19, help="Request stream (replicate) to run."),
        span: float | None = typer.Option(
            None, "--span", help="Seconds of what followed each decision to score (default: the forecast span)."
        ),
        moves: bool = typer.Option(False, "--moves", help="List every move begun with its verdict."),
        json_out: Path | None = typer.Option(None, "--json", help="Also write every audited decision here."),
    ) -> None:
        """Run the predictive controller on each workload and re-score every decision it took on the arrivals
        that actually followed: the forecast's error by pool age, and which moves beat staying."""
        from vertumnus.eval.decision_audit import audit_run, format_report, report_json
        from vertumnus.eval.tasks import plan, workload_requests

        p = plan(set_path, config, "vertumnus", workloads=workload or None)
        if p.cfg.controller.policy != "predictive":
            raise ValueError(f"{config}: the audit needs controller.policy: predictive, not {p.cfg.controller.policy}")
        if json_out is not None and json_out.is_dir():
            raise ValueError(f"--json {json_out} is a directory")
        if json_out is not None and not json_out.parent.is_dir():
            raise ValueError(f"--json {json_out}: no directory {json_out.parent}")
        out: dict[str, object] = {}
        for name, start in p.starts.items():
            requests = workload_requests(set_path, config, name, stream)
            report = audit_run(requests, p.cfg, p.cost, start, span)
            typer.echo(format_report(f"{name} (stream {stream}, from {start})", report, moves), nl=False)
            out[name] = report_json(report)
        if json_out is not None:
            json_out.write_text(json.dumps(out, indent=1) + "\n")
            typer.echo(f"wrote {json_out}")
