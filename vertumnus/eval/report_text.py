"""Markdown and figures of the evaluation report (data come from :mod:`vertumnus.eval.report`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vertumnus.eval.fmt import num3, share
from vertumnus.eval.phase_stats import lower_bound_violations, phase_summaries, phase_verdicts
from vertumnus.eval.report_caveats import limits, profile_notice
from vertumnus.sim.output import markdown_table, plot_runs
from vertumnus.sim.plots import PlotRun, hit_rate_timeline, rate_lines, ttft_cdf, ttft_timeline
from vertumnus.sim.policies import BASELINES, LOWER_BOUND

if TYPE_CHECKING:
    from vertumnus.config import CacheConfig, ControllerConfig
    from vertumnus.eval.report import RateExperiment, Report
    from vertumnus.sim.runner import RunResult

BASELINE_COMPOSITION = "6xCP4+2xCP8"  # baselines' fixed mix: length-threshold needs a large degree to use
STATIC_FIXED = f"vertumnus-static {BASELINE_COMPOSITION}"


def _img(path: Path, md_dir: Path, alt: str) -> str:
    return f"![{alt}]({os.path.relpath(path, md_dir)})\n"


def _setup(rep: Report) -> str:
    c, prof = rep.cfg, rep.cost.profile
    pool, cc, ca, slo = c.pool, c.controller, c.cache, c.slo
    rows = [
        ("pool", f"{pool.nodes} nodes × {pool.gpus_per_node} GPUs = {pool.total_gpus} GPUs, degrees {pool.degrees}"),
        ("cost profile", f"`{c.cost_model.profile}` — **{prof.source}**, {prof.model} on {prof.hardware}"),
        ("KV capacity", f"{pool.kv_capacity_blocks_per_rank} blocks of {ca.block_tokens} tokens per GPU, LRU"),
        ("copy bandwidth", f"{ca.intra_node_gbps:g} GB/s intra-node, {ca.inter_node_gbps:g} GB/s inter-node, "
                           f"{ca.bytes_per_block / 2**20:.1f} MiB per block"),
        ("TTFT SLO", f"τ = {slo.base_s:g} s + {slo.per_token_s:g} s × L; T_ext = {slo.t_ext_s:g} s"),
        ("scheduler", f"β = {c.scheduler.beta:g}, λ = {c.scheduler.lam:g}"),
        ("controller", _controller_setting(cc, pool.sim_switch_s)),
        ("cache manager", _cache_setting(ca)),
    ]  # fmt: skip
    lines = ["| setting | value |", "|---|---|"] + [f"| {k} | {v} |" for k, v in rows]
    return "\n".join(lines) + "\n"


def _controller_setting(cc: ControllerConfig, sim_switch_s: float) -> str:
    """The controller's row of the setup table: its policy and the parameters that policy reads."""
    if cc.policy == "rules":
        r = cc.rules
        return (f"`controller.policy: rules`: window {cc.window_s:g} s, θ_up {r.theta_up:g}, θ_low {r.theta_low:g}, "
                f"Δ_long {r.delta_long:g}, persist {r.persist_windows}, switch {sim_switch_s:g} s")  # fmt: skip
    p = cc.predictive
    check = "window ends only" if p.check_interval_s is None else f"split checks every {p.check_interval_s:g} s"
    return (f"`controller.policy: predictive`: window {cc.window_s:g} s, replay of the last {p.span_s:g} s, "
            f"burst span {p.burst_span_s:g} s, {check}; split margin {p.split_margin:g}, merge margin "
            f"{p.merge_margin:g} (wanted for {p.merge_persist_s:g} s, load swings of the last "
            f"{p.merge_stress_memory_s:g} s), ≤ {p.max_concurrent_merges} merge(s) at once, switch priced at "
            f"{p.switch_s:g} s until observed, simulated switch {sim_switch_s:g} s")  # fmt: skip


