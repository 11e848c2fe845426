"""The figures of ``vertumnus bench control-plane``: one flat dict (its JSON output) and the table printed from it."""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any

import typer

from vertumnus.bench.control_plane import measure_decision, measure_placement, measure_replay
from vertumnus.config import DEFAULT_PROFILE, REPO_ROOT
from vertumnus.cost_model import CostModel

# (key, target, "max" = must not exceed / "min" = must reach)
TARGETS: dict[str, tuple[float, str]] = {
    "placement_us_p99": (250.0, "max"),
    "replay_requests_per_s": (3000.0, "min"),
    "bytes_per_trie_node": (400.0, "max"),
    "decision_rules_ms_max": (5.0, "max"),
    "decision_predictive_ms_max": (200.0, "max"),
}


def run_benchmark(
    workers: int,
    trace: Path,
    samples: int,
    trie_nodes: int,
    scan_active: int,
    documents: int = 512,
    profile: Path | None = None,
) -> dict[str, Any]:
    """All figures as one flat dict (the JSON output)."""
    from vertumnus.bench import trie as cache_bench

    load1 = os.getloadavg()[0]
    cost = CostModel.from_file(profile or REPO_ROOT / DEFAULT_PROFILE)
    out: dict[str, Any] = {
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "cost_profile": cost.profile.source,
        "load_avg_1m": round(load1, 2),  # other processes competing for the CPUs (wall figures suffer)
    }
    pl = measure_placement(cost, workers=workers, documents=documents, samples=samples)
    out |= {
        "workers": pl.workers,
        "placement_prompt_tokens": 131072,
        "placement_trie_nodes": pl.trie_nodes,
        "placement_samples": pl.samples,
        "placement_us_p50": round(pl.p50_us, 1),
        "placement_us_p99": round(pl.p99_us, 1),
        "placement_us_mean": round(pl.mean_us, 1),
        "placement_cpu_us_p50": round(pl.cpu_p50_us, 1),
        "placement_cpu_us_p99": round(pl.cpu_p99_us, 1),
    }
    rp = measure_replay(cost, trace)
    out |= {
        "replay_trace": str(trace),
        "replay_requests": rp.requests,
        "replay_completed": rp.completed,
        "replay_wall_s": round(rp.wall_s, 3),
        "replay_requests_per_s": round(rp.requests_per_s, 1),
        "replay_cpu_s": round(rp.cpu_s, 3),
        "replay_requests_per_cpu_s": round(rp.requests_per_cpu_s, 1),
        "replay_events": rp.events,
        "replay_reconfigurations": rp.reconfigurations,
        "replay_cache_ops": rp.cache_ops,
        "replay_composition": f"{rp.composition_start} -> {rp.composition_end}",
    }
    dc = measure_decision(cost, workers=workers)
    out |= {
        "decision_forecast_requests": dc.forecast_requests,
        "decision_queued_requests": dc.queued_requests,
        "decision_rules_ms_p50": round(dc.rules_ms_p50, 3),
        "decision_rules_ms_max": round(dc.rules_ms_max, 3),
        "decision_predictive_ms_p50": round(dc.predictive_ms_p50, 2),
        "decision_predictive_ms_max": round(dc.predictive_ms_max, 2),
        "decision_predictive_moves": dc.predictive_moves,
    }
    st = cache_bench.build_trie(trie_nodes, n_workers=workers)
    sc = cache_bench.scan_ms(st, scan_active)
    del st
    out |= {
        "scan_ms": round(sc["scan_ms"], 3),
        "scan_active_nodes": int(sc["active_nodes"]),
        "scan_trie_nodes": int(sc["trie_nodes"]),
    }
    mem = cache_bench.bytes_per_trie_node(trie_nodes, n_workers=workers)
    out |= {"bytes_per_trie_node": round(mem["bytes_per_trie_node"], 1), "memory_trie_nodes": int(mem["trie_nodes"])}
    for key, (target, kind) in TARGETS.items():
        v = float(out[key])
        out[f"{key}_target"] = target
        out[f"{key}_ok"] = v <= target if kind == "max" else v >= target
    return out


def print_table(res: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(
        title=f"control plane ({res['machine']}, {res['cpus']} CPUs, load {res['load_avg_1m']}, "
        f"profile {res['cost_profile']})"
    )
    for col in ("figure", "value", "target"):
        t.add_column(col)
    rows = [
        ("placement_us_p50", "µs", ""),
        ("placement_us_p99", "µs", "≤ 250"),
        ("placement_cpu_us_p50", "µs CPU", ""),
        ("placement_cpu_us_p99", "µs CPU", ""),
        ("replay_requests_per_s", "req/s", "≥ 3000"),
        ("replay_requests_per_cpu_s", "req/CPU-s", ""),
        ("decision_rules_ms_max", "ms", "≤ 5"),
        ("decision_predictive_ms_p50", "ms", ""),
        ("decision_predictive_ms_max", "ms", "≤ 200 (off the request path)"),
        ("scan_ms", "ms", "grows with active nodes"),
        ("bytes_per_trie_node", "B", "≤ 400"),
    ]
    for key, unit, target in rows:
        ok = res.get(f"{key}_ok")
        mark = "" if ok is None else (" ✓" if ok else " ✗")
        t.add_row(key, f"{res[key]} {unit}", target + mark)
    Console().print(t)
    typer.echo(
        f"placement: {res['workers']} workers, 128K-token prompt, trie {res['placement_trie_nodes']} nodes; "
        f"replay: {res['replay_completed']}/{res['replay_requests']} requests in {res['replay_wall_s']} s, "
        f"{res['replay_reconfigurations']} reconfigurations, {res['replay_cache_ops']} cache ops "
        f"({res['replay_composition']}); scan: {res['scan_active_nodes']} active of {res['scan_trie_nodes']} nodes; "
        f"decision: {res['decision_predictive_moves']} moves scored on {res['decision_forecast_requests']} forecast "
        f"and {res['decision_queued_requests']} queued requests"
    )
