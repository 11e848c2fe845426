"""The out-of-sample section of docs/results.md (``make results``): the test set under every bundled profile.

:func:`results_section` runs the evaluation of ``configs/eval/test.yaml`` under each profile's config (a config
that does not exist yet is skipped with a note), the sensitivity sweep under the first profile, the fixed
compositions of the tuning set (the fixed composition a search there picks, :mod:`vertumnus.eval.fixed_pick`), and
renders the markdown. Every figure comes from the runs.
"""

from __future__ import annotations

import datetime as dt
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from vertumnus.eval.eval_report import (
    columns_text,
    criteria_text,
    img_link,
    markdown_controllers,
    markdown_fixed,
    markdown_phases,
    markdown_standings,
    markdown_summary,
    sensitivity_table,
    workload_facts,
)
from vertumnus.eval.eval_set import EvalSet, load_eval_set
from vertumnus.eval.evaluate import evaluate, evaluate_against
from vertumnus.eval.fixed_pick import TuningPick, tuning_pick
from vertumnus.eval.protocol import __doc__ as PROTOCOL_DOC
from vertumnus.eval.sensitivity import parse_sweep, plot_sweep, sweep
from vertumnus.eval.tasks import plan
from vertumnus.eval.verdict import EvalResult
from vertumnus.sim.inputs import resolve

# Marker name of this section in docs/results.md: ``python -m vertumnus.eval.report --only out-of-sample`` reruns it
# and rewrites it in place.
SECTION = "out-of-sample"
TEST_SET = "configs/eval/test.yaml"
TUNING_SET = "configs/eval/tuning.yaml"
# (label, config): the calibrated profile and the AIConfigurator-derived one (profiling issue).
PROFILES: tuple[tuple[str, str], ...] = (
    ("calibrated", "configs/sim-40gpu.yaml"),
    ("AIConfigurator", "configs/sim-40gpu-aic.yaml"),
)
# Swept around the config's values under the first profile only, per controller policy: the parameters that
# policy's decision reads (the rule band and its persistence; the predictive merge caution, which decides
# when capacity is given away — its split side acts on any predicted gain).
SWEEP_KEYS: dict[str, tuple[str, ...]] = {
    "rules": ("rules.theta_up", "rules.theta_low", "rules.persist_windows"),
    "predictive": ("predictive.merge_margin", "predictive.merge_stress_memory_s", "predictive.merge_persist_s"),
}
# ±10% (floats) and ±1 (integers and whole windows): two more runs of the policy per key and workload keep
# `make results` affordable.
SWEEP_FLOAT_STEPS = (0.9, 1.0, 1.1)
SWEEP_INT_STEPS = (-1, 0, 1)


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _streams(s: EvalSet) -> str:
    if s.replicates == 1:
        return " (one request stream per workload)"
    return f" ({s.replicates} request streams per workload: seed, then seed·1000+1 … +{s.replicates - 1}; means)"


def protocol_text(test: EvalSet, tuning: EvalSet | None) -> str:
    """The protocol in prose (from the generator's docstring) and the test set's workloads."""
    doc = (PROTOCOL_DOC or "").split("\n\n", 1)[1].strip()
    out = [doc, ""]
    if tuning is not None:
        out.append(
            f"**Split.** Tuning set `{tuning.source}`: requests {tuning.requests[0]:g}–{tuning.requests[1]:g} of each "
            f"trace, seeds {', '.join(str(w.seed) for w in tuning.workloads)}{_streams(tuning)}; test set "
            f"`{test.source}`: requests {test.requests[0]:g}–{test.requests[1]:g}, seeds "
            f"{', '.join(str(w.seed) for w in test.workloads)}{_streams(test)}. "
            "Thresholds and learned parameters are chosen on the tuning set only; this section reports the test "
            "set. No workload shape (pattern and parameters) is in both sets.\n"
        )
    out.append("| test workload | pattern | traces | seed | start | what |")
    out.append("|---|---|---|---:|---|---|")
    for w in test.workloads:
        out.append(f"| {w.name} | {w.pattern} | {', '.join(w.traces)} | {w.seed} | {test.start_of(w)} | "
                   f"{w.description or '–'} |")  # fmt: skip
    return "\n".join(out) + "\n"


STANDINGS_TEXT = (
    "Across the workloads (the best fixed composition in hindsight is a different one on different workloads; "
    "an operator without the controller runs one fixed composition chosen beforehand): each one's geometric mean "
    "and worst of mean TTFT ÷ the workload's best fixed composition.\n"
)


