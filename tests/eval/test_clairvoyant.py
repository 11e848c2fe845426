"""The clairvoyant reference (vertumnus.eval.clairvoyant): the predictive controller handed the requests to come
instead of its forecast — the forecast's exact form, and the controller acting on it in a real simulation."""

from __future__ import annotations

import pytest

from tests.eval.test_prescient import COST, cfg
from vertumnus.cache.manager import CacheManager
from vertumnus.config import CacheConfig
from vertumnus.eval.clairvoyant import ClairvoyantForecast, clairvoyant_forecaster
from vertumnus.sim.runner import Simulation
from vertumnus.sim.workload import TraceRecord, build_requests
from vertumnus.types import CacheReport, CacheReportKind, Request


def test_the_forecast_is_the_next_span_with_the_prefix_held_now_or_brought_by_an_earlier_request() -> None:
    cache = CacheManager(CacheConfig(), COST, [4, 8])
    cache.add_worker(0, 4, 0, 1 << 20)
    cache.apply_report(CacheReport(0, CacheReportKind.STORED, (1, 2, 3)))  # worker 0 holds blocks 1-3
    reqs = [
        Request("late", 3.5, 2048, (1, 2, 3, 4)),  # at now + span: outside the half-open span
        Request("c", 3.0, 2600, (1, 2, 3, 4, 20)),  # a's blocks 1-4 come before it: 4 blocks
        Request("before", 0.9, 2048, (1, 2, 3, 4)),  # arrived already
        Request("a", 1.0, 2048, (1, 2, 3, 4)),  # held now: 3 blocks
        Request("b", 2.5, 3000, (1, 2, 10, 11, 12)),  # held 1-2; a brings nothing more of its chain
        Request("d", 3.2, 1024, (1, 2)),  # fully held: the prefix is its whole input
    ]

    def forecast(now: float, span_s: float) -> list[tuple[float, int, int]]:
        return [(round(t, 9), n, p) for t, n, p in ClairvoyantForecast(reqs, cache, 512, span_s)(now)]

    assert forecast(1.0, 2.5) == [(0.0, 2048, 1536), (1.5, 3000, 1024), (2.0, 2600, 2048), (2.2, 1024, 1024)]
    assert forecast(4.0, 10.0) == []
    # what the span's earlier requests bring counts within one call only: c alone sees what worker 0 holds
    assert forecast(2.9, 0.2) == [(0.1, 2600, 1536)]


def _burst_at(start_s: float) -> list[Request]:
    c = cfg(1, [4, 8])
    recs = [TraceRecord(i + 1, start_s + i * 0.04, 4096, 1, tuple(range(i * 8 + 1, (i + 1) * 8 + 1)))
            for i in range(250)]  # fmt: skip
    return build_requests(recs, c, origin_s=0.0)


def test_the_clairvoyant_controller_splits_for_a_burst_before_it_arrives() -> None:
    # One node as 1xCP8; from 2 s on a burst that 2xCP4 serves better. The forecasting controller splits once
    # the burst has arrived; the clairvoyant one at its first check, 0.1 s (the start-up checks), seeing the
    # requests of the next span — and ends with a lower mean TTFT. Every request is served either way.
    c = cfg(1, [4, 8])
    reqs = _burst_at(2.0)
    began = {}
    for clairvoyant in (False, True):
        seen: list[ClairvoyantForecast] = []

        def clairvoyant_spy(sim: Simulation, seen: list[ClairvoyantForecast] = seen) -> ClairvoyantForecast:
            seen.append(clairvoyant_forecaster(sim))
            return seen[-1]

        sim = Simulation(reqs, c, COST, "vertumnus", "1xCP8", forecaster=clairvoyant_spy if clairvoyant else None)
        res = sim.run()
        assert [(r.kind, r.sources) for r in res.reconfigs] == [("split", (0,))]
        assert res.summary["completed"] == len(reqs) and res.summary["final_composition"] == "2xCP4"
        began[clairvoyant] = (res.reconfigs[0].time_s - res.reconfigs[0].drain_s - res.reconfigs[0].switch_s,
                              res.summary["mean_ttft_s"])  # fmt: skip
        assert len(seen) == clairvoyant and all(f.calls >= 1 for f in seen)
    assert began[True][0] == pytest.approx(0.1) and began[False][0] >= 2.0
    assert began[True][1] < began[False][1]


@pytest.mark.parametrize("policy,controller", [("vertumnus-static", "predictive"), ("vertumnus", "rules")])
def test_only_the_predictive_controller_has_a_clairvoyant_reference(policy: str, controller: str) -> None:
    c = cfg(1, [4, 8])
    c.controller.policy = controller
    with pytest.raises(ValueError, match="clairvoyant reference needs the predictive controller"):
        Simulation(_burst_at(0.0), c, COST, policy, "1xCP8", forecaster=clairvoyant_forecaster)
