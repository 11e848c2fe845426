"""Evaluation runner: verdicts computed exactly from the per-run numbers; sweep; `vertumnus evaluate` errors."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from tests.cli_runner import Cli, Result
from vertumnus.config import parse_composition
from vertumnus.eval.clairvoyant import clairvoyant_forecaster
from vertumnus.eval.digest import RunDigest, mean_digest
from vertumnus.eval.eval_report import HEAD, markdown_phases, markdown_summary, row, verdict_line, workload_heading
from vertumnus.eval.eval_results import SWEEP_FLOAT_STEPS, SWEEP_INT_STEPS, SWEEP_KEYS
from vertumnus.eval.eval_set import load_eval_set
from vertumnus.eval.evaluate import evaluate
from vertumnus.eval.phase_stats import phase_summaries
from vertumnus.eval.prescient import PrescientSteer
from vertumnus.eval.sensitivity import parse_sweep
from vertumnus.eval.tasks import STATIC
from vertumnus.eval.verdict import EvalResult, WorkloadResult, derive
from vertumnus.sim.inputs import load_cost, load_sim_config
from vertumnus.sim.policies import all_compositions
from vertumnus.sim.runner import Simulation, run_policy

EXCERPT = Path(__file__).resolve().parents[1] / "data" / "conversation_excerpt.jsonl"
CONFIG = "configs/sim-40gpu.yaml"


def _digest(mean: float, p90: float, slo: float, phase_means: list[float], lost: int = 0) -> RunDigest:
    summary = {"mean_ttft_s": mean, "p90_ttft_s": p90, "slo_attainment_token_weighted": slo, "rejected": lost,
               "failed": 0, "unfinished": 0}  # fmt: skip
    phases = [{"requests": n, "mean_ttft_s": m} for n, m in zip((30, 10), phase_means, strict=True)]
    return RunDigest("x", "c", summary, phases)


def test_derive_best_fixed_oracle_ratios_and_flags_exactly() -> None:
    fixed = {
        "A": _digest(1.0, 2.0, 0.95, [0.8, 1.6]),
        "B": _digest(0.9, 2.5, 0.97, [1.0, 0.6]),
        "C": _digest(1.2, 1.5, 0.99, [0.7, 2.7]),
    }
    policy = _digest(0.99, 2.4, 0.97, [0.75, 1.71])
    v = derive(policy, fixed, "A", ["high", "low"])
    assert v.best_fixed == "B" and v.best_mean == 0.9
    assert [(p.best, p.best_mean, p.label) for p in v.phases] == [("C", 0.7, "high"), ("B", 0.6, "low")]
    assert v.oracle_mean == pytest.approx((30 * 0.7 + 10 * 0.6) / 40)
    assert v.ratio_best == pytest.approx(0.99 / 0.9) and v.ratio_start == pytest.approx(0.99 / 1.0)
    assert v.ratio_oracle == pytest.approx(0.99 / 0.675)
    assert v.phases[0].ratio == pytest.approx(0.75 / 0.7)
    assert v.flags == {"mean<=best": False, "mean<=1.02*start": True, "p90<=best": True, "slo>=best": True,
                       "lost==0": True}  # fmt: skip
    assert not v.passed
    winner = derive(_digest(0.85, 2.5, 0.97, [0.7, 0.6]), fixed, "A")
    assert winner.passed and winner.ratio_oracle == pytest.approx(0.85 / 0.675)
    lossy = derive(_digest(0.85, 2.5, 0.97, [0.7, 0.6], lost=1), fixed, "A")
    assert lossy.flags["lost==0"] is False and not lossy.passed
    # Ties: the lexicographically first composition wins, deterministically.
    tie = derive(policy, {"Y": _digest(1.0, 1, 1, [1, 1]), "X": _digest(1.0, 1, 1, [1, 1])}, "Y")
    assert tie.best_fixed == "X" and [p.best for p in tie.phases] == ["X", "X"]


def _tiny_set(tmp_path: Path, **workload: object) -> Path:
    w = {"name": "tiny", "pattern": "alternating", "seed": 5, "traces": ["excerpt"], "start": "6xCP4+2xCP8",
         "params": {"high": {"load": 0.8, "long_share": 0.05}, "low": {"load": 0.3, "long_share": 0.3},
                    "high_s": 12, "low_s": 12, "phases": 2}}  # fmt: skip
    w.update(workload)
    data = {"name": "tiny", "traces": {"excerpt": str(EXCERPT)}, "requests": [0.0, 1.0], "workloads": [w]}
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_runner_on_a_tiny_workload_derives_everything_from_its_runs(tmp_path: Path) -> None:
    set_path = str(_tiny_set(tmp_path))
    calls: list[str] = []
    res = evaluate(set_path, CONFIG, progress=lambda d, t, task: calls.append(
        f"{task.policy} {task.composition}" + (f" -> {task.target}" if task.target else "")
        + (" clairvoyant" if task.clairvoyant else "")))  # fmt: skip
    cfg = load_sim_config(CONFIG)
    comps = all_compositions(cfg)
    assert comps == ["10xCP4", "8xCP4+1xCP8", "6xCP4+2xCP8", "4xCP4+3xCP8", "2xCP4+4xCP8", "5xCP8"]
    (w,) = res.workloads
    best = min(comps, key=lambda c: (w.fixed[c].mean, c))
    assert best != "6xCP4+2xCP8"  # the workload is chosen so that the prescient start has a move to make
    # the prescient start runs after the fixed compositions (they name its target), then the clairvoyant controller
    assert calls == ["vertumnus 6xCP4+2xCP8"] + [f"{STATIC} {c}" for c in comps] + [
        f"{STATIC} 6xCP4+2xCP8 -> {best}",
        "vertumnus 6xCP4+2xCP8 clairvoyant",
    ]
    assert set(w.fixed) == set(comps) and w.start == "6xCP4+2xCP8"
    # The digests are the runs themselves: rerun the start composition and the policy directly.
    gen = load_eval_set(set_path).generate("tiny", cfg, load_cost(cfg))
    assert w.requests == len(gen.requests) > 100
    cost = load_cost(cfg)
    direct = run_policy(gen.requests, cfg, cost, STATIC, "6xCP4+2xCP8")
    assert w.fixed["6xCP4+2xCP8"].mean == direct.summary["mean_ttft_s"]
    assert w.fixed["6xCP4+2xCP8"].phases == [
        {k: s[k] for k in w.fixed["6xCP4+2xCP8"].phases[0]} for s in phase_summaries(direct.arrays, gen.bounds)
    ]
    pol = run_policy(gen.requests, cfg, cost, "vertumnus", "6xCP4+2xCP8")
    assert w.policy.mean == pol.summary["mean_ttft_s"]
    # Best fixed, oracle and ratios recomputed here from the per-run numbers.
    v = w.verdict
    best = min(comps, key=lambda c: (w.fixed[c].mean, c))
    assert v.best_fixed == best and v.best_mean == w.fixed[best].mean
    assert v.ratio_best == w.policy.mean / w.fixed[best].mean
    assert v.ratio_start == w.policy.mean / w.fixed["6xCP4+2xCP8"].mean
    weighted, n = 0.0, 0
    for k, ph in enumerate(v.phases):
        means = {c: w.fixed[c].phases[k]["mean_ttft_s"] for c in comps}
        assert ph.best_mean == min(means.values()) and means[ph.best] == ph.best_mean
        assert ph.requests == w.policy.phases[k]["requests"]
        weighted += ph.requests * ph.best_mean
        n += ph.requests
    assert v.oracle_mean == pytest.approx(weighted / n) and v.ratio_oracle == pytest.approx(
        w.policy.mean * n / weighted
    )
    assert v.flags["lost==0"] == (w.policy.lost == 0)
    assert v.flags["p90<=best"] == (w.policy.p90 <= w.fixed[best].p90)
    # the prescient start: the start composition steered to the best one from t = 0, then held
    steer = PrescientSteer(parse_composition(best))
    pre = Simulation(gen.requests, cfg, cost, STATIC, "6xCP4+2xCP8", hooks=[steer.hook]).run()
    assert steer.done and steer.began >= 1 and pre.summary["final_composition"] == best
    assert max(r.time_s for r in pre.reconfigs) < 2.0 and pre.summary["reconfigurations"] == steer.began
    assert v.prescient_mean == pre.summary["mean_ttft_s"]
    assert v.prescient_ratio == pre.summary["mean_ttft_s"] / w.fixed[best].mean
    # the clairvoyant controller: the same policy, its forecast the requests to come
    clv = Simulation(gen.requests, cfg, cost, "vertumnus", "6xCP4+2xCP8", forecaster=clairvoyant_forecaster).run()
    assert v.clairvoyant_mean == clv.summary["mean_ttft_s"] != pol.summary["mean_ttft_s"]
    assert v.clairvoyant_ratio == clv.summary["mean_ttft_s"] / w.fixed[best].mean
    assert res.geomean("ratio_best") == pytest.approx(v.ratio_best)
    js = res.to_json()
    assert js["workloads"][0]["verdict"]["best_fixed"] == best and js["passed"] == int(v.passed)
    assert js["geomean_clairvoyant_ratio"] == pytest.approx(v.clairvoyant_ratio)
    assert "clairvoyant controller" in verdict_line(res)


def _fails_cleanly(r: Result, *needles: str) -> None:
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr and "Traceback" not in r.stdout
    assert r.stderr.startswith("error:"), r.stderr
    for n in needles:
        assert n in r.stderr, r.stderr


def test_cli_errors_are_clear(cli: Cli, tmp_path: Path) -> None:
    _fails_cleanly(cli("evaluate", "--set", str(tmp_path / "nope.yaml")), "evaluation set not found")
    bad_pattern = _tiny_set(tmp_path, pattern="zigzag")
    _fails_cleanly(cli("evaluate", "--set", str(bad_pattern)), "unknown workload pattern 'zigzag'", "tiny")
    ok = str(_tiny_set(tmp_path))
    _fails_cleanly(cli("evaluate", "--set", ok, "--start", "3xCP4"), "bad composition", "uses 12 GPUs")
    _fails_cleanly(cli("evaluate", "--set", ok, "--start", "10xCP2+2xCP8"), "degree(s) [2]")
    _fails_cleanly(cli("evaluate", "--set", ok, "--policy", "magic"), "unknown policy 'magic'")
    _fails_cleanly(cli("evaluate", "--set", ok, "--config", str(tmp_path / "none.yaml")), "none.yaml")
    _fails_cleanly(cli("evaluate", "--set", ok, "--sweep", "predictive.merge_margin=a,b"), "bad --sweep")
    _fails_cleanly(cli("evaluate", "--set", ok, "--sweep", "no_such_knob=1"), "unknown config key")
    _fails_cleanly(
        cli("evaluate", "--set", ok, "--tuning-set", str(tmp_path / "nope.yaml")), "evaluation set not found"
    )
    _fails_cleanly(
        cli("evaluate", "--set", ok, "--tuning-set", ok, "--sweep", "predictive.merge_margin=0.04"), "not with --sweep"
    )
    data = yaml.safe_load(Path(ok).read_text())
    data["traces"]["excerpt"] = str(tmp_path / "missing.jsonl")
    (tmp_path / "missing.yaml").write_text(yaml.safe_dump(data))
    _fails_cleanly(cli("evaluate", "--set", str(tmp_path / "missing.yaml")), "trace file(s) not found")


def test_parse_sweep_grids() -> None:
    cfg = load_sim_config(CONFIG)
    grid = parse_sweep(["predictive.merge_margin=0.04,0.06", "predictive.merge_persist_s", "cache.theta_intra=1,2"],
                       cfg)  # fmt: skip
    w = cfg.controller.window_s  # a horizon counted in windows moves a whole window at a time (2 windows: -1..+2)
    assert grid == {"controller.predictive.merge_margin": [0.04, 0.06],
                    "controller.predictive.merge_persist_s": [w * n for n in (1, 2, 3, 4)],
                    "cache.theta_intra": [1.0, 2.0]}  # fmt: skip
    auto = parse_sweep(["auto"], cfg)
    assert {"controller.window_s", "controller.predictive.split_margin"} <= set(auto)
    assert not any(k.startswith("controller.rules.") for k in auto) and "controller.predictive.switch_s" not in auto
    rules = cfg.model_copy(deep=True)
    rules.controller.policy = "rules"
    auto = parse_sweep(["auto"], rules)
    assert {"controller.rules.theta_up", "controller.rules.theta_low", "controller.rules.persist_windows"} <= set(auto)
    assert "controller.rules.long_threshold_tokens" not in auto and not any(".predictive." in k for k in auto)
    # a key of the policy the config does not run, and a key of the former flat section, name why
    with pytest.raises(ValueError, match=r"read only by controller\.policy rules"):
        parse_sweep(["rules.theta_up=0.7"], cfg)
    with pytest.raises(ValueError, match=r"moved to controller\.predictive\.split_margin"):
        parse_sweep(["split_margin=0.03"], cfg)


def test_the_default_sweep_varies_what_each_policy_reads() -> None:
    cfg = load_sim_config("configs/sim-40gpu.yaml")
    grid = parse_sweep(list(SWEEP_KEYS["predictive"]), cfg, SWEEP_FLOAT_STEPS, SWEEP_INT_STEPS)
    assert grid == {"controller.predictive.merge_margin": [0.045, 0.05, 0.055],
                    "controller.predictive.merge_stress_memory_s": [25.0, 30.0, 35.0],
                    "controller.predictive.merge_persist_s": [5.0, 10.0, 15.0]}  # fmt: skip
    cfg.controller.policy = "rules"
    grid = parse_sweep(list(SWEEP_KEYS["rules"]), cfg, SWEEP_FLOAT_STEPS, SWEEP_INT_STEPS)
    assert grid == {"controller.rules.theta_up": [0.6975, 0.775, 0.8525],
                    "controller.rules.theta_low": [0.405, 0.45, 0.495],
                    "controller.rules.persist_windows": [1, 2, 3]}  # fmt: skip


def test_cli_evaluate_and_sweep_on_a_tiny_set(cli: Cli, tmp_path: Path) -> None:
    set_path = str(_tiny_set(tmp_path))
    cfg = load_sim_config(CONFIG)
    out = tmp_path / "sw"
    bad = 1.0  # a merge margin must be below 1: rejected by the config, reported and skipped
    r = cli("evaluate", "--set", set_path, "--sweep", f"predictive.merge_margin=0.02,{bad}", "--out", str(out),
            "--no-progress")  # fmt: skip
    assert r.returncode == 0, r.stderr
    points = json.loads((out / "sensitivity.json").read_text())
    assert [(p["value"], p["is_base"]) for p in points] == [(0.02, False),
                                                            (cfg.controller.predictive.merge_margin, True),
                                                            (bad, False)]  # fmt: skip
    assert points[2]["note"] and points[2].get("ratio_best") is None
    base = json.loads((out / "evaluation.json").read_text())
    assert points[1]["ratio_best"] == pytest.approx(base["geomean_ratio_best"])
    assert math.isfinite(points[0]["ratio_best"]) and (out / "sensitivity.png").stat().st_size > 0
    r2 = cli("evaluate", "--set", set_path, "--tuning-set", set_path, "--out", str(tmp_path / "ev"), "--no-progress")
    assert r2.returncode == 0, r2.stderr
    assert "| tiny | 6xCP4+2xCP8 |" in r2.stdout and "workloads meet every criterion" in r2.stdout
    md = (tmp_path / "ev" / "evaluation.md").read_text()
    assert "## Per phase" in md and "0 high" in md and "1 low" in md
    # every composition across the set's workloads (one workload: the policy's ratio is its verdict's)
    ev = json.loads((tmp_path / "ev" / "evaluation.json").read_text())["workloads"][0]["verdict"]
    assert "## Across the workloads" in md and f"| **vertumnus** | {ev['ratio_best']:.3f} |" in md
    assert "Across the workloads" in r2.stdout and f"| **vertumnus** | {ev['ratio_best']:.3f} |" in r2.stdout
    # the tuning set is the set itself here: its fixed pick is the workload's best fixed composition, at 1.000
    js = json.loads((tmp_path / "ev" / "evaluation.json").read_text())
    assert js["tuning_pick"]["chosen"]["name"] == ev["best_fixed"] and js["tuning_pick"]["chosen"]["geomean"] == 1.0
    assert [s["name"] for s in js["standings"]][:2] == ["vertumnus", "10xCP4"]
    assert f"| {ev['best_fixed']} (picked on the tuning set) | 1.000 | 1.000 (tiny) | 1/1 |" in md
    assert f"is {ev['best_fixed']}; on these workloads it stands at 1.000" in r2.stdout


def test_results_section_renders_every_profile_and_skips_missing_ones(tmp_path: Path) -> None:
    from vertumnus.eval.eval_results import results_section

    set_path = str(_tiny_set(tmp_path))
    md = results_section(
        tmp_path / "img", tmp_path, profiles=(("calibrated", CONFIG), ("other", str(tmp_path / "absent.yaml"))),
        set_path=set_path, tuning_path=set_path, sweep_keys=("predictive.merge_margin=0.04",), log=lambda _: None,
    )  # fmt: skip
    assert "### Profile: calibrated" in md and "| tiny | 6xCP4+2xCP8 |" in md
    # The tuning set here is the test set itself: its fixed pick is the one workload's best fixed composition,
    # at 1.000 on both sets (the same runs).
    best = next(line for line in md.splitlines() if line.startswith("| tiny | 6xCP4+2xCP8 |")).split(" | ")[4]
    best_name = best.split()[0]
    assert f"| {best_name} (picked on the tuning set) | 1.000 | 1.000 (tiny) | 1/1 |" in md
    assert (
        f"picks (`{set_path}`: lowest geometric mean" in md
        and f"is {best_name}; on these workloads it stands at 1.000" in md
    )
    assert f"Skipped: `{tmp_path / 'absent.yaml'}` does not exist" in md
    assert "![test-set verdict against each controller threshold](img/eval_sensitivity.png)" in md
    assert (
        tmp_path / "img" / "eval_sensitivity.png"
    ).is_file() and "| controller.predictive.merge_margin | 0.04 |" in md
    assert "load 1.0 is the rate" in md  # the protocol's rule is stated
    # The controller ablation: the configured predictive policy and the rule controller on the same fixed runs.
    rows = [line.split(" | ") for line in md.splitlines() if line.startswith(("| `predictive` (configured) |",
                                                                              "| `rules` |"))]  # fmt: skip
    assert "**Controller ablation.**" in md and len(rows) == 2
    assert all(r[1] in ("0/1", "1/1") and r[-1] == "0 |" for r in rows)  # one workload, nothing lost
    assert rows[0][2] == next(line for line in md.splitlines() if line.startswith("| **vertumnus** |")).split(" | ")[1]
    # Marked, so `make results-oos` rewrites just this section and keeps the rest of docs/results.md.
    from vertumnus.eval.report import splice

    assert md.startswith("<!-- section:out-of-sample -->") and "<!-- /section:out-of-sample -->" in md
    assert "Measured: " in md
    doc = "head\n<!-- section:out-of-sample -->\nSTALE FIGURES\n<!-- /section:out-of-sample -->\ntail\n"
    new = splice(doc, "out-of-sample", md)
    assert new.startswith("head\n") and new.endswith("tail\n") and "STALE FIGURES" not in new
    assert "### Profile: calibrated" in new


def test_process_pool_gives_the_same_verdicts_as_one_process(tmp_path: Path) -> None:
    set_path = str(_tiny_set(tmp_path, params={"high": {"load": 0.7, "long_share": 0.05}, "low": {"load": 0.3,
                   "long_share": 0.3}, "high_s": 8, "low_s": 8, "phases": 2}))  # fmt: skip
    one, two = evaluate(set_path, CONFIG, jobs=1), evaluate(set_path, CONFIG, jobs=2)
    strip = ("sim_wall_s", "sim_cpu_s")

    def numbers(res: EvalResult) -> dict[str, object]:
        js = res.to_json()
        for w in js["workloads"]:
            for run in (w["policy"], *w["fixed"].values()):
                for k in strip:
                    run["summary"].pop(k)
        return js

    assert numbers(one) == numbers(two)


def test_mean_digest_averages_figures_and_sums_counts() -> None:
    a = RunDigest("p", "c", {"mean_ttft_s": 0.2, "p90_ttft_s": 0.5, "rejected": 1, "failed": 0, "unfinished": 0,
                             "requests": 10, "final_composition": "10xCP4", "reconfigurations": 3},
                  [{"requests": 6, "mean_ttft_s": 0.1}, {"requests": 4, "mean_ttft_s": 0.3}])  # fmt: skip
    b = RunDigest("p", "c", {"mean_ttft_s": 0.4, "p90_ttft_s": None, "rejected": 0, "failed": 2, "unfinished": 0,
                             "requests": 12, "final_composition": "5xCP8", "reconfigurations": 4},
                  [{"requests": 7, "mean_ttft_s": 0.2}, {"requests": 5, "mean_ttft_s": 0.5}])  # fmt: skip
    m = mean_digest([a, b])
    assert m.mean == pytest.approx(0.3) and m.p90 == math.inf  # a stream with no P90 leaves no mean P90
    assert m.lost == 3 and m.summary["requests"] == 22 and m.summary["replicates"] == 2
    assert m.summary["reconfigurations"] == pytest.approx(3.5) and m.summary["final_composition"] == "10xCP4"
    assert m.phases == [{"requests": 13, "mean_ttft_s": pytest.approx(0.15)},
                        {"requests": 9, "mean_ttft_s": pytest.approx(0.4)}]  # fmt: skip
    assert mean_digest([a]).summary == {**a.summary, "replicates": 1}
    # each stream's own mean is kept, in order, for the paired per-stream ratios
    assert m.stream_means == (0.2, 0.4) and m.per_stream == (0.2, 0.4) and a.per_stream == (0.2,)
    with pytest.raises(ValueError, match="at least one"):
        mean_digest([])


def test_per_stream_ratios_pair_each_stream_with_the_same_stream_of_the_best_fixed() -> None:
    def runs(*means: float) -> RunDigest:
        return mean_digest([_digest(m, 1.0, 1.0, [m, m]) for m in means])

    # B is best on the means (0.9 < 1.0) though A is lower on stream 1: the ratios pair with B's streams
    fixed = {"A": runs(1.2, 0.8), "B": runs(0.85, 0.95)}
    v = derive(runs(0.85, 1.045), fixed, "A")
    assert v.best_fixed == "B" and v.ratio_best == pytest.approx(0.9475 / 0.9)
    assert v.stream_ratios == pytest.approx((1.0, 1.1))
    w = derive(runs(0.9, 0.95), {"A": runs(1.0, 1.0), "B": runs(1.0, 1.0)}, "A")
    res = EvalResult("s", "s.yaml", "c.yaml", "p", "pol", (), replicates=2)
    for name, verdict in (("w1", v), ("w2", w)):
        res.workloads.append(WorkloadResult(name, "steady", "A", 1, 1.0, [], runs(1, 1), fixed, verdict))
    assert res.stream_geomeans() == pytest.approx((math.sqrt(0.9), math.sqrt(1.1 * 0.95)))
    line = verdict_line(res)
    assert f"(per request stream: {math.sqrt(0.9):.3f} / {math.sqrt(1.1 * 0.95):.3f})" in line
    assert row(res.workloads[0])[HEAD.index("÷best per stream")] == "1.000–1.100"
    assert res.to_json()["geomean_ratio_best_per_stream"] == pytest.approx(list(res.stream_geomeans()))
    # one stream: no spread to show; streams of different counts: no pairing
    one = {"A": _digest(0.9, 1, 1, [1, 1])}
    single = derive(_digest(0.99, 1, 1, [1, 1]), one, "A")
    assert single.stream_ratios == pytest.approx((1.1,))
    assert row(WorkloadResult("x", "s", "A", 1, 1.0, [], runs(1), one, single))[HEAD.index("÷best per stream")] == "–"
    assert derive(runs(1, 1), {"A": runs(1, 1, 1)}, "A").stream_ratios == ()


def test_replicates_run_every_composition_on_the_same_streams_and_report_means(cli: Cli, tmp_path: Path) -> None:
    params = {"high": {"load": 0.7, "long_share": 0.05}, "low": {"load": 0.3, "long_share": 0.3}, "high_s": 8,
              "low_s": 8, "phases": 2}  # fmt: skip
    set_path = _tiny_set(tmp_path, params=params)
    data = yaml.safe_load(set_path.read_text())
    data["replicates"] = 2
    set_path.write_text(yaml.safe_dump(data))
    calls: list[tuple[str, str, int]] = []
    res = evaluate(str(set_path), CONFIG, progress=lambda d, t, task: calls.append((
        task.policy + (" clairvoyant" if task.clairvoyant else ""), task.composition, task.replicate)))  # fmt: skip
    cfg = load_sim_config(CONFIG)
    comps = all_compositions(cfg)
    # every run on both streams, the policy, its clairvoyant reference and every fixed composition alike; the
    # prescient start (if the start is not the best fixed composition) on both streams as well
    extra = list(calls)
    runs = [("vertumnus", "6xCP4+2xCP8"), ("vertumnus clairvoyant", "6xCP4+2xCP8"), *((STATIC, c) for c in comps)]
    for run in [(pol, c, k) for k in (0, 1) for pol, c in runs]:
        extra.remove(run)
    assert sorted(extra) in ([], [(STATIC, "6xCP4+2xCP8", 0), (STATIC, "6xCP4+2xCP8", 1)])
    assert res.replicates == 2 and "mean over 2 request streams" in markdown_summary(res)
    (w,) = res.workloads
    es, cost = load_eval_set(str(set_path)), load_cost(cfg)
    gens = [es.generate("tiny", cfg, cost, k) for k in (0, 1)]
    assert [r.arrival_s for r in gens[0].requests] != [r.arrival_s for r in gens[1].requests]  # distinct streams
    direct = [run_policy(g.requests, cfg, cost, STATIC, "6xCP4+2xCP8") for g in gens]
    start = w.fixed["6xCP4+2xCP8"]
    assert start.mean == pytest.approx(sum(d.summary["mean_ttft_s"] for d in direct) / 2)
    assert start.p90 == pytest.approx(sum(d.summary["p90_ttft_s"] for d in direct) / 2)
    assert start.summary["requests"] == sum(len(g.requests) for g in gens)
    assert [ph["requests"] for ph in start.phases] == [
        sum(ps) for ps in zip(*([s["requests"] for s in phase_summaries(d.arrays, g.bounds)]
                                for d, g in zip(direct, gens, strict=True)), strict=True)
    ]  # fmt: skip
    # the report states that its request counts are totals over the streams, in the heading and the phase table
    total = sum(len(g.requests) for g in gens)
    assert workload_heading(w).startswith(f"tiny (alternating, {w.policy.summary['requests']} requests on 2 streams")
    table = markdown_phases(w, "vertumnus")
    assert "| requests (2 streams) |" in table
    assert sum(int(line.split("|")[6]) for line in table.splitlines()[2:]) == w.policy.summary["requests"] == total
    pol = [run_policy(g.requests, cfg, cost, "vertumnus", "6xCP4+2xCP8") for g in gens]
    assert w.policy.mean == pytest.approx(sum(p.summary["mean_ttft_s"] for p in pol) / 2)
    assert w.verdict.ratio_start == pytest.approx(w.policy.mean / start.mean)
    # the paired per-stream ratios: the policy's run on stream k ÷ the best fixed composition's run on stream k
    best = [run_policy(g.requests, cfg, cost, STATIC, w.verdict.best_fixed) for g in gens]
    assert w.verdict.stream_ratios == pytest.approx(
        tuple(a.summary["mean_ttft_s"] / b.summary["mean_ttft_s"] for a, b in zip(pol, best, strict=True))
    )
    assert res.stream_geomeans() == pytest.approx(w.verdict.stream_ratios)
    # --replicates overrides the set's count: one stream is stream 0 alone
    out = tmp_path / "one"
    r = cli("evaluate", "--set", str(set_path), "--replicates", "1", "--out", str(out), "--no-progress")
    assert r.returncode == 0, r.stderr
    one = json.loads((out / "evaluation.json").read_text())
    assert one["replicates"] == 1
    assert one["workloads"][0]["fixed"]["6xCP4+2xCP8"]["summary"]["mean_ttft_s"] == pytest.approx(
        direct[0].summary["mean_ttft_s"]
    )
    bad = cli("evaluate", "--set", str(set_path), "--replicates", "0")  # typer's own range check
    assert bad.returncode == 2 and "--replicates" in bad.stderr and "Traceback" not in bad.stderr
    data["replicates"] = 0
    (tmp_path / "zero.yaml").write_text(yaml.safe_dump(data))  # a new path: sets are cached per path
    _fails_cleanly(cli("evaluate", "--set", str(tmp_path / "zero.yaml")), "replicates")
