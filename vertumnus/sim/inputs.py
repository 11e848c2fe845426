"""Workload and cost-model loading shared by the CLI, the report and the benchmark."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from vertumnus.config import REPO_ROOT, VertumnusConfig, load_config
from vertumnus.cost_model import CostModel
from vertumnus.sim.phases import PhaseWorkload, generate, load_workload
from vertumnus.sim.workload import ParseIssue, build_requests, parse_slice, read_trace
from vertumnus.types import Request

DEFAULT_SIM_CONFIG = "configs/sim-40gpu.yaml"


@dataclass(slots=True)
class Workload:
    """Requests plus where they came from."""

    name: str
    requests: list[Request]
    issues: list[ParseIssue] = field(default_factory=list)
    phases: PhaseWorkload | None = None


def resolve(path: str) -> Path:
    """A path as given if it exists (CWD), else relative to the repository root."""
    p = Path(path)
    return p if p.is_absolute() or p.exists() else REPO_ROOT / p


def load_sim_config(path: str | None) -> VertumnusConfig:
    """The simulator's config (default ``configs/sim-40gpu.yaml``)."""
    return load_config(resolve(path or DEFAULT_SIM_CONFIG))


def load_cost(cfg: VertumnusConfig) -> CostModel:
    """The configured cost profile."""
    return CostModel.from_file(cfg.resolve_path(cfg.cost_model.profile))


def load_workload_requests(
    cfg: VertumnusConfig,
    trace: str | None = None,
    workload: str | None = None,
    rate_scale: float | None = None,
    target_rps: float | None = None,
    slice_spec: str | None = None,
    strict: bool = False,
) -> Workload:
    """Exactly one of ``trace`` (Mooncake JSONL) or ``workload`` (``phases:...`` or a YAML file)."""
    if (trace is None) == (workload is None):
        raise ValueError("give exactly one of --trace FILE or --workload SPEC")
    sl = parse_slice(slice_spec) if slice_spec else None
    if trace is not None:
        records, issues = read_trace(resolve(trace), strict=strict)
        reqs = build_requests(records, cfg, rate_scale, target_rps, sl)
        return Workload(Path(trace).stem, reqs, issues)
    assert workload is not None
    spec = workload if workload.strip().startswith("phases:") else str(resolve(workload))
    w = load_workload(spec)
    reqs = build_requests(generate(w), cfg, rate_scale, target_rps, sl, prefix="g")
    return Workload(w.name, reqs, [], w)


def report_issues(issues: list[ParseIssue], limit: int = 10) -> None:
    """Print skipped-line warnings to stderr (the first ``limit``, then a count)."""
    if not issues:
        return
    for issue in issues[:limit]:
        print(f"warning: skipped malformed trace {issue}", file=sys.stderr)
    if len(issues) > limit:
        print(f"warning: ... and {len(issues) - limit} more malformed lines skipped", file=sys.stderr)
