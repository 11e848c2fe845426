"""Writing a run's outputs: summary.json, requests.csv, PNG plots; comparison tables as markdown."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vertumnus.sim.plots import PlotRun, hit_rate_timeline, ttft_cdf, ttft_timeline
from vertumnus.sim.runner import RunResult


def plot_runs(results: Sequence[RunResult]) -> list[PlotRun]:
    return [PlotRun(r.policy, r.arrays, r.composition) for r in results]


def write_run(result: RunResult, out: Path, extra: dict[str, Any] | None = None) -> list[Path]:
    """``out/summary.json``, ``out/requests.csv`` and the three plots; returns the written paths."""
    out.mkdir(parents=True, exist_ok=True)
    summary = dict(result.summary)
    if extra:
        summary.update(extra)
    summary["reconfiguration_log"] = [
        {"time_s": r.time_s, "kind": r.kind, "sources": list(r.sources), "targets": list(r.targets),
         "drain_s": r.drain_s, "switch_s": r.switch_s}
        for r in result.reconfigs
    ]  # fmt: skip
    paths = [out / "summary.json", out / "requests.csv"]
    paths[0].write_text(json.dumps(summary, indent=2) + "\n")
    result.collector.write_csv(paths[1])
    runs = plot_runs([result])
    paths.append(ttft_cdf(runs, out / "ttft_cdf.png", title=f"TTFT CDF ({result.policy})"))
    paths.append(ttft_timeline(runs, out / "ttft_per_minute.png"))
    paths.append(hit_rate_timeline(runs, out / "prefix_hit_rate.png"))
    return paths


COLUMNS = (
    ("policy", "policy", "{}"),
    ("mean_ttft_s", "mean TTFT (s)", "{:.3f}"),
    ("p50_ttft_s", "P50 (s)", "{:.3f}"),
    ("p90_ttft_s", "P90 (s)", "{:.3f}"),
    ("p99_ttft_s", "P99 (s)", "{:.3f}"),
    ("slo_attainment_token_weighted", "SLO att. (tok-w)", "{:.1%}"),
    ("slo_attainment", "SLO att.", "{:.1%}"),
    ("prefix_hit_rate_tokens", "hit rate (tok)", "{:.1%}"),
    ("reconfigurations", "reconf.", "{}"),
    ("replications", "repl.", "{}"),
    ("reclamations", "reclaim", "{}"),
)


def fmt(value: Any, spec: str) -> str:
    if value is None:
        return "–"
    return spec.format(value)


def table_rows(summaries: Sequence[dict[str, Any]], label: str = "policy") -> list[list[str]]:
    """Rows of :data:`COLUMNS` (first column taken from ``label``)."""
    rows = []
    for s in summaries:
        row = [str(s.get(label, s["policy"]))]
        row += [fmt(s.get(key), spec) for key, _, spec in COLUMNS[1:]]
        rows.append(row)
    return rows


def markdown_table(summaries: Sequence[dict[str, Any]], label: str = "policy", header: str = "policy") -> str:
    """A markdown table of run summaries."""
    head = [header] + [title for _, title, _ in COLUMNS[1:]]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] + ["---:"] * (len(head) - 1)) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in table_rows(summaries, label)]
    return "\n".join(lines) + "\n"
