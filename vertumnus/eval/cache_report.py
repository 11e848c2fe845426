"""Markdown of the cache-manager ablation on the hot-prefix test set (a section of docs/results.md).

Every figure is computed from :func:`vertumnus.eval.cache_eval.evaluate_cache` runs; nothing is typed in by hand.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from vertumnus.eval.cache_eval import (
    MODES,
    P90_GAIN,
    P90_SLACK,
    POLICIES,
    CacheEvalResult,
    CacheEvalSet,
    load_cache_set,
    verdicts,
)
from vertumnus.eval.fmt import rel_change, signed_pct
from vertumnus.sim.inputs import load_sim_config

TEST_SET = "configs/eval/cache-test.yaml"
TUNING_SET = "configs/eval/cache-tuning.yaml"
CONFIG = "configs/sim-40gpu.yaml"
SECTION = "cache-ablation"  # marker name: `python -m vertumnus.eval.report --only cache-ablation` rewrites it


def _gb(blocks: float | None, bpb: int) -> str:
    return f"{(blocks or 0) * bpb / 1e9:,.0f}"


DETAILED = ("rules", "queue_aware")  # the per-workload tables; queue_aware's parts appear in the verdict table


def workload_table(res: CacheEvalResult, es: CacheEvalSet, workload: str, mode: str) -> str:
    pols = DETAILED
    head = "| KV / GPU | load | norepl mean / P90 / P99 (s) | SLO | hit | evicted |"
    sep = "|---|---:|---|---:|---:|---:|"
    for p in pols:
        head += f" {p}: Δmean / ΔP90 / ΔP99 | hit | copies (GB) / reclaims | ordered: fetch / push / scan | evicted |"
        sep += "---|---:|---|---|---:|"
    rows = [head, sep]
    bpb = res.bytes_per_block
    for gpu, blocks in res.capacities.items():
        for load in es.loads:
            b = res.run(workload, gpu, load, mode, "norepl")
            line = (
                f"| {gpu} ({blocks} blocks) | {load:g} | {b['mean_ttft_s']:.3f} / {b['p90_ttft_s']:.3f} / "
                f"{b['p99_ttft_s']:.3f} | {b['slo_attainment_token_weighted']:.3f} | "
                f"{b['prefix_hit_rate_tokens']:.3f} | {b['evicted_blocks']:,.0f} |"
            )
            for p in pols:
                a = res.run(workload, gpu, load, mode, p)
                mean, p90, p99 = (
                    signed_pct(rel_change(a[k], b[k])) for k in ("mean_ttft_s", "p90_ttft_s", "p99_ttft_s")
                )
                line += (
                    f" {mean} / {p90} / {p99}"
                    f" | {a['prefix_hit_rate_tokens']:.3f} | {a['replications']:,.0f} "
                    f"({_gb(a['copied_blocks'], bpb)}) / {a['reclamations']:,.0f} | {a['fetch_copies']:,.0f} / "
                    f"{a['push_copies']:,.0f} / {a['scan_copies']:,.0f} | {a['evicted_blocks']:,.0f} |"
                )
            rows.append(line)
    return "\n".join(rows)


def _range(r: tuple[float, float]) -> str:
    lo, hi = r
    return "" if not (math.isfinite(lo) and math.isfinite(hi)) else f" ({signed_pct(lo)} … {signed_pct(hi)})"


def verdict_table(res: CacheEvalResult, es: CacheEvalSet) -> tuple[str, dict[str, tuple[int, int]]]:
    vs = verdicts(res, es.loads, [w.name for w in es.workloads])
    many = es.replicates > 1
    there = "ΔP90 there (per-stream range)" if many else "ΔP90 there"
    worst = "worst ΔP90: load, ΔP90 (per-stream range)" if many else "worst ΔP90"
    rows = [
        f"| workload | KV / GPU | mode | policy | highest load meeting the SLO (norepl) | {there} | {worst} | "
        "lost | verdict |",
        "|---|---|---|---|---:|---:|---:|---:|---|",
    ]
    for v in vs:
        top = "none" if v.slo_load is None else f"{v.slo_load:g}"
        at = signed_pct(v.p90_at_slo_load) + (_range(v.slo_range) if many else "")
        wst = (
            (f"{v.worst_load:g}: " + signed_pct(v.worst_p90) + _range(v.worst_range))
            if many
            else signed_pct(v.worst_p90)
        )
        rows.append(f"| {v.workload} | {v.gpu} | {v.mode} | {v.policy} | {top} | {at} | {wst} | {v.lost} | "
                    f"{'pass' if v.passed else 'fail'} |")  # fmt: skip
    pols = [p for p in POLICIES[1:] if any(v.policy == p for v in vs)]
    counts = {p: (sum(v.passed for v in vs if v.policy == p), sum(v.policy == p for v in vs)) for p in pols}
    return "\n".join(rows), counts


def render(res: CacheEvalResult, es: CacheEvalSet, tuning: CacheEvalSet | None, wall_s: float, load: str) -> str:
    """The whole section (between its markers)."""
    caps = ", ".join(f"{k} {v}" for k, v in res.capacities.items())
    m = es.memory
    vt, counts = verdict_table(res, es)
    qa = load_sim_config(res.config).cache
    retain = (qa.retain_reused, qa.retain_fraction)
    tally = "; ".join(f"`{p}` {a} of {n}" for p, (a, n) in counts.items())
    out = [
        f"<!-- section:{SECTION} -->",
        "## Cache-manager ablation out of sample: hot prefixes under KV pressure",
        "",
        f"Test set `{es.source}` ({es.description}); the replication policy's parameters were chosen on the "
        f"tuning set `{tuning.source if tuning else TUNING_SET}` "
        f"({tuning.description if tuning else 'not found'}), never on these workloads. Config `{res.config}` "
        f"(profile: {res.profile}), fixed composition {es.composition}; mode *fixed* = controller off, "
        f"*controller* = controller on, started from that composition. Each point runs `norepl` (no replication "
        "or reclamation, engines' LRU only) and each replication policy on identical requests"
        + (
            f", on {es.replicates} independent request streams (replicates): every figure below is the mean over "
            "them, and the verdict compares those means. One stream is not enough where the pool is at or past its "
            "capacity: there a few different early decisions change every later queue, and the P90 of one policy "
            "against another moves by tens of percent from one stream to the next (the per-stream ranges in the "
            "verdict table)."
            if es.replicates > 1
            else "."
        ),
        "",
        f"KV capacity per GPU = (GPU memory × {m.utilisation:g} − {m.weights_gb:g} GB of weights) ÷ "
        f"{res.bytes_per_block / 1e6:.1f} MB per 512-token block (Qwen3-30B-A3B, bf16): {caps} blocks. "
        "Loads are relative to the pool's capacity with the hot prefixes priced in (vertumnus/eval/protocol.py).",
        "",
        f"Verdict: ΔP90 ≤ −{100 * P90_GAIN:.0f}% against `norepl` at the highest load where `norepl` "
        f"meets the SLO target ({res.slo_target:g} token-weighted), ΔP90 ≤ +{100 * P90_SLACK:.0f}% at every load, "
        f"no request lost. Pass (workload × KV size × mode): **{tally}**.",
        "",
        "Copies per run: *copies* are the confirmed ones; *ordered* splits them by what ordered them — a *fetch* "
        "copies the longest held prefix onto the worker a request was placed on, before its prefill (the "
        "placement was priced with it); a *push* copies a hot prefix off a queued holder after a placement; "
        "*scan* copies come from the periodic scan (the rules' replications; under queue_aware the inter-degree "
        "ones).",
        "",
        "`queue_aware` is copies and retention together (docs/design.md §3): the engines evict the least recently "
        f"used block that fewer than {retain[0]} prefill(s) reused, while the blocks reused that often fill at most "
        f"{retain[1]:g} of a worker's KV capacity; `norepl` runs the engines' plain LRU. Its two parts run apart "
        "on the same streams: `copies_only` "
        "(`cache.retain_reused: 0`: fetches, pushes and scan copies over plain LRU) and `retention_only` "
        "(`cache.hot_min_blocks` out of reach: no fetch or push copy). The per-workload tables below show "
        "`rules` and `queue_aware`; the verdict table all four.",
        "",
        vt,
        "",
    ]
    for w in es.workloads:
        for mode in MODES:
            out += [f"### {w.name}, {mode} — {w.description}", "", workload_table(res, es, w.name, mode), ""]
    out += [f"Measured: {len(res.runs)} simulations in {wall_s:.0f} s ({load}).", f"<!-- /section:{SECTION} -->", ""]
    return "\n".join(out)


def cache_section(jobs: int, log: Callable[[str], None], load_text: Callable[[], str]) -> str:
    """Run the test set and render the section."""
    import time

    from vertumnus.eval.cache_eval import evaluate_cache
    from vertumnus.sim.inputs import resolve

    es = load_cache_set(TEST_SET)
    tuning = load_cache_set(TUNING_SET) if resolve(TUNING_SET).is_file() else None
    t0 = time.perf_counter()

    def progress(i: int, n: int) -> None:
        if i % 24 == 0 or i == n:
            log(f"  cache ablation: {i}/{n} runs")

    res = evaluate_cache(TEST_SET, CONFIG, jobs=jobs, progress=progress)
    return render(res, es, tuning, time.perf_counter() - t0, load_text())