def _cache_setting(ca: CacheConfig) -> str:
    """The cache manager's row of the setup table: its policy and the parameters that policy reads."""
    scan = f"scan {ca.scan_interval_s:g} s, decay {ca.decay:g}, ≤ {ca.max_ops_per_scan} ops/list/scan"
    if ca.policy == "rules":
        return (f"`cache.policy: rules`: {scan}, θ_inter {ca.theta_inter:g}, θ_intra {ca.theta_intra:g}, "
                f"θ_reclaim {ca.theta_reclaim:g}")  # fmt: skip
    return (f"`cache.policy: queue_aware`: fetch before the prefill at queues ≤ {ca.fetch_max_queue_s:g} s; push "
            f"copies of prefixes ≥ {ca.hot_min_blocks} blocks with access ≥ {ca.hot_min_access:g} gaining ≥ "
            f"{ca.copy_gain_s:g} s; {scan}, θ_inter {ca.theta_inter:g}; reclaim (θ_reclaim {ca.theta_reclaim:g}) "
            f"only at pressure ≥ {ca.reclaim_pressure:g}")  # fmt: skip


def _labelled_table(results: dict[str, RunResult]) -> str:
    return markdown_table([dict(r.summary, label=k) for k, r in results.items()], label="label")


def _labelled_runs(results: dict[str, RunResult]) -> list[PlotRun]:
    return [PlotRun(k, r.arrays, r.composition) for k, r in results.items()]


def _rate_section(rep: Report, name: str, img: Path, md_dir: Path) -> str:
    exps = [e for e in rep.rate_runs if e.trace == name]
    if not exps:
        return ""
    out = [f"### {name.capitalize()} trace\n"]
    for e in exps:
        out.append(
            f"**{e.rate:g} requests/s** ({e.requests} requests; Vertumnus starts from {e.composition}, chosen from "
            f"the workload's history, and so does `vertumnus-static`; the baselines run on {BASELINE_COMPOSITION})\n"
        )
        out.append(_labelled_table(e.results))
        out.append("")
    policies = list(exps[0].results)
    rates = [e.rate for e in exps]
    series = {p: [e.results[p].summary for e in exps] for p in policies if p != STATIC_FIXED}
    fig = rate_lines(rates, series, img / f"{name}_rates.png", title=f"{name} trace, 40 GPUs")
    out.append(_img(fig, md_dir, f"{name}: TTFT and SLO attainment against request rate"))
    top = exps[-1]
    cdf = ttft_cdf(_labelled_runs(top.results), img / f"{name}_cdf_{top.rate:g}rps.png",
                   title=f"{name} trace at {top.rate:g} req/s: TTFT CDF")  # fmt: skip
    out.append(_img(cdf, md_dir, f"{name} TTFT CDF at {top.rate:g} req/s"))
    # Timeline at the rate where Vertumnus reconfigured most (ties: the higher rate), against no reconfiguration.
    busy = max(exps, key=lambda e: (e.results["vertumnus"].summary["reconfigurations"], e.rate))
    v = busy.results["vertumnus"]
    tl = ttft_timeline(plot_runs([v, busy.results["vertumnus-static"]]), img / f"{name}_timeline_{busy.rate:g}rps.png",
                       composition_of="vertumnus", title=f"{name} trace at {busy.rate:g} req/s")  # fmt: skip
    out.append(
        f"Mean TTFT over time and Vertumnus' composition at {busy.rate:g} req/s ({v.summary['reconfigurations']} "
        f"reconfigurations), against `vertumnus-static` on the same starting composition:\n"
    )
    out.append(_img(tl, md_dir, f"{name} mean TTFT over time and composition at {busy.rate:g} req/s"))
    return "\n".join(out) + "\n"


