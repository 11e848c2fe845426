"""Regenerate the evaluation report: ``python -m vertumnus.eval.report --out docs/results.md`` (``make results``).

Experiments (40 simulated GPUs, 5 nodes × 8, degrees 4 and 8, configs/sim-40gpu.yaml):

1. the synthetic trace and the conversation trace at several request rates: every policy plus the zero-queue
   lower bound; ``vertumnus-static`` on the composition Vertumnus starts from (chosen from the workload's
   history) and on the baselines' fixed mixed composition, the baselines on that fixed composition;
2. the time-varying workload (configs/workloads/tool-agent-phases.yaml): Vertumnus against every fixed
   composition of the lattice (Vertumnus routing, controller off), per phase;
3. the simulator's speed on the conversation trace;
4. the cache-manager ablation on the hot-prefix test set under KV pressure (:mod:`vertumnus.eval.cache_report`;
   ``--only cache-ablation`` reruns just that section and rewrites it in place);
5. sections 1 and 2 again under the second cost profile (configs/sim-40gpu-aic.yaml: the same config with the
   AIConfigurator-modelled profile), side by side with the first, and the two profiles' E_C curves
   (:mod:`vertumnus.eval.report_profiles`);
6. the out-of-sample test set under both profiles (:mod:`vertumnus.eval.eval_results`;
   ``--only out-of-sample`` reruns just that section and rewrites it in place).

Every figure in docs/results.md is computed here from the runs; nothing is typed in by hand.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from vertumnus.config import VertumnusConfig
from vertumnus.cost_model import CostModel
from vertumnus.eval.cache_report import SECTION as CACHE_SECTION
from vertumnus.eval.cache_report import cache_section
from vertumnus.eval.eval_results import SECTION as OOS_SECTION
from vertumnus.eval.eval_results import results_section
from vertumnus.eval.report_profiles import SECOND_CONFIG, ProfileRuns, render_section
from vertumnus.eval.report_text import BASELINE_COMPOSITION, STATIC_FIXED, render
from vertumnus.sim.inputs import Workload, load_cost, load_sim_config, load_workload_requests, resolve
from vertumnus.sim.policies import BASELINES, LOWER_BOUND, all_compositions
from vertumnus.sim.runner import RunResult, run_policy

TRACES = {
    "synthetic": "../shared/traces/synthetic_trace.jsonl",
    "conversation": "../shared/traces/conversation_first15min.jsonl",
}
# Request rates (requests/s, by rescaling arrival times): from light load to past saturation of 40 GPUs.
RATES = {"synthetic": (10.0, 20.0, 30.0, 40.0), "conversation": (8.0, 16.0, 24.0, 32.0)}
PHASE_WORKLOAD = "configs/workloads/tool-agent-phases.yaml"
# Cache-manager ablation as in the paper: fixed composition, controller off, replication on / off.
STEADY_WORKLOAD = "configs/workloads/tool-agent-steady.yaml"
STEADY_RATES = (30.0, 40.0, 45.0)
STEADY_COMPOSITION = "6xCP4+2xCP8"


@dataclass(slots=True)
class RateExperiment:
    """One trace at one rate: every policy."""

    trace: str
    rate: float
    requests: int
    composition: str  # Vertumnus' initial composition (also vertumnus-static's)
    results: dict[str, RunResult] = field(default_factory=dict)  # label -> run


@dataclass(slots=True)
class PhaseExperiment:
    """The time-varying workload: Vertumnus, its ablations and every fixed composition."""

    workload: Workload
    vertumnus: dict[str, RunResult]
    fixed: dict[str, RunResult]  # composition -> vertumnus-static run
    lower: RunResult


@dataclass(slots=True)
class AblationRun:
    """One rate of the fixed-composition cache ablation: with and without replication."""

    rate: float
    full: RunResult
    norepl: RunResult


@dataclass(slots=True)
class Report:
    cfg: VertumnusConfig
    cost: CostModel
    rate_runs: list[RateExperiment]
    phase: PhaseExperiment | None
    ablation: list[AblationRun]
    bench: dict[str, float]
    wall_s: float = 0.0
    meta: dict[str, str] = field(default_factory=dict)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run_rates(
    cfg: VertumnusConfig, cost: CostModel, name: str, path: str, rates: Sequence[float]
) -> list[RateExperiment]:
    out = []
    for rate in rates:
        wl = load_workload_requests(cfg, trace=path, target_rps=rate)
        first = run_policy(wl.requests, cfg, cost, "vertumnus")
        comp = first.summary["initial_composition"]
        exp = RateExperiment(name, rate, len(wl.requests), comp, {"vertumnus": first})
        runs = [
            ("vertumnus-norepl", "vertumnus-norepl", None),
            ("vertumnus-static", "vertumnus-static", comp),
            (STATIC_FIXED, "vertumnus-static", BASELINE_COMPOSITION),
            *((b, b, BASELINE_COMPOSITION) for b in BASELINES),
            (LOWER_BOUND, LOWER_BOUND, None),
        ]
        for label, pol, fixed in runs:
            exp.results[label] = run_policy(wl.requests, cfg, cost, pol, fixed)
        log(f"  {name} @ {rate:g} rps: {len(wl.requests)} requests, composition {comp}, "
            f"{sum(r.summary['sim_wall_s'] for r in exp.results.values()):.1f} s")  # fmt: skip
        out.append(exp)
    return out


def run_phases(cfg: VertumnusConfig, cost: CostModel, spec: str) -> PhaseExperiment:
    wl = load_workload_requests(cfg, workload=spec)
    vert = {p: run_policy(wl.requests, cfg, cost, p) for p in ("vertumnus", "vertumnus-norepl")}
    fixed = {c: run_policy(wl.requests, cfg, cost, "vertumnus-static", c) for c in all_compositions(cfg)}
    lower = run_policy(wl.requests, cfg, cost, LOWER_BOUND)
    log(f"  {wl.name}: {len(wl.requests)} requests, {len(fixed)} fixed compositions")
    return PhaseExperiment(wl, vert, fixed, lower)


def run_ablation(cfg: VertumnusConfig, cost: CostModel, spec: str, rates: Sequence[float]) -> list[AblationRun]:
    fixed = cfg.model_copy(deep=True)
    fixed.controller.enabled = False
    out = []
    for rate in rates:
        wl = load_workload_requests(fixed, workload=spec, target_rps=rate)
        full = run_policy(wl.requests, fixed, cost, "vertumnus", STEADY_COMPOSITION)
        norepl = run_policy(wl.requests, fixed, cost, "vertumnus-norepl", STEADY_COMPOSITION)
        out.append(AblationRun(rate, full, norepl))
        log(f"  {wl.name} @ {rate:g} rps: {len(wl.requests)} requests")
    return out


def run_bench(cfg: VertumnusConfig, cost: CostModel, path: str, repeat: int = 3) -> dict[str, float]:
    wl = load_workload_requests(cfg, trace=path)
    best: dict[str, float] = {}
    for _ in range(repeat):
        s = run_policy(wl.requests, cfg, cost, "vertumnus").summary
        if not best or s["sim_wall_s"] < best["wall_s"]:
            best = {"requests": s["requests"], "events": s["events"], "wall_s": s["sim_wall_s"],
                    "cpu_s": s["sim_cpu_s"], "events_per_s": s["events_per_s"]}  # fmt: skip
    return best


def second_profile(
    cfg: VertumnusConfig,
    cost: CostModel,
    rate_runs: list[RateExperiment],
    phase: PhaseExperiment | None,
    img: Path,
    md_dir: Path,
) -> str:
    """Section 7: sections 1 and 2 rerun under the second profile's config, rendered beside the first."""
    if not resolve(SECOND_CONFIG).exists():
        return f"## 7. Two cost profiles\n\nSkipped: `{SECOND_CONFIG}` does not exist in this checkout.\n"
    log(f"second cost profile ({SECOND_CONFIG}): sections 1 and 2 again")
    cfg2 = load_sim_config(SECOND_CONFIG)
    cost2 = load_cost(cfg2)
    runs2: list[RateExperiment] = []
    for name, path in TRACES.items():
        runs2 += run_rates(cfg2, cost2, name, path, RATES[name])
    phase2 = run_phases(cfg2, cost2, str(resolve(PHASE_WORKLOAD))) if phase is not None else None
    first = ProfileRuns(cost.profile.source, cfg, cost, rate_runs, phase)
    second = ProfileRuns("AIConfigurator", cfg2, cost2, runs2, phase2)
    return render_section([first, second], img, md_dir)


