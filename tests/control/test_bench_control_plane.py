"""The control-plane benchmark's machinery (figures are printed, never asserted): the instant data plane keeps
every request exactly once across a reconfiguration, the replay completes a trace, the CLI emits one JSON
object with the documented keys."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from vertumnus.bench.control_plane import load_trace_requests, measure_replay
from vertumnus.cli.main import app
from vertumnus.config import DEFAULT_PROFILE, REPO_ROOT, config_from_dict
from vertumnus.cost_model import CostModel
from vertumnus.engines.sim.events import EventLoop
from vertumnus.engines.sim.instant import InstantDataPlane, on_event_loop
from vertumnus.pool import PrefillPool
from vertumnus.types import Placement, PrefillResult, ReconfigKind, ReconfigPlan, Request

COST = CostModel.from_file(REPO_ROOT / DEFAULT_PROFILE)


def _trace(path: Path, n: int, gap_ms: int = 500) -> Path:
    lines = []
    for i in range(n):
        blocks = 4 + (i % 7) * 9
        hashes = [0, *range(1000 * i + 1, 1000 * i + blocks)]  # block 0 shared by everyone
        lines.append(json.dumps({"timestamp": i * gap_ms, "input_length": blocks * 512 + 100, "output_length": 5,
                                 "hash_ids": hashes}))  # fmt: skip
    path.write_text("\n".join(lines) + "\n")
    return path


class Log:
    def __init__(self) -> None:
        self.done: list[str] = []
        self.reconfigs: list[tuple[float, float]] = []

    def request_done(self, request: Request, placement: Placement | None, result: PrefillResult | None) -> None:
        assert result is not None and result.ok
        self.done.append(request.request_id)

    def reconfig_done(self, plan: ReconfigPlan, drain_s: float, switch_s: float) -> None:
        self.reconfigs.append((drain_s, switch_s))

    def cache_op_done(self, *args: object) -> None: ...


def test_instant_plane_keeps_every_request_across_a_split(tmp_path: Path) -> None:
    cfg = config_from_dict(
        {"pool": {"nodes": 1, "gpus_per_node": 8, "degrees": [4, 8]}, "controller": {"enabled": False}}
    )
    heap = EventLoop()
    plane = InstantDataPlane(heap.clock, cfg.pool.gpus_per_node, schedule=on_event_loop(heap),
                             prefill_s=lambda job: job.placement.predicted_s, switch_s=0.5)  # fmt: skip
    pool = PrefillPool(cfg, COST, plane, heap.clock)
    log = Log()
    pool.add_listener(log)
    pool.start()
    while heap.step():
        pass
    assert pool.snapshot().workers[0].state == "ACTIVE"
    reqs = load_trace_requests(_trace(tmp_path / "t.jsonl", 12))
    for r in reqs:
        pool.submit(r)
    heap.step()  # worker 0 starts the first request
    plan = pool.reconfigure(ReconfigKind.SPLIT, 0)
    assert pool.snapshot().backlog == 11  # queued ones withdrawn; nothing schedulable while draining
    while heap.step():
        pass
    assert sorted(log.done) == sorted(r.request_id for r in reqs) and len(log.done) == 12
    first_e = COST.predict(8, reqs[0].input_len, 0)
    assert log.reconfigs == [(first_e, 0.5)]  # drain = the running prefill; switch = the acks' delay
    assert pool.snapshot().composition == "2xCP4" and pool.epochs.epoch == plan.epoch


def test_replay_completes_the_trace(tmp_path: Path) -> None:
    fig = measure_replay(COST, _trace(tmp_path / "t.jsonl", 200))
    assert (fig.requests, fig.completed) == (200, 200)
    assert fig.composition_start == "5xCP8"  # light history (2 req/s): all GPUs in the largest degree
    assert fig.events > 200


def test_controller_splits_under_sustained_load_in_a_replay(tmp_path: Path) -> None:
    # 40 GPUs as 5×CP8 (K = 35 s per 10-s window). 30 req/s of 8K tokens (Ê8 = 0.176 s) for 40 s is
    # 53 s of demand per window (ρ = 1.5): after two windows the controller splits, one operation at a time.
    path = tmp_path / "burst.jsonl"
    path.write_text(
        "".join(
            json.dumps({"timestamp": i * 1000 // 30, "input_length": 8192, "output_length": 1,
                        "hash_ids": list(range(100 * i, 100 * i + 16))}) + "\n"
            for i in range(1200)
        )
    )  # fmt: skip
    cfg = config_from_dict(
        {"pool": {"nodes": 5, "gpus_per_node": 8, "degrees": [4, 8], "initial_composition": "5xCP8"}}
    )
    fig = measure_replay(COST, path, cfg=cfg)
    assert (fig.completed, fig.composition_start) == (1200, "5xCP8")
    assert fig.reconfigurations >= 1 and fig.composition_end != "5xCP8"


def test_cli_json(tmp_path: Path) -> None:
    trace = _trace(tmp_path / "t.jsonl", 50)
    args = ["bench", "control-plane", "--json", "--workers", "4", "--samples", "20", "--trace", str(trace),
            "--trie-nodes", "40000", "--scan-active", "100", "--documents", "16"]  # fmt: skip
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    for key in ("placement_us_p50", "placement_us_p99", "replay_requests_per_s", "scan_ms", "bytes_per_trie_node",
                "decision_rules_ms_p50", "decision_predictive_ms_p50"):  # fmt: skip
        assert isinstance(out[key], float) and out[key] > 0
    assert (out["workers"], out["replay_completed"], out["scan_active_nodes"] >= 100) == (4, 50, True)
    # the decision benchmark: arrivals over the 2-window span stay queued (4 workers' KV bounds how many are
    # placed; the rest wait in the backlog and are not forecast); moves = stay + at least one operation
    assert 0 < out["decision_forecast_requests"] == out["decision_queued_requests"] <= 1200
    assert out["decision_predictive_moves"] >= 2
    bad = CliRunner().invoke(app, ["bench", "control-plane", "--trace", str(tmp_path / "none.jsonl")])
    assert bad.exit_code != 0 and "trace not found" in str(bad.exception)
