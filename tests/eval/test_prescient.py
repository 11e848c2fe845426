"""The prescient start (vertumnus.eval.prescient): the start composition steered to a target at once with the
pool's own operations, then held — on the real pool over the sim data plane."""

from __future__ import annotations

from typing import Any

import pytest

from vertumnus.config import DEFAULT_PROFILE, REPO_ROOT, config_from_dict, parse_composition
from vertumnus.cost_model import CostModel
from vertumnus.eval.prescient import PrescientSteer
from vertumnus.sim.runner import Simulation
from vertumnus.sim.workload import TraceRecord, build_requests

COST = CostModel.from_file(REPO_ROOT / DEFAULT_PROFILE)


def cfg(nodes: int, degrees: list[int]) -> Any:
    return config_from_dict(
        {
            "pool": {"nodes": nodes, "gpus_per_node": 8, "degrees": degrees, "engine": "sim",
                     "max_model_len": 131072, "kv_capacity_blocks_per_rank": 1024},
            "cache": {"replication": False},
        }
    )  # fmt: skip


def requests(config: Any, n: int, gap_s: float, length: int = 4096) -> list[Any]:
    blocks = length // 512
    recs = [TraceRecord(i + 1, i * gap_s, length, 1, tuple(range(i * blocks + 1, (i + 1) * blocks + 1)))
            for i in range(n)]  # fmt: skip
    return build_requests(recs, config, origin_s=0.0)


def steer_run(config: Any, start: str, target: str, reqs: list[Any]) -> tuple[PrescientSteer, Any]:
    steer = PrescientSteer(parse_composition(target))
    res = Simulation(reqs, config, COST, "vertumnus-static", start, hooks=[steer.hook]).run()
    return steer, res


@pytest.mark.parametrize("at_s", [0.0, 0.55])
def test_merges_all_begin_at_once_and_the_pool_then_holds(at_s: float) -> None:
    # 2 nodes as 4xCP4 → 2xCP8: both merges (one per node) begin at at_s (0.55 s: between two arrivals) and
    # commit after the switch; the controller is off, so nothing moves afterwards; every request is served.
    c = cfg(2, [4, 8])
    reqs = requests(c, 80, 0.1)
    steer = PrescientSteer(parse_composition("2xCP8"), at_s=at_s)
    res = Simulation(reqs, c, COST, "vertumnus-static", "4xCP4", hooks=[steer.hook]).run()
    assert steer.done and steer.began == 2
    assert sorted((r.kind, r.sources) for r in res.reconfigs) == [("merge", (0, 1)), ("merge", (2, 3))]
    assert all(r.time_s - r.drain_s - r.switch_s == pytest.approx(at_s) for r in res.reconfigs)
    assert res.summary["final_composition"] == "2xCP8" and res.summary["completed"] == len(reqs)


def test_a_three_degree_lattice_is_reached_in_rounds() -> None:
    # 1 node as 1xCP8 → 4xCP2: the CP8 splits into two CP4 at 0 s; when they are up (after the switch) both
    # split again, together.
    c = cfg(1, [2, 4, 8])
    reqs = requests(c, 60, 0.1)
    steer, res = steer_run(c, "1xCP8", "4xCP2", reqs)
    assert steer.done and steer.began == 3
    first, *second = sorted(res.reconfigs, key=lambda r: r.time_s)
    assert first.kind == "split" and first.sources == (0,)
    assert sorted(r.sources for r in second) == [(1,), (2,)]
    assert all(r.time_s - r.drain_s - r.switch_s >= first.time_s - 1e-9 for r in second)
    assert res.summary["final_composition"] == "4xCP2" and res.summary["completed"] == len(reqs)


def test_a_target_the_lattice_cannot_reach_is_a_clear_error() -> None:
    c = cfg(1, [4, 8])
    with pytest.raises(ValueError, match=r"cannot reach 3xCP4 from 2xCP4"):
        steer_run(c, "2xCP4", "3xCP4", requests(c, 10, 0.1))