def profile_text(label: str, config: str, res: EvalResult, tuned: TuningPick | None = None) -> str:
    """One profile's subsection: the verdict table, every fixed composition, the standings across the workloads
    (against the tuning set's fixed pick, where given) and the per-phase tables."""
    out = [f"### Profile: {label} (`{config}`, {res.profile})\n", markdown_summary(res),
           "Whole-run mean TTFT (s) of every fixed composition, best in bold:\n", markdown_fixed(res),
           STANDINGS_TEXT, markdown_standings(res, tuned),
           "<details><summary>Per phase: the policy against each phase's best fixed one</summary>\n"]  # fmt: skip
    for w in res.workloads:
        out.append(f"**{w.name}** {workload_facts(w)}\n")
        out.append(markdown_phases(w, res.policy))
    out.append("</details>\n")
    return "\n".join(out)


# The controller ablation beside each profile's evaluation: the policy the config does not select, its own
# settings from the same config (the rule band of configs/sim-40gpu*.yaml), judged against the same fixed runs.
ABLATION_POLICIES = ("predictive", "rules")


def ablation_text(res: EvalResult, set_path: str, config: str, policy: str, jobs: int = 1) -> str:
    """The configured controller policy and each other one (``controller.policy`` overridden) on the same
    workloads, request streams and fixed runs as ``res``."""
    own = plan(set_path, config, policy).cfg.controller.policy
    rows = [(f"`{own}` (configured)", res)]
    for other in ABLATION_POLICIES:
        if other != own:
            rows.append((f"`{other}`", evaluate_against(res, set_path, config, policy,
                                                        (("controller.policy", other),), jobs)))  # fmt: skip
    return (
        "**Controller ablation.** Each controller policy on the same request streams, against the same fixed "
        "runs (`controller.policy` set, every other setting from the config; the rule controller reads the "
        "config's θ_up / θ_low / Δ_long band and persistence, which the predictive one does not):\n\n"
        + markdown_controllers(rows)
    )


def results_section(
    img_dir: Path,
    md_dir: Path,
    profiles: Sequence[tuple[str, str]] = PROFILES,
    set_path: str = TEST_SET,
    tuning_path: str | None = TUNING_SET,
    jobs: int = 1,
    sweep_keys: Sequence[str] | None = None,
    policy: str = "vertumnus",
    log: Callable[[str], None] = _stderr,
    heading: str = "## Out-of-sample evaluation",
) -> str:
    """Markdown of the test-set evaluation under each profile plus the sensitivity plot (see module docstring)."""
    t_all = time.perf_counter()
    test = load_eval_set(set_path)
    tuning = load_eval_set(tuning_path) if tuning_path and resolve(tuning_path).is_file() else None
    out = [f"<!-- section:{SECTION} -->", heading + "\n", protocol_text(test, tuning)]
    out.append(criteria_text() + " " + columns_text(policy) + "\n")
    first = True
    for label, config in profiles:
        if not resolve(config).is_file():
            out.append(f"### Profile: {label}\n\nSkipped: `{config}` does not exist in this checkout.\n")
            continue
        t0 = time.perf_counter()
        tuned = tuning_pick(tuning.source, config, jobs=jobs) if tuning is not None else None
        if first and (sweep_keys is None or len(sweep_keys) > 0):
            cfg = plan(set_path, config, policy).cfg
            keys = SWEEP_KEYS[cfg.controller.policy] if sweep_keys is None else sweep_keys
            grid = parse_sweep(list(keys), cfg, SWEEP_FLOAT_STEPS, SWEEP_INT_STEPS)
            sw = sweep(set_path, config, grid, policy, jobs=jobs)
            res = sw.base
            out.append(profile_text(label, config, res, tuned))
            fig = plot_sweep(sw.points, img_dir / "eval_sensitivity.png",
                             f"{policy} on the test set ({label} profile): one threshold varied at a time")  # fmt: skip
            out.append(
                "**Sensitivity.** Geometric mean over the test workloads of the policy's mean TTFT ÷ the best fixed "
                "composition's (and ÷ its start held fixed), one controller threshold varied at a time around the "
                "config's value (dotted line); the fixed compositions do not depend on the thresholds.\n"
            )
            out.append(img_link(fig, md_dir, "test-set verdict against each controller threshold"))
            out.append(sensitivity_table(sw.points))
        else:
            res = evaluate(set_path, config, policy, jobs=jobs)
            out.append(profile_text(label, config, res, tuned))
        out.append(ablation_text(res, set_path, config, policy, jobs))
        first = False
        log(f"  test set under {label}: {len(res.workloads)} workloads, {time.perf_counter() - t0:.0f} s")
    # The section can be regenerated on its own, so it states when and where its figures were measured.
    out.append(
        f"Measured: {dt.date.today().isoformat()}, {time.perf_counter() - t_all:.0f} s with {jobs} simulation "
        f"process{'es' if jobs > 1 else ''} (load {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores at the end).\n"
    )
    out.append(f"<!-- /section:{SECTION} -->\n")
    return "\n".join(out)