def _standing(rep: Report) -> str:
    """Vertumnus against the best baseline per trace and rate."""
    head = ("trace", "rate", "mean: vertumnus", "best baseline", "ratio", "P90: vertumnus", "best baseline", "ratio",
            "SLO att. (tok-w): vertumnus", "best baseline")  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for e in rep.rate_runs:
        v = e.results["vertumnus"].summary
        others = {k: r.summary for k, r in e.results.items() if k in BASELINES}
        cells = [e.trace, f"{e.rate:g}"]
        for key in ("mean_ttft_s", "p90_ttft_s"):
            name, best = min(others.items(), key=lambda kv: kv[1][key])
            cells += [num3(v[key]), f"{num3(best[key])} ({name})", f"{v[key] / best[key]:.2f}"]
        key = "slo_attainment_token_weighted"
        name, best = max(others.items(), key=lambda kv: kv[1][key])
        cells += [share(v[key]), f"{share(best[key])} ({name})"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _phase_section(rep: Report, img: Path, md_dir: Path) -> tuple[str, dict[str, Any]]:
    ph = rep.phase
    if ph is None:
        return "", {}
    w = ph.workload.phases
    assert w is not None
    bounds = w.phase_bounds()
    v_sum = phase_summaries(ph.vertumnus["vertumnus"].arrays, bounds)
    fixed_sum = {c: phase_summaries(r.arrays, bounds) for c, r in ph.fixed.items()}
    norepl = phase_summaries(ph.vertumnus["vertumnus-norepl"].arrays, bounds)
    lb = phase_summaries(ph.lower.arrays, bounds)
    verdicts = phase_verdicts(v_sum, fixed_sum)
    head = "| phase | rate (req/s) | long share | " + " | ".join(ph.fixed) + " | vertumnus | norepl | lower bound |"
    lines = [
        f"{len(ph.workload.requests)} requests from `{ph.workload.name}` (seed {w.seed}); mean TTFT (s) per phase "
        "by arrival time. Fixed compositions use Vertumnus' routing with the controller off "
        "(`vertumnus-static --composition X`).\n",
        head,
        "|" + "---|" * (head.count("|") - 1),
    ]
    for k, p in enumerate(w.phases):
        lo, hi = bounds[k]
        cells = [f"{k + 1} ({lo:g}–{hi:g} s)", f"{p.rate_rps:g}", f"{p.long_share:.0%}"]
        best = verdicts[k].best_fixed
        for c in ph.fixed:
            val = num3(fixed_sum[c][k]["mean_ttft_s"])
            cells.append(f"**{val}**" if c == best else val)
        cells += [num3(v_sum[k]["mean_ttft_s"]), num3(norepl[k]["mean_ttft_s"]), num3(lb[k]["mean_ttft_s"])]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("\nBold: the best fixed composition of the phase.\n")
    lines.append("Whole run:\n")
    runs = [*ph.vertumnus.values(), *ph.fixed.values(), ph.lower]
    labels = [*ph.vertumnus, *(f"static {c}" for c in ph.fixed), LOWER_BOUND]
    sums = [dict(r.summary, label=lab) for r, lab in zip(runs, labels, strict=True)]
    lines.append(markdown_table(sums, label="label", header="run"))
    v = ph.vertumnus["vertumnus"]
    s = v.summary
    lines.append(
        f"Vertumnus started at {s['initial_composition']} and made {s['reconfigurations']} reconfigurations "
        f"({s.get('splits', 0)} splits, {s.get('merges', 0)} merges; drain mean {num3(s.get('mean_drain_s'))} s, "
        f"max {num3(s.get('max_drain_s'))} s; switch mean {num3(s.get('mean_switch_s'))} s); it ended at "
        f"{s['final_composition']}.\n"
    )
    pr = [PlotRun("vertumnus", v.arrays, v.composition)]
    pr += [PlotRun(f"static {c}", ph.fixed[c].arrays, ph.fixed[c].composition) for c in ph.fixed]
    fig = ttft_timeline(pr, img / "phases_timeline.png", width_s=30.0, composition_of="vertumnus",
                        title=f"{ph.workload.name}: mean TTFT", phases=bounds)  # fmt: skip
    lines.append(_img(fig, md_dir, "time-varying workload: mean TTFT per 30 s and Vertumnus' composition"))
    hr = hit_rate_timeline([*pr[:1], PlotRun("vertumnus-norepl", ph.vertumnus["vertumnus-norepl"].arrays, [])],
                           img / "phases_hit_rate.png", width_s=30.0)  # fmt: skip
    lines.append(_img(hr, md_dir, "time-varying workload: prefix hit rate"))
    winners = {vd.best_fixed for vd in verdicts}
    return "\n".join(lines) + "\n", {"verdicts": verdicts, "winners": winners}


def _ablation(rep: Report) -> tuple[str, list[tuple[str, float, float, float]]]:
    """Rows: every trace rate (controller on in both) and the fixed-composition steady workload."""
    head = ("workload", "rate", "composition", "P90 vertumnus (s)", "P90 norepl (s)", "P90 change",
            "mean change", "hit rate", "hit rate norepl", "replications", "reclamations")  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|---|---:|---|" + "---:|" * (len(head) - 3)]
    rows: list[tuple[str, float, str, dict[str, Any], dict[str, Any]]] = []
    for e in rep.rate_runs:
        rows.append((e.trace, e.rate, "controller on", e.results["vertumnus"].summary,
                     e.results["vertumnus-norepl"].summary))  # fmt: skip
    for a in rep.ablation:
        rows.append(("tool-agent-steady", a.rate, f"fixed {a.full.summary['initial_composition']}",
                     a.full.summary, a.norepl.summary))  # fmt: skip
    top: dict[str, tuple[str, float, float, float]] = {}
    for name, rate, comp, x, y in rows:
        p90 = (x["p90_ttft_s"] - y["p90_ttft_s"]) / y["p90_ttft_s"]
        mean = (x["mean_ttft_s"] - y["mean_ttft_s"]) / y["mean_ttft_s"]
        lines.append(
            f"| {name} | {rate:g} | {comp} | {num3(x['p90_ttft_s'])} | {num3(y['p90_ttft_s'])} | {p90:+.1%} | "
            f"{mean:+.1%} | {share(x['prefix_hit_rate_tokens'])} | {share(y['prefix_hit_rate_tokens'])} | "
            f"{x['replications']} | {x['reclamations']} |"
        )
        top[name] = (name, rate, x["p90_ttft_s"], y["p90_ttft_s"])  # rows come in rising rate order
    changes = [(x["p90_ttft_s"] - y["p90_ttft_s"]) / y["p90_ttft_s"] for _, _, _, x, y in rows]
    down, up = sum(c <= -0.01 for c in changes), sum(c >= 0.01 for c in changes)
    c = rep.cfg.cache
    ctl = [x for _, _, comp, x, _ in rows if comp == "controller on"]
    single, n_ctl = sum("+" not in str(x.get("final_composition", "+")) for x in ctl), len(ctl)
    counts = (
        "Replications and reclamations count confirmed ops. Replication lowers P90 TTFT by 1% or more in "
        f"{down} of {len(rows)} rows, raises it by 1% or more in {up}, and leaves it within ±1% in the other "
        f"{len(rows) - down - up}. {single} of the {n_ctl} controller-on runs end on a single "
        "degree, where only intra-degree copies apply (inter-degree copies need a degree without a copy next to "
        "one with it). "
    )
    if c.policy == "rules":
        text = (
            f"Policy `cache.policy: rules` (the paper's scan), thresholds (`configs/sim-40gpu.yaml`): scan every "
            f"{c.scan_interval_s:g} s, θ_inter {c.theta_inter:g} s, θ_intra {c.theta_intra:g}, θ_reclaim "
            f"{c.theta_reclaim:g}, decay {c.decay:g}, at most {c.max_ops_per_scan} ops per list per scan; the config "
            "says how they were chosen. " + counts + "Few replications means the scan's thresholds were not "
            "reached (access[z,C] > r·θ_intra, missed[z,C] > θ_inter); a request the scheduler sends to an idle "
            "worker recomputes the prefix there and so makes a new copy without the manager. The config's comment "
            "records the threshold search on these traces that chose them (in-sample) and how they interact with "
            "the controller band."
        )
    else:
        text = (
            "Policy `cache.policy: queue_aware` (the default; docs/design.md §3): same-degree copies are made at "
            f"placement, a fetch of the longest held prefix before the prefill on a worker queued ≤ "
            f"{c.fetch_max_queue_s:g} s when the scheduler prices it cheapest that way, and a push copy of a hot "
            f"prefix (≥ {c.hot_min_blocks} blocks, access ≥ {c.hot_min_access:g}) off a queued holder to an idle "
            f"same-degree worker when it gains ≥ {c.copy_gain_s:g} s; the scan (every {c.scan_interval_s:g} s, decay "
            f"{c.decay:g}, at most {c.max_ops_per_scan} ops per list) keeps its inter-degree list (θ_inter "
            f"{c.theta_inter:g} s) and reclaims (θ_reclaim {c.theta_reclaim:g}) only on a worker at pressure ≥ "
            f"{c.reclaim_pressure:g} whose incoming copies do not fit; θ_intra is not used. Engines evict the least "
            f"recently used block reused by fewer than {c.retain_reused} prefill(s) while the others fill at most "
            f"{c.retain_fraction:g} of a worker's KV capacity (retention; `vertumnus-norepl`: plain LRU). "
            + counts
            + "Few "
            "replications means few requests met a hot prefix behind a queued holder; a request the scheduler "
            "sends to an idle worker without a fetch recomputes the prefix there. The queue bound and the "
            "shortest prefix worth a fetch or copy (hot_min_blocks) and retention were chosen on the cache "
            "ablation's tuning set "
            "(configs/eval/cache-tuning.yaml, searched by vertumnus/bench/cache_tune.py; the hot-prefix test set "
            "is the section below); docs/tuning.md records those searches and the one that chose the scan "
            "thresholds under `rules` (in-sample)."
        )
    lines += ["", text]
    return "\n".join(lines) + "\n", list(top.values())


def _lb_check(exps: list[RateExperiment], phase_runs: list[tuple[Any, Any]]) -> tuple[int, int]:
    """(violations, runs checked) of per-request TTFT ≥ lower bound."""
    bad = runs = 0
    for e in exps:
        lb = e.results[LOWER_BOUND].arrays["ttft"]
        for pol, r in e.results.items():
            if pol != LOWER_BOUND:
                bad += lower_bound_violations(r.arrays["ttft"], lb)
                runs += 1
    for r, lb in phase_runs:
        bad += lower_bound_violations(r.arrays["ttft"], lb.arrays["ttft"])
        runs += 1
    return bad, runs


def render(rep: Report, img: Path, md_dir: Path) -> str:
    """The whole report as markdown; figures are written under ``img``."""
    img.mkdir(parents=True, exist_ok=True)
    prof = rep.cost.profile
    parts = [
        "# Evaluation results (simulated)\n",
        f"Generated by `{rep.meta.get('command', '')}` (`make results`) on {rep.meta.get('date', '')} "
        f"({rep.meta.get('machine', '')}; {rep.wall_s:.0f} s in all). Every number and figure below is computed "
        "by that command from the simulator's runs; rerun it to refresh them. The two out-of-sample sections "
        "can also be rerun alone (`make results-oos`, `make cache-ablation`) and each states "
        "when its figures were measured.\n",
        profile_notice(rep),
        "## Setup\n",
        _setup(rep),
        f"Policies: `vertumnus` (placement cost J, controller with `controller.policy: {rep.cfg.controller.policy}`, "
        "cache manager with `cache.policy: "
        f"{rep.cfg.cache.policy}`), `vertumnus-norepl` (no replication / reclamation), `vertumnus-static` (no "
        "reconfiguration), baselines on a fixed composition with engine-native "
        "LRU caching only: `round-robin`, `least-work` (least outstanding predicted seconds), `length-threshold` "
        "(> 32K tokens → the largest degree), `sglang-cache-aware` (sglang-router defaults: match ratio ≥ 0.5 → best "
        "match, else fewest in-flight requests; imbalance override when max − min > 32 requests and max > "
        "1.0001 × min; loads counted in requests), `dynamo-kv` (uncached prompt blocks + outstanding prefill "
        "blocks), and `lower-bound` (every request at its best degree with its full matched prefix, no queueing). "
        "Rates are reached by rescaling the trace's arrival times.\n",
        "## 1. Traces at several request rates\n",
    ]
    parts += [
        f"Vertumnus against the best of the five baselines (all on {BASELINE_COMPOSITION}) at each point; ratio < 1: "
        "Vertumnus is better. The per-rate tables below also show the ablations and the lower bound.\n",
        _standing(rep),
    ]
    for name in dict.fromkeys(e.trace for e in rep.rate_runs):
        parts.append(_rate_section(rep, name, img, md_dir))
    phase_md, ph = _phase_section(rep, img, md_dir)
    if phase_md:
        parts += ["## 2. Time-varying workload\n", phase_md]
    abl_md, top = _ablation(rep)
    parts += ["## 3. Prefix-cache manager ablation (`vertumnus` vs `vertumnus-norepl`)\n", abl_md]
    phase_lb = []
    if rep.phase is not None:
        phase_lb = [(r, rep.phase.lower) for r in [*rep.phase.vertumnus.values(), *rep.phase.fixed.values()]]
    bad, nruns = _lb_check(rep.rate_runs, phase_lb)
    parts += ["## 4. Checks against the paper's expected shape\n", _checks(ph, top, bad, nruns)]
    b = rep.bench
    parts += [
        "## 5. Simulator speed\n",
        f"`vertumnus` (full control plane) on conversation_first15min ({b['requests']:.0f} requests, 40 GPUs, "
        f"original rate), best of 3: **{b['wall_s']:.2f} s wall** ({b['cpu_s']:.2f} s CPU), {b['events']:.0f} events, "
        f"**{b['events_per_s']:,.0f} events/s** of wall time ({rep.meta.get('machine', '')}, load average "
        f"{rep.meta.get('load', '?')} while measuring). `vertumnus bench sim` prints the same figures.\n",
    ]
    parts += ["## 6. Limits of the simulation\n", limits(prof.source)]
    return "\n".join(parts)


def _checks(ph: dict[str, Any], top: list[tuple[str, float, float, float]], bad: int, nruns: int) -> str:
    rows = []
    if ph:
        winners = ph["winners"]
        one = len(winners) == 1
        rows.append(("No fixed composition wins every phase",
                     f"best fixed per phase: {', '.join(v.best_fixed for v in ph['verdicts'])}",
                     "no — one composition wins all phases" if one else "yes"))  # fmt: skip
        ratios = [v.ratio for v in ph["verdicts"]]
        worst = max(ratios)
        rows.append(("Vertumnus matches or beats the better fixed composition per phase",
                     "Vertumnus / best fixed mean TTFT per phase: " + ", ".join(f"{r:.2f}" for r in ratios),
                     "yes" if worst <= 1.05 else f"no — worst phase {worst:.2f}× (tolerance 1.05×)"))  # fmt: skip
    for name, rate, a, b in top:
        rows.append((f"Cache manager lowers P90 TTFT at high load ({name}, {rate:g} req/s)",
                     f"P90 {a:.3f} s vs {b:.3f} s without replication", "yes" if a < b else "no"))  # fmt: skip
    rows.append(("Every policy at or above the lower bound (per request)",
                 f"{bad} violations over {nruns} runs", "yes" if bad == 0 else "no"))  # fmt: skip
    lines = ["| expected (paper) | measured | holds |", "|---|---|---|"]
    lines += [f"| {a} | {b} | {c} |" for a, b, c in rows]
    return "\n".join(lines) + "\n"
