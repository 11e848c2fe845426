"""`vertumnus bench serve`: router overhead and front-end throughput with the trivial engine."""

from __future__ import annotations

from pathlib import Path

import typer


def register(app: typer.Typer, bench_app: typer.Typer) -> None:
    @bench_app.command("serve")
    def bench_serve(
        config: Path = typer.Option(Path("configs/local.yaml"), "--config", "-c", help="Server config (pool shape)."),
        requests: int = typer.Option(3000, "--requests", "-n", min=100, help="Requests of the throughput phase."),
        concurrency: int = typer.Option(32, "--concurrency", min=1, help="Concurrent clients (throughput phase)."),
        words: int = typer.Option(120, "--words", min=1, help="Words of each shared prompt prefix."),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    ) -> None:
        """Measure HTTP in → worker start (p50/p99) and requests/s of the front end + pool (instant engine)."""
        from vertumnus.bench.serve import report, run_bench
        from vertumnus.cli.serve_cmd import _resolve

        typer.echo(report(run_bench(_resolve(config), requests, concurrency, words), as_json))
