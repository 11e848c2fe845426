"""Standings across a set's workloads and the fixed composition a tuning-set search picks: exact arithmetic, and
the pick computed from real fixed-composition runs."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml

from vertumnus.eval.digest import RunDigest, mean_digest
from vertumnus.eval.eval_report import tuned_text
from vertumnus.eval.eval_set import load_eval_set
from vertumnus.eval.fixed_pick import Standing, TuningPick, pick, standings, stream_ratios_to, tuning_pick
from vertumnus.eval.tasks import STATIC
from vertumnus.eval.verdict import EvalResult, WorkloadResult, derive
from vertumnus.sim.inputs import load_cost, load_sim_config
from vertumnus.sim.policies import all_compositions
from vertumnus.sim.runner import run_policy

EXCERPT = Path(__file__).resolve().parents[1] / "data" / "conversation_excerpt.jsonl"
CONFIG = "configs/sim-40gpu.yaml"


def test_standings_are_geometric_means_and_worsts_of_the_ratios_to_each_workloads_best() -> None:
    means = {
        "a": {"pol": 1.1, "A": 1.0, "B": 2.0, "C": math.inf},
        "b": {"pol": 4.4, "A": 8.0, "B": 4.0, "C": 4.0},
    }
    pol, a, b, c = standings(means, ["A", "B", "C"], ("pol",))
    assert (pol.name, a.name, b.name, c.name) == ("pol", "A", "B", "C")
    # best fixed: a -> A (1.0), b -> B and C (4.0)
    assert pol.geomean == pytest.approx(math.sqrt(1.1 * 1.1)) and pol.worst == pytest.approx(1.1)
    assert pol.at_best == 0
    assert a.geomean == pytest.approx(math.sqrt(1.0 * 2.0)) and a.worst == 2.0 and a.worst_workload == "b"
    assert a.at_best == 1
    assert b.geomean == pytest.approx(math.sqrt(2.0)) and b.worst == 2.0 and b.worst_workload == "a"
    assert c.geomean == math.inf and c.worst == math.inf and c.worst_workload == "a" and c.at_best == 1
    # A and B tie on the geometric mean and the worst: the first listed is picked; C never (it completed nothing)
    assert pick([a, b, c]) is a and pick([b, a, c]) is b and pick([c, b]) is b
    with pytest.raises(ValueError, match="no mean TTFT for C"):
        standings({"a": {"A": 1.0}}, ["A", "C"])
    with pytest.raises(ValueError, match="at least one workload"):
        standings({}, ["A"])


def test_the_verdict_against_the_pick_needs_both_figures_lower() -> None:
    chosen = Standing("6xCP4+2xCP8", 1.03, 1.08, "x", 2)
    tuned = TuningPick("configs/eval/tuning.yaml", chosen, [chosen])
    fixed = Standing("6xCP4+2xCP8", 1.024, 1.070, "y", 4)
    both = tuned_text(Standing("vertumnus", 1.006, 1.032, "z", 4), fixed, tuned)
    assert "lower on both: adaptivity pays" in both and "is 6xCP4+2xCP8" in both
    assert "stands at 1.024 (worst 1.070), vertumnus at 1.006 (worst 1.032)" in both
    one = tuned_text(Standing("vertumnus", 1.020, 1.098, "z", 1), fixed, tuned)
    assert "lower on the geometric mean only: adaptivity does not clearly pay" in one
    neither = tuned_text(Standing("vertumnus", 1.027, 1.098, "z", 1), fixed, tuned)
    assert "lower on neither: adaptivity does not pay" in neither
    assert "per request stream" not in neither  # one stream (or none given): nothing paired to show
    paired = tuned_text(Standing("vertumnus", 1.027, 1.098, "z", 1), fixed, tuned, (0.99, 1.012, 1.03))
    assert "vertumnus's mean TTFT ÷ 6xCP4+2xCP8's is 0.990 / 1.012 / 1.030 (below 1 on 1 of 3 streams)" in paired


def test_paired_ratios_to_a_fixed_composition_per_stream() -> None:
    def runs(*means: float) -> RunDigest:
        return mean_digest([RunDigest("x", "c", {"mean_ttft_s": m}, []) for m in means])

    res = EvalResult("s", "s.yaml", "c.yaml", "p", "pol", (), replicates=2)
    for name, pol, a, b in (("w1", (1.0, 2.0), (0.5, 2.0), (1.0, 1.0)), ("w2", (2.0, 1.0), (1.0, 4.0), (9, 9))):
        fixed = {"A": runs(*a), "B": runs(*b)}
        v = derive(runs(*pol), fixed, "A")
        res.workloads.append(WorkloadResult(name, "steady", "A", 1, 1.0, [], runs(*pol), fixed, v))
    # stream 0: 1.0/0.5 and 2.0/1.0 -> 2; stream 1: 2.0/2.0 and 1.0/4.0 -> sqrt(0.25) = 0.5
    assert stream_ratios_to(res, "A") == pytest.approx((2.0, 0.5))
    assert stream_ratios_to(res, "B") == pytest.approx((math.sqrt(2 / 9), math.sqrt(2 / 9)))
    single = EvalResult("s", "s.yaml", "c.yaml", "p", "pol", ())
    one = {"A": runs(1.0)}
    single.workloads.append(WorkloadResult("w", "steady", "A", 1, 1.0, [], runs(1.0), one, derive(runs(1.0), one, "A")))
    assert stream_ratios_to(single, "A") == ()


def test_tuning_pick_runs_every_fixed_composition_of_the_set(tmp_path: Path) -> None:
    # two workloads of the repo's trace excerpt: one at a load a few CP8 workers serve, one near capacity
    base = {"pattern": "alternating", "traces": ["excerpt"], "start": "6xCP4+2xCP8",
            "params": {"high": {"load": 0.8, "long_share": 0.05}, "low": {"load": 0.3, "long_share": 0.3},
                       "high_s": 12, "low_s": 12, "phases": 2}}  # fmt: skip
    workloads = [{**base, "name": "w5", "seed": 5}, {**base, "name": "w6", "seed": 6}]
    data = {"name": "t", "traces": {"excerpt": str(EXCERPT)}, "requests": [0.0, 1.0], "workloads": workloads}
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(data))
    tp = tuning_pick(str(path), CONFIG)
    cfg = load_sim_config(CONFIG)
    cost = load_cost(cfg)
    comps = all_compositions(cfg)
    es = load_eval_set(str(path))
    # the same figures from the runs made here
    means = {}
    for w in ("w5", "w6"):
        reqs = es.generate(w, cfg, cost).requests
        means[w] = {c: run_policy(reqs, cfg, cost, STATIC, c).summary["mean_ttft_s"] for c in comps}
    assert tp.fixed == standings(means, comps)
    assert [s.name for s in tp.fixed] == comps and tp.set_source == str(path)
    assert tp.chosen == min(tp.fixed, key=lambda s: (s.geomean, s.worst))
    assert tp.chosen.geomean >= 1.0 and math.isfinite(tp.chosen.geomean)