def _load_text() -> str:
    return (
        f"{platform.machine()}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} when it ended, "
        f"{dt.date.today().isoformat()}"
    )


def splice(doc: str, name: str, section: str) -> str:
    """``doc`` with the marked section ``name`` replaced by ``section`` (appended when it has none)."""
    start, end = f"<!-- section:{name} -->", f"<!-- /section:{name} -->"
    i, j = doc.find(start), doc.find(end)
    if i < 0 or j < i:
        return doc.rstrip("\n") + "\n\n" + section
    return doc[:i] + section.rstrip("\n") + doc[j + len(end) :]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="docs/results.md", help="Markdown file to write (images go to <dir>/img/).")
    ap.add_argument("--config", default=None, help="Simulator config (default configs/sim-40gpu.yaml).")
    ap.add_argument("--quick", action="store_true", help="One rate per trace, no phase workload (smoke run).")
    ap.add_argument("--jobs", type=int, default=1, help="Processes for the out-of-sample test-set runs.")
    ap.add_argument(
        "--only",
        choices=[CACHE_SECTION, OOS_SECTION],
        default=None,
        help="Rerun one marked section and rewrite just it in --out (the rest of the file is kept).",
    )
    args = ap.parse_args(argv)
    if args.only:
        out = Path(args.out)
        if args.only == CACHE_SECTION:
            text = cache_section(args.jobs, log, _load_text)
        else:
            text = results_section(out.parent / "img", out.parent, jobs=args.jobs, log=log)
        out.write_text(splice(out.read_text() if out.exists() else "", args.only, text))
        log(f"rewrote section {args.only} of {out}")
        return 0
    t0 = time.perf_counter()
    cfg = load_sim_config(args.config)
    cost = load_cost(cfg)
    out = Path(args.out)
    img = out.parent / "img"
    rate_runs: list[RateExperiment] = []
    for name, path in TRACES.items():
        if not resolve(path).exists():
            raise ValueError(f"trace {path} not found (the report reads ../shared/traces/)")
        rates = RATES[name][-1:] if args.quick else RATES[name]
        log(f"{name} trace at {', '.join(f'{r:g}' for r in rates)} rps")
        rate_runs += run_rates(cfg, cost, name, path, rates)
    phase = None
    ablation: list[AblationRun] = []
    if not args.quick:
        log("time-varying workload")
        phase = run_phases(cfg, cost, str(resolve(PHASE_WORKLOAD)))
        log("cache-manager ablation")
        ablation = run_ablation(cfg, cost, str(resolve(STEADY_WORKLOAD)), STEADY_RATES)
    profiles = ""  # section 7: the second cost profile side by side
    if not args.quick and args.config is None:
        profiles = "\n" + second_profile(cfg, cost, rate_runs, phase, img, out.parent)
    oos = ""  # out-of-sample test set under every bundled profile (vertumnus.eval.eval_results)
    if not args.quick:
        log("out-of-sample test set")
        oos = "\n" + results_section(img, out.parent, jobs=args.jobs, log=log)
    cache_oos = ""
    if not args.quick:
        log("cache-manager ablation, hot-prefix test set")
        cache_oos = "\n" + cache_section(args.jobs, log, _load_text)
    log("speed benchmark")
    load = os.getloadavg()[0]
    bench = run_bench(cfg, cost, TRACES["conversation"])
    rep = Report(cfg, cost, rate_runs, phase, ablation, bench)
    rep.wall_s = time.perf_counter() - t0
    rep.meta = {
        "date": dt.date.today().isoformat(),
        "machine": f"{platform.machine()}, {platform.processor() or 'cpu'}, Python {platform.python_version()}",
        "load": f"{load:.1f} on {os.cpu_count()} cores",
        "command": "python -m vertumnus.eval.report --out " + str(args.out) + (" --quick" if args.quick else ""),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render(rep, img, out.parent) + profiles + oos + cache_oos)
    log(f"wrote {out} ({rep.wall_s:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
