"""The decision audit (`vertumnus audit`): the predictive controller's decisions re-scored on the arrivals that
followed them. Workloads are built so that the right answer is known: a periodic stream (the forecast *is* the
future), and a quiet spell followed by a surge of long prompts on a pool of CP8 workers (a forecast taken before
the surge sees a fraction of the work that comes, and the truth asks for splits)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from vertumnus.config import REPO_ROOT, VertumnusConfig
from vertumnus.cost_model import CostModel
from vertumnus.eval.decision_audit import audit_run, format_report
from vertumnus.sim.inputs import load_cost, load_sim_config
from vertumnus.types import Request

CONFIG = "configs/sim-40gpu.yaml"
EXCERPT = Path(__file__).resolve().parents[1] / "data" / "conversation_excerpt.jsonl"
CLI = Path(sys.executable).parent / "vertumnus"
Inputs = tuple[VertumnusConfig, CostModel]


def _stream(phases: list[tuple[float, float]], input_len: int) -> list[Request]:
    """Evenly spaced requests, (duration s, rate /s) per phase; every prompt its own blocks (no prefix reuse)."""
    out: list[Request] = []
    t0 = 0.0
    for duration, rate in phases:
        for k in range(int(duration * rate)):
            i = len(out)
            out.append(Request(f"r{i}", t0 + k / rate, input_len, (10 * i + 1, 10 * i + 2)))
        t0 += duration
    return out


@pytest.fixture(scope="module")
def sim_inputs() -> Inputs:
    cfg = load_sim_config(CONFIG)
    return cfg, load_cost(cfg)


def test_a_periodic_stream_is_forecast_exactly_once_the_span_has_passed(sim_inputs: Inputs) -> None:
    cfg, cost = sim_inputs
    report = audit_run(_stream([(60.0, 12.0)], 2000), cfg, cost, "6xCP4+2xCP8")
    warm = [d for d in report.decisions if d.age_s >= report.span_s]
    assert len(warm) >= 30
    # The forecast is the last span's arrivals at their own offsets, the truth the next span's: the same requests.
    assert all(d.work_ratio == pytest.approx(1.0, abs=0.01) for d in warm)
    # Every decision the controller computed is audited or left out (its next span runs past the last arrival).
    assert report.skipped >= 1 and max(d.age_s for d in report.decisions) + report.span_s <= 60.0
    assert report.operations_begun == report.run.summary["reconfigurations"]
    # A longer audit span scores more of what followed; the work is compared per second, still 1.
    longer = audit_run(_stream([(60.0, 12.0)], 2000), cfg, cost, "6xCP4+2xCP8", span_s=30.0)
    assert longer.span_s == 30.0 and longer.skipped > report.skipped  # 20 s more of the tail cut off
    assert len(longer.decisions) + longer.skipped == len(report.decisions) + report.skipped  # the same decisions
    assert all(d.work_ratio == pytest.approx(1.0, abs=0.01) for d in longer.decisions if d.age_s >= 10.0)
    with pytest.raises(ValueError, match="span must be > 0 s"):
        audit_run(_stream([(5.0, 12.0)], 2000), cfg, cost, "6xCP4+2xCP8", span_s=0.0)


def test_a_surge_after_a_quiet_spell_shows_the_forecast_short_and_the_missed_splits(
    sim_inputs: Inputs,
) -> None:
    cfg, cost = sim_inputs
    # 32k-token prompts: one runs faster on a CP8 (0.54 s) than on a CP4 (0.68 s), so a quiet pool of CP8s stays;
    # under load two CP4s serve ~1.25x what one CP8 does in the same GPUs' time, so the surge wants splits.
    requests = _stream([(25.0, 2.0), (15.0, 25.0)], 32000)
    report = audit_run(requests, cfg, cost, "5xCP8")
    before = [d for d in report.decisions if d.age_s < 25.0]
    assert before and all(d.acted is None for d in before)  # the quiet forecast asked for nothing
    at_20 = next(d for d in report.decisions if d.window and d.age_s == pytest.approx(20.0))
    # Its forecast is the quiet span; its next 10 s hold 5 s of the surge.
    assert at_20.work_ratio < 0.5
    assert at_20.true_best_kind == "split" and at_20.true_best_s < 0.8 * at_20.true_stay_s
    assert report.missed("split") >= 2 and report.missed("merge") == 0
    # The splits the controller began once the surge showed are the ones the truth endorses.
    assert report.moves and all(d.acted is not None and d.acted.startswith("split") for d in report.moves)
    assert report.endorsed == len(report.moves)
    # each move was decided by a split gate, whose passed checks lead the trail to it
    for d in report.moves:
        assert d.gate in ("span-split", "burst-split") and d.trail and d.trail[-1]["passed"] is True
        assert d.trail[-1]["name"].startswith(d.gate)
    assert report.operations_begun == report.run.summary["reconfigurations"] >= len(report.moves)
    text = format_report("surge", report, moves=True)
    n = len(report.moves)
    assert f"{n} of {n} moves beat staying" in text and text.count("(beat staying); on its forecast at 1x") == n


def _tiny_set(tmp_path: Path) -> Path:
    w = {"name": "tiny", "pattern": "alternating", "seed": 5, "traces": ["excerpt"], "start": "6xCP4+2xCP8",
         "params": {"high": {"load": 0.8, "long_share": 0.05}, "low": {"load": 0.3, "long_share": 0.3},
                    "high_s": 12, "low_s": 12, "phases": 2}}  # fmt: skip
    data = {"name": "tiny", "traces": {"excerpt": str(EXCERPT)}, "requests": [0.0, 1.0], "workloads": [w]}
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _vertumnus(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(CLI), *args], capture_output=True, text=True, cwd=REPO_ROOT, timeout=600)


def test_the_audit_command_prints_and_writes_every_decision(tmp_path: Path) -> None:
    out = tmp_path / "audit.json"
    r = _vertumnus("audit", "--set", str(_tiny_set(tmp_path)), "-c", CONFIG, "--moves", "--json", str(out))
    assert r.returncode == 0, r.stderr
    assert "tiny (stream 0, from 6xCP4+2xCP8):" in r.stdout and "forecast work / work that followed" in r.stdout
    data = json.loads(out.read_text())["tiny"]
    assert f"{len(data['decisions'])} decisions audited" in r.stdout
    assert data["moves"] == sum(1 for d in data["decisions"] if d["acted"] is not None)
    assert sum(data["gates"].values()) == len(data["decisions"]) and "decided by: " in r.stdout
    assert all({"name", "passed", "value", "threshold"} == set(c) for d in data["decisions"] for c in d["trail"])
    assert all(b["decisions"] > 0 for b in data["buckets"])


def test_the_audit_command_refuses_what_it_cannot_audit(tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump({**yaml.safe_load((REPO_ROOT / CONFIG).read_text()),
                                     "controller": {"policy": "rules"}}))  # fmt: skip
    tiny = str(_tiny_set(tmp_path))
    for args, message in (
        (("-c", str(rules)), "the audit needs controller.policy: predictive, not rules"),
        (("--json", str(tmp_path / "no" / "a.json")), f"no directory {tmp_path / 'no'}"),
        (("--json", str(tmp_path)), f"--json {tmp_path} is a directory"),
        (("-w", "nope"), "nope"),
        (("--span", "-1"), "span must be > 0 s"),
    ):
        r = _vertumnus("audit", "--set", tiny, *args)
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        assert "Traceback" not in r.stdout + r.stderr
        lines = [x for x in r.stderr.splitlines() if x.strip()]
        assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], r.stderr
