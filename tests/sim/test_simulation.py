"""End-to-end simulations through the real PrefillPool: exact TTFTs on a hand-computed 3-request example,
determinism, the lower bound below every policy, and a reconfiguration under a load step."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from vertumnus.config import VertumnusConfig, config_from_dict
from vertumnus.cost_model import CostModel, CostProfile, DegreeProfile
from vertumnus.engines.sim.events import EventKind
from vertumnus.sim.inputs import load_cost, load_sim_config
from vertumnus.sim.phases import generate, parse_phase_spec
from vertumnus.sim.policies import POLICIES
from vertumnus.sim.runner import Simulation, run_policy
from vertumnus.sim.workload import build_requests, read_trace
from vertumnus.types import Request

EXCERPT = Path(__file__).resolve().parents[1] / "data" / "conversation_excerpt.jsonl"

# E_C(R, P) = 0.5 + 0.001·R + 0.0001·P + 0.002·R / C
HAND = CostModel(
    CostProfile(
        degrees={c: DegreeProfile(d=0.5, a=0.001, b=0.0001, c=0.002, alpha=0.0, kappa=7.0) for c in (1, 2)},
        source="test",
    )
)


def _hand_cfg() -> VertumnusConfig:
    return config_from_dict(
        {
            "pool": {"nodes": 1, "gpus_per_node": 2, "degrees": [1, 2], "initial_composition": "2xCP1"},
            "cache": {"block_tokens": 100},
            "slo": {"t_ext_s": 0.05, "base_s": 1.0, "per_token_s": 0.0},
        }
    )


def test_three_requests_match_hand_computed_ttfts() -> None:
    reqs = [
        Request("r1", 0.0, 300, (1, 2, 3), slo_s=1.0),
        Request("r2", 0.1, 400, (9, 8, 7, 6), slo_s=1.0),
        Request("r3", 2.0, 350, (1, 2, 3), slo_s=1.0),
    ]
    res = run_policy(reqs, _hand_cfg(), HAND, "vertumnus-static")
    recs = res.collector.records
    # r1 -> worker 0 (tie on J, lower id): E_1(300, 0) = 0.5 + 0.9 = 1.4 -> TTFT 1.4 + 0.05
    # r2 -> worker 1 (J_0 = 1.3 + 1.7 > J_1 = 1.7): E_1(400, 0) = 1.7, done 1.8 -> TTFT 1.75
    # r3 -> worker 0 holding 3 blocks: P = 300, R = 50: 0.5 + 0.15 + 0.03 = 0.68 -> TTFT 0.73
    got = [(recs[r].worker, recs[r].cached_tokens, recs[r].ttft_s) for r in ("r1", "r2", "r3")]
    assert got == [
        (0, 0, pytest.approx(1.45, abs=1e-12)),
        (1, 0, pytest.approx(1.75, abs=1e-12)),
        (0, 300, pytest.approx(0.73, abs=1e-12)),
    ]
    s = res.summary
    assert s["completed"] == 3 and s["mean_ttft_s"] == pytest.approx((1.45 + 1.75 + 0.73) / 3)
    # SLO 1.0 s: only r3 meets it; token-weighted 350 / 1050
    assert s["slo_attainment"] == pytest.approx(1 / 3)
    assert s["slo_attainment_token_weighted"] == pytest.approx(350 / 1050)
    assert s["prefix_hit_rate_tokens"] == pytest.approx(300 / 1050)


def _excerpt(cfg: VertumnusConfig, n: int = 150, rate: float = 6.0) -> list[Request]:
    records, _ = read_trace(EXCERPT)
    return build_requests(records[:n], cfg, target_rps=rate)


def _small_cfg() -> VertumnusConfig:
    cfg = load_sim_config(None)
    cfg.pool.nodes = 1
    return cfg


def test_same_run_twice_is_identical() -> None:
    cfg = _small_cfg()
    cost = load_cost(cfg)
    reqs = _excerpt(cfg)
    a = run_policy(reqs, cfg, cost, "vertumnus").summary
    b = run_policy(reqs, cfg, cost, "vertumnus").summary
    for k in ("sim_wall_s", "sim_cpu_s", "events_per_s"):
        a.pop(k), b.pop(k)
    assert a == b


def test_lower_bound_is_below_every_policy_per_request() -> None:
    cfg = _small_cfg()
    cost = load_cost(cfg)
    reqs = _excerpt(cfg)
    lb = run_policy(reqs, cfg, cost, "lower-bound").arrays["ttft"]
    assert not np.isnan(lb).any()
    for pol in POLICIES:
        if pol == "lower-bound":
            continue
        res = run_policy(reqs, cfg, cost, pol, "2xCP4")
        ttft = res.arrays["ttft"]
        assert res.summary["completed"] == len(reqs), pol
        assert np.all(ttft >= lb - 1e-9), pol
        assert res.summary["mean_ttft_s"] >= float(lb.mean()), pol


@pytest.mark.parametrize("policy", ["rules", "predictive"])
def test_load_step_triggers_a_split(policy: str) -> None:
    cfg = _small_cfg()
    cfg.pool.initial_composition = "1xCP8"
    cfg.controller.policy = policy  # type: ignore[assignment]
    cost = load_cost(cfg)
    # 60 s at 1 req/s, then 60 s at 30 req/s of short requests: demand far above one CP8 worker's κ
    w = parse_phase_spec("phases:60@1/0,60@30/0;seed=3")
    reqs = build_requests(generate(w), cfg, prefix="g")
    res = run_policy(reqs, cfg, cost, "vertumnus")
    assert res.summary["completed"] == len(reqs)
    splits = [r for r in res.reconfigs if r.kind == "split"]
    assert splits, "the controller must split the CP8 worker under the load step"
    first = splits[0]
    if policy == "rules":
        assert first.time_s > 60.0  # ρ is low before the step: the rules wait for it
    else:
        # CP4 is faster than CP8 for these short prompts (E_4 < E_8 up to ~8K tokens), but at 1 req/s the few
        # requests of the 10-s forecast do not pay back the split's switch: a burst forecast that "wins" on one
        # or two arrivals is refused by the span (burst_full_slack). The step is answered by a
        # between-windows check within two check intervals, not at a window end as the rules do.
        assert cost.predict(4, 2048, 0) < cost.predict(8, 2048, 0)
        began = first.time_s - first.drain_s - first.switch_s
        check_s = cfg.controller.predictive.check_interval_s
        assert check_s is not None
        assert 60.0 < began <= 60.0 + 2 * check_s
    assert first.switch_s == pytest.approx(cfg.pool.sim_switch_s)
    assert res.composition[0][1] == {8: 1}
    assert res.composition[1] == (first.time_s, {4: 2})
    static = run_policy(reqs, cfg, cost, "vertumnus-static")
    assert static.summary["reconfigurations"] == 0
    assert res.summary["mean_ttft_s"] < static.summary["mean_ttft_s"]


def test_worker_failure_mid_run_replaces_its_requests() -> None:
    cfg = _small_cfg()
    cfg.pool.initial_composition = "2xCP4"
    cfg.controller.enabled = False
    cost = load_cost(cfg)
    reqs = _excerpt(cfg, n=80, rate=20.0)
    sim = Simulation(reqs, cfg, cost, "vertumnus")
    sim.loop.push(1.0, EventKind.ENGINE, sim.data_plane.fail_worker, 0, "test")
    res = sim.run()
    assert res.summary["completed"] == len(reqs)
    after = [r for r in res.collector.records.values() if r.arrival_s < 1.0 and r.finished_s > 1.0]
    assert after and all(r.worker in (0, 1) for r in after)
    w0 = sim.data_plane.workers[0]
    assert not w0.retired and w0.epoch > 1  # restarted under a fresh epoch
