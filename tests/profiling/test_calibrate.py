"""`vertumnus calibrate`: the two-stage threshold search in the simulator, its table, YAML and input errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer
import yaml
from typer.testing import CliRunner

from vertumnus.config import config_from_dict, load_config
from vertumnus.profiling.calibrate import (
    CalibrationSpec,
    Trial,
    best_trial,
    calibrate,
    paste_yaml,
    thresholds,
    with_thresholds,
)
from vertumnus.cost_model import CostModel
from vertumnus.sim.inputs import load_workload_requests

SMALL_POOL = {"pool": {"nodes": 1, "gpus_per_node": 8, "degrees": [2, 4, 8], "initial_composition": "2xCP4"}}


def test_search_runs_the_budget_and_picks_the_best(excerpt: Path) -> None:
    cfg = load_config(overrides=SMALL_POOL)
    requests = load_workload_requests(cfg, trace=str(excerpt), slice_spec="0:120").requests
    cost = CostModel.from_file(cfg.resolve_path(cfg.cost_model.profile))
    spec = CalibrationSpec(budget=5, theta_up=(0.7, 0.9), theta_low=(0.3,), theta_inter=(0.5, 2.0))
    seen: list[Trial] = []
    trials = calibrate(requests, cfg, cost, spec, seen.append)
    assert seen == trials and [t.index for t in trials] == [0, 1, 2, 3, 4]
    assert trials[0].stage == "given" and trials[0].values == thresholds(cfg)
    # stage 1: θ_up ∈ {0.7, 0.9} × θ_low = 0.3, minus the given point (0.8, 0.3) -> both (budget share: 2)
    assert [(t.stage, t.values["theta_up"]) for t in trials[1:3]] == [("controller", 0.7), ("controller", 0.9)]
    assert all(t.stage == "cache" for t in trials[3:])
    stage1_best = best_trial(trials[:3], "ttft")
    for t in trials[3:]:  # stage 2 keeps the controller thresholds of stage 1's winner
        assert (t.values["theta_up"], t.values["theta_low"]) == (
            stage1_best.values["theta_up"],
            stage1_best.values["theta_low"],
        )
    for t in trials:
        assert t.summary["requests"] == len(requests)
    best = best_trial(trials, "ttft")
    assert all(best.key("ttft") <= t.key("ttft") for t in trials)
    pasted = yaml.safe_load(paste_yaml(best))
    assert set(pasted) == {"controller", "cache"}
    data = cfg.model_dump(mode="json")
    data["controller"].update(pasted["controller"])
    data["cache"].update(pasted["cache"])
    assert thresholds(config_from_dict(data)) == best.values


def test_candidates_breaking_an_invariant_are_never_run() -> None:
    cfg = load_config(overrides=SMALL_POOL)
    with pytest.raises(ValueError, match="theta_low"):
        with_thresholds(cfg, {"theta_up": 0.3, "theta_low": 0.5})
    from vertumnus.profiling.calibrate import _stage_grid

    spec = CalibrationSpec(theta_up=(0.3, 0.8), theta_low=(0.3, 0.5))
    grid = _stage_grid(spec, ("theta_up", "theta_low"), thresholds(cfg))
    assert [(g["theta_up"], g["theta_low"]) for g in grid] == [(0.8, 0.5)]  # (0.8, 0.3) is the given point


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--budget", "1"], "--budget must be ≥ 2"),
        (["--objective", "p99"], "--objective must be one of ttft, slo"),
        (["--decay", "0.5,1.0"], "--decay values must lie in (0, 1)"),
        (["--theta-up", "a,b"], "--theta-up: expected comma-separated numbers"),
        (["--theta-intra", "-1"], "--theta-intra: need non-negative numbers"),
        (["--slice", "5"], "bad --slice"),
    ],
)
def test_bad_input(
    tmp_path: Path, excerpt: Path, runner: CliRunner, cli_app: typer.Typer, extra: list[str], message: str
) -> None:
    (tmp_path / "small.yaml").write_text(yaml.safe_dump(SMALL_POOL))
    res = runner.invoke(cli_app, ["calibrate", "--trace", str(excerpt), "-c", str(tmp_path / "small.yaml"), *extra])
    assert isinstance(res.exception, ValueError), res.output
    assert message in str(res.exception)


def test_missing_trace(tmp_path: Path, runner: CliRunner, cli_app: typer.Typer) -> None:
    (tmp_path / "small.yaml").write_text(yaml.safe_dump(SMALL_POOL))
    args = ["calibrate", "--trace", str(tmp_path / "none.jsonl"), "-c", str(tmp_path / "small.yaml")]
    res = runner.invoke(cli_app, args)
    assert isinstance(res.exception, ValueError) and "trace file not found" in str(res.exception)


def test_cli_prints_table_and_yaml(tmp_path: Path, excerpt: Path, runner: CliRunner, cli_app: typer.Typer) -> None:
    cfg_path = tmp_path / "small.yaml"
    cfg_path.write_text(yaml.safe_dump(SMALL_POOL))
    args = ["calibrate", "--trace", str(excerpt), "--config", str(cfg_path), "--budget", "3", "--slice", "0:60"]
    res = runner.invoke(cli_app, [*args, "--theta-up", "0.9", "--theta-low", "0.3,0.4"])
    assert res.exit_code == 0, res.output
    assert "calibration trials (objective: ttft;" in res.output and "★" in res.output
    fragment = res.output[res.output.index("paste into your config:") :].split("\n", 1)[1]
    pasted = yaml.safe_load(fragment)
    assert set(pasted["controller"]) == {"theta_up", "theta_low"}
    assert set(pasted["cache"]) == {"theta_inter", "theta_intra", "theta_reclaim", "decay"}
