"""`vertumnus bench control-plane`: placement latency, replay throughput, trie scan and memory figures."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from vertumnus.bench.control_plane import DEFAULT_TRACE
from vertumnus.bench.control_plane_report import print_table, run_benchmark


def register(app: typer.Typer, bench_app: typer.Typer) -> None:
    @bench_app.command("control-plane")
    def control_plane(
        workers: int = typer.Option(64, "--workers", "-n", help="Workers in the placement benchmark."),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of a table."),
        trace: Path = typer.Option(DEFAULT_TRACE, "--trace", help="Mooncake JSONL trace to replay."),
        samples: int = typer.Option(3000, "--samples", help="Timed placements."),
        trie_nodes: int = typer.Option(1_000_000, "--trie-nodes", help="Trie size for the scan / memory figures."),
        scan_active: int = typer.Option(10_000, "--scan-active", help="Nodes with live statistics in the scan."),
        documents: int = typer.Option(
            512, "--documents", help="Cached 128K-token documents in the placement trie (256 nodes each)."
        ),
        profile: Path | None = typer.Option(None, "--profile", help="Cost profile YAML (default: calibrated)."),
    ) -> None:
        """Measure the control plane (real scheduler, cache manager and controller; synthetic traffic)."""
        if workers < 2 or samples < 1 or trie_nodes < 1000 or scan_active < 1 or documents < 1:
            raise ValueError(
                "need --workers ≥ 2, --samples ≥ 1, --trie-nodes ≥ 1000, --scan-active ≥ 1, --documents ≥ 1"
            )
        res = run_benchmark(workers, trace, samples, trie_nodes, scan_active, documents, profile)
        if as_json:
            typer.echo(json.dumps(res))
        else:
            print_table(res)
