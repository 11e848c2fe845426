"""Tables of an out-of-sample evaluation: markdown (files, docs/results.md), rich (terminal) and JSON."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vertumnus.eval.fixed_pick import Standing, TuningPick, result_standings, standings_json, stream_ratios_to
from vertumnus.eval.fmt import num3, share
from vertumnus.eval.verdict import MEAN_VS_BEST, MEAN_VS_START, EvalResult, WorkloadResult

FLAG_TITLES = {
    "mean<=best": f"mean ≤ {MEAN_VS_BEST:.2f}× best",
    "mean<=1.02*start": f"mean ≤ {MEAN_VS_START:.2f}× start",
    "p90<=best": "P90 ≤ best's",
    "slo>=best": "SLO ≥ best's",
    "lost==0": "0 lost",
}
HEAD = ("workload", "start", "mean", "reconf.", "best fixed", "÷best", "÷best per stream", "start fixed", "÷start",
        "oracle", "÷oracle", "prescient ÷best", "clairvoyant ÷best", "P90 / best's", "SLO att. / best's", "lost",
        "done")  # fmt: skip


def _done(w: WorkloadResult) -> str:
    if w.verdict.passed:
        return "yes"
    return "no: " + ", ".join(FLAG_TITLES[k] for k, ok in w.verdict.flags.items() if not ok)


def _count(x: float) -> str:
    """A count, or a mean of counts over replicate streams (one decimal)."""
    return str(int(x)) if float(x).is_integer() else f"{x:.1f}"


def stream_range(ratios: Sequence[float]) -> str:
    """``lo–hi`` of per-stream ratios ("–" with fewer than two streams)."""
    if len(ratios) < 2:
        return "–"
    return f"{num3(min(ratios))}–{num3(max(ratios))}"


def row(w: WorkloadResult) -> list[str]:
    """One workload's cells of :data:`HEAD`."""
    v, p = w.verdict, w.policy
    best = w.fixed[v.best_fixed]
    return [
        w.name, w.start, num3(p.mean), _count(p.summary.get("reconfigurations") or 0),
        f"{v.best_fixed} {num3(v.best_mean)}", num3(v.ratio_best), stream_range(v.stream_ratios),
        num3(v.start_mean), num3(v.ratio_start), num3(v.oracle_mean), num3(v.ratio_oracle), num3(v.prescient_ratio),
        num3(v.clairvoyant_ratio),
        f"{num3(p.p90)} / {num3(best.p90)}", f"{share(p.slo)} / {share(best.slo)}", str(p.lost), _done(w),
    ]  # fmt: skip


def verdict_line(res: EvalResult) -> str:
    """One sentence: how many workloads meet every criterion, geometric-mean ratios."""
    n = len(res.workloads)
    per = res.stream_geomeans()
    spread = f" (per request stream: {' / '.join(num3(g) for g in per)})" if len(per) > 1 else ""
    return (
        f"{res.passed}/{n} workloads meet every criterion; geometric mean over the workloads of mean TTFT ÷ best "
        f"fixed {num3(res.geomean('ratio_best'))}{spread}, ÷ start held fixed {num3(res.geomean('ratio_start'))}, "
        f"÷ per-phase oracle {num3(res.geomean('ratio_oracle'))}."
        + _prescient_text(res)
        + _clairvoyant_text(res)
        + (f" Every figure is the mean over {res.replicates} request streams per run." if res.replicates > 1 else "")
    )


def markdown_summary(res: EvalResult) -> str:
    """The per-workload table plus the verdict line."""
    lines = ["| " + " | ".join(HEAD) + " |", "|---|---|" + "---:|" * (len(HEAD) - 3) + "---|"]
    lines += ["| " + " | ".join(row(w)) + " |" for w in res.workloads]
    return "\n".join(lines) + "\n\n" + verdict_line(res) + "\n"


def markdown_controllers(rows: Sequence[tuple[str, EvalResult]]) -> str:
    """The controller ablation: each (label, result) on the same workloads, streams and fixed runs."""
    lines = ["| controller | meeting every criterion | geomean ÷ best fixed (per stream) | worst ÷ best fixed "
             "(workload) | ÷ start held fixed | ÷ per-phase oracle | reconfigurations per run | lost |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for label, res in rows:
        worst = max(res.workloads, key=lambda w: w.verdict.ratio_best)
        per = res.stream_geomeans()
        spread = f" ({' / '.join(num3(g) for g in per)})" if len(per) > 1 else ""
        moves = sum(float(w.policy.summary.get("reconfigurations") or 0) for w in res.workloads) / len(res.workloads)
        lines.append(
            f"| {label} | {res.passed}/{len(res.workloads)} | {num3(res.geomean('ratio_best'))}{spread} | "
            f"{num3(worst.verdict.ratio_best)} ({worst.name}) | {num3(res.geomean('ratio_start'))} | "
            f"{num3(res.geomean('ratio_oracle'))} | {moves:.1f} | {sum(w.policy.lost for w in res.workloads)} |"
        )
    return "\n".join(lines) + "\n"


def markdown_fixed(res: EvalResult) -> str:
    """Whole-run mean TTFT of every fixed composition per workload (the rows the best fixed is picked from)."""
    comps = list(res.workloads[0].fixed) if res.workloads else []
    lines = ["| workload | " + " | ".join([res.policy, *comps]) + " |", "|---|" + "---:|" * (len(comps) + 1)]
    for w in res.workloads:
        cells = [num3(w.policy.mean)] + [
            ("**" + num3(w.fixed[c].mean) + "**") if c == w.verdict.best_fixed else num3(w.fixed[c].mean) for c in comps
        ]
        lines.append(f"| {w.name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def markdown_standings(res: EvalResult, tuned: TuningPick | None = None) -> str:
    """The policy and every fixed composition across the workloads (:mod:`vertumnus.eval.fixed_pick`), and — with
    ``tuned`` — the policy against the fixed composition a search on the tuning set picks."""
    rows = result_standings(res)
    lines = ["| across the workloads | geomean ÷ best fixed | worst ÷ best fixed (workload) | at or below best fixed |",
             "|---|---:|---:|---:|"]  # fmt: skip
    for s in rows:
        name = _standing_name(s, tuned)
        name = f"**{name}**" if s.name == res.policy else name
        lines.append(
            f"| {name} | {num3(s.geomean)} | {num3(s.worst)} ({s.worst_workload}) | {s.at_best}/{len(res.workloads)} |"
        )
    out = "\n".join(lines) + "\n"
    if tuned is not None:
        out += "\n" + _pick_text(res, rows, tuned) + "\n"
    return out


def _standing_name(s: Standing, tuned: TuningPick | None) -> str:
    return f"{s.name} (picked on the tuning set)" if tuned is not None and s.name == tuned.chosen.name else s.name


def _pick_text(res: EvalResult, rows: Sequence[Standing], tuned: TuningPick) -> str:
    """:func:`tuned_text` for :func:`result_standings` rows (the policy first, the pick among the fixed ones)."""
    per = stream_ratios_to(res, tuned.chosen.name)
    return tuned_text(rows[0], next(s for s in rows if s.name == tuned.chosen.name), tuned, per)


def tuned_text(policy: Standing, fixed: Standing, tuned: TuningPick, per_stream: Sequence[float] = ()) -> str:
    """The policy against the tuning set's fixed pick, on this (test) set; ``per_stream``: the policy's mean TTFT
    ÷ the pick's per request stream (:func:`~vertumnus.eval.fixed_pick.stream_ratios_to`), shown from two on."""
    c = tuned.chosen
    if policy.beats(fixed):
        verdict = "lower on both: adaptivity pays against it here"
    elif policy.geomean < fixed.geomean or policy.worst < fixed.worst:
        which = "geometric mean" if policy.geomean < fixed.geomean else "worst workload"
        verdict = f"lower on the {which} only: adaptivity does not clearly pay against it here"
    else:
        verdict = "lower on neither: adaptivity does not pay against it here"
    return (
        f"The fixed composition a search on the tuning set picks (`{tuned.set_source}`: lowest geometric mean of "
        f"mean TTFT ÷ best fixed over its workloads, {num3(c.geomean)}, worst {num3(c.worst)}) is {c.name}; on these "
        f"workloads it stands at {num3(fixed.geomean)} (worst {num3(fixed.worst)}), {policy.name} at "
        f"{num3(policy.geomean)} (worst {num3(policy.worst)}) — {verdict}."
        + _streams_text(policy.name, c.name, per_stream)
    )


def _streams_text(policy: str, fixed: str, per_stream: Sequence[float]) -> str:
    if len(per_stream) < 2:
        return ""
    lower = sum(r < 1 for r in per_stream)
    return (
        f" Paired per request stream, the geometric mean over these workloads of {policy}'s mean TTFT ÷ "
        f"{fixed}'s is {' / '.join(num3(r) for r in per_stream)} (below 1 on {lower} of {len(per_stream)} streams)."
    )


def _streams_of(w: WorkloadResult) -> int:
    return int(w.policy.summary.get("replicates", 1))


def workload_facts(w: WorkloadResult) -> str:
    """``(pattern, N requests, T s, start S)``; with several request streams N is their total, as in the
    per-phase table (each stream is drawn separately, so their sizes differ a little)."""
    n = _streams_of(w)
    reqs = f"{w.requests} requests" if n == 1 else f"{int(w.policy.summary['requests'])} requests on {n} streams"
    return f"({w.pattern}, {reqs}, {w.duration_s:.0f} s, start {w.start})"


def workload_heading(w: WorkloadResult) -> str:
    """``name (pattern, N requests, T s, start S)`` (see :func:`workload_facts`)."""
    return f"{w.name} {workload_facts(w)}"


def markdown_phases(w: WorkloadResult, policy: str) -> str:
    """Per-phase table of one workload: the policy against each phase's best fixed composition.

    ``requests`` is the phase's count summed over the request streams (mean TTFTs are means over them)."""
    n = _streams_of(w)
    head = ("phase", "span (s)", "load", "long share", "req/s", "requests" if n == 1 else f"requests ({n} streams)",
            f"{policy} mean", "P90", "best fixed of the phase", "÷best")  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|---|---|" + "---:|" * 5 + "---:|---|---:|"]
    for ph, lay in zip(w.verdict.phases, w.phases, strict=True):
        load = f"{lay['load']:.2f}" + (f"→{lay['load_end']:.2f}" if lay["load_end"] is not None else "")
        ls = f"{lay['long_share']:.2f}" + (f"→{lay['long_end']:.2f}" if lay["long_end"] is not None else "")
        rps = f"{lay['rps']:.1f}" + (f"→{lay['rps_end']:.1f}" if lay["load_end"] is not None else "")
        p90 = w.policy.phases[ph.phase].get("p90_ttft_s")
        lines.append(
            f"| {ph.phase} {ph.label} | {lay['start_s']:.0f}–{lay['end_s']:.0f} | {load} | {ls} | {rps} | "
            f"{ph.requests} | {num3(ph.policy_mean)} | {num3(p90)} | {ph.best} {num3(ph.best_mean)} | "
            f"{num3(ph.ratio)} |"
        )
    return "\n".join(lines) + "\n"


def markdown_report(res: EvalResult, title: str | None = None, tuned: TuningPick | None = None) -> str:
    """A self-contained markdown report of one evaluation (``vertumnus evaluate --out``)."""
    out = [f"# {title or f'Evaluation of {res.policy} on set {res.set_name!r}'}\n",
           f"Set `{res.set_source}`, config `{res.config}` (cost profile: {res.profile})"
           + (f", overrides {dict(res.overrides)}" if res.overrides else "") + ".\n",
           markdown_summary(res), "## Every fixed composition (whole-run mean TTFT, s; best in bold)\n",
           markdown_fixed(res), "## Across the workloads\n", markdown_standings(res, tuned),
           "## Per phase\n"]  # fmt: skip
    for w in res.workloads:
        out.append(f"### {workload_heading(w)}\n")
        out.append(markdown_phases(w, res.policy))
    return "\n".join(out)


def write_outputs(res: EvalResult, out: Path, tuned: TuningPick | None = None) -> list[Path]:
    """``out/evaluation.json`` and ``out/evaluation.md`` (with the tuning set's fixed pick, where given)."""
    out.mkdir(parents=True, exist_ok=True)
    js, md = out / "evaluation.json", out / "evaluation.md"
    js.write_text(json.dumps({**res.to_json(), **standings_json(res, tuned)}, indent=1) + "\n")
    md.write_text(markdown_report(res, tuned=tuned))
    return [js, md]


def print_table(res: EvalResult, tuned: TuningPick | None = None) -> None:
    """The per-workload table on the terminal (rich)."""
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"{res.policy} on {res.set_name} ({res.profile} profile)")
    for h in HEAD:
        t.add_column(h, justify="left" if h in ("workload", "start", "best fixed", "done") else "right")
    for w in res.workloads:
        cells = row(w)
        style = None if w.verdict.passed else "red"
        t.add_row(*cells, style=style)
    console = Console()
    console.print(t)
    console.print(verdict_line(res))
    across = Table(title="across the workloads: mean TTFT ÷ best fixed")
    for h in ("", "geomean", "worst (workload)", "at or below best fixed"):
        across.add_column(h, justify="left" if not h else "right")
    rows = result_standings(res)
    for s in rows:
        n = len(res.workloads)
        across.add_row(
            _standing_name(s, tuned), num3(s.geomean), f"{num3(s.worst)} ({s.worst_workload})", f"{s.at_best}/{n}"
        )
    console.print(across)
    if tuned is not None:
        console.print(_pick_text(res, rows, tuned))


def _prescient_text(res: EvalResult) -> str:
    """The prescient start's standing, where it was run (every workload has a figure)."""
    g = res.geomean("prescient_ratio")  # inf where a workload has none (nan)
    if not math.isfinite(g):
        return ""
    vals = [w.verdict.prescient_ratio for w in res.workloads]
    above = sum(v > MEAN_VS_BEST for v in vals)
    return (
        f" The prescient start (moved to the best fixed composition at t = 0, then held) ÷ best fixed: geometric "
        f"mean {g:.3f}, at most {max(vals):.3f}; above {MEAN_VS_BEST:.2f}× on {above}/{len(vals)} workloads."
    )


def _clairvoyant_text(res: EvalResult) -> str:
    """The clairvoyant controller's standing, where it was run (every workload has a figure)."""
    g = res.geomean("clairvoyant_ratio")  # inf where a workload has none (nan)
    if not math.isfinite(g):
        return ""
    vals = [w.verdict.clairvoyant_ratio for w in res.workloads]
    at = sum(v <= MEAN_VS_BEST for v in vals)
    err = math.exp(sum(math.log(w.verdict.ratio_best / w.verdict.clairvoyant_ratio) for w in res.workloads) / len(vals))
    return (
        f" The clairvoyant controller (the same controller with the requests that will arrive as its forecast) ÷ "
        f"best fixed: geometric mean {g:.3f}, at most {max(vals):.3f}; at or below {MEAN_VS_BEST:.2f}× on "
        f"{at}/{len(vals)} workloads; the controller ÷ the clairvoyant one (what the forecast's error costs): "
        f"geometric mean {err:.3f}."
    )


def img_link(path: Path, md_dir: Path, alt: str) -> str:
    return f"![{alt}]({os.path.relpath(path, md_dir)})\n"


def criteria_text() -> str:
    return (
        f"Done when, per workload: whole-run mean TTFT ≤ {MEAN_VS_BEST:.2f}× the best fixed composition "
        f"in hindsight and ≤ {MEAN_VS_START:.2f}× the start composition held fixed, P90 TTFT ≤ and token-weighted "
        "SLO attainment ≥ the best fixed composition's, zero requests lost."
    )


def columns_text(policy: str) -> str:
    return (
        f"Columns: `mean` is {policy}'s whole-run mean TTFT (s) from `start`; `best fixed` the fixed composition "
        "(`vertumnus-static`) with the lowest whole-run mean; `start fixed` the start composition held fixed; "
        "`oracle` the per-phase oracle (each phase's best fixed composition, request-weighted over the phases: "
        "free switches, an idealised bound); `÷` the ratios of `mean` to those; `÷best per stream` the lowest and "
        "highest over the request streams of the policy's mean ÷ the best fixed composition's on the same stream "
        "(paired: both ran those requests); `prescient ÷best` the prescient "
        "start's mean ÷ the best fixed composition's — the start composition moved at t = 0 to the best fixed one "
        "by the pool's own operations (drain, switch, cache reconciliation), then held: the start-up cost that no "
        "controller which only converges to the best fixed composition avoids (1.000 where the start is the best "
        "fixed composition); `clairvoyant ÷best` the clairvoyant controller's mean ÷ the best fixed composition's — "
        "the same controller, every decision handed the requests that will arrive in the next span instead of its "
        "forecast: what the controller still pays with a perfect forecast (the start, drains and switches, a "
        "ten-second horizon), so `÷best` over it is what the forecast's error costs."
    )


def sensitivity_table(points: Sequence[dict[str, Any]]) -> str:
    """Markdown table of a sweep's points (see :mod:`vertumnus.eval.sensitivity`)."""
    lines = ["| key | value | geomean ÷best | geomean ÷start | workloads done |", "|---|---:|---:|---:|---:|"]
    for p in points:
        mark = " (config)" if p.get("is_base") else ""
        note = f" ({p['note']})" if p.get("note") else ""
        lines.append(f"| {p['key']} | {p['value']}{mark} | {num3(p.get('ratio_best') or math.inf)} | "
                     f"{num3(p.get('ratio_start') or math.inf)} | {p.get('passed', '–')}/{p.get('workloads', '–')}"
                     f"{note} |")  # fmt: skip
    return "\n".join(lines) + "\n"
