"""The torch data plane's step FIFOs without Ray: the test hooks (hold at QUEUE / at START, release, fail a
worker) and what a background step that raises does (it fails its request / cache op / worker / the start-up
visibly instead of leaving someone waiting). The rank actors are stand-ins that record the commands they get and
answer like a rank (or not at all): only the driver's own logic is under test here; tests/serving/test_server_*
run the same paths on real rank actors."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest
import torch
import yaml
from server_harness import TEST_CONFIG

from vertumnus.config import VertumnusConfig, config_from_dict
from vertumnus.cost_model import CostModel
from vertumnus.engines.torch.messages import Command, Exported, PrefillDone, RunPrefill
from vertumnus.interfaces import PrefillJob
from vertumnus.serving.holds import HoldAt
from vertumnus.serving.instant import InstantDecode
from vertumnus.serving.ray_data_plane import RayDataPlane
from vertumnus.serving.runtime import ServingRuntime
from vertumnus.types import CacheOp, CacheOpKind, CacheReport, Placement, PrefillResult, Request, WorkerGroup

Reply = Callable[[Command], tuple[list[Any], Any]]


def _cfg() -> VertumnusConfig:
    return config_from_dict(yaml.safe_load(TEST_CONFIG.read_text()))


class Hosting:
    """What RankSet needs from RayHosting; placing a rank actor fails (no Ray here)."""

    use_gpu = False
    owns_cluster = True

    def rank_options(self, node: int, local_rank: int) -> dict[str, Any]:
        raise RuntimeError("no placement group in this test")


class Rank:
    """A stand-in rank actor: ``step.remote(cmd)`` records ``cmd`` and answers with ``reply(cmd)``."""

    def __init__(self, reply: Reply) -> None:
        self.reply = reply
        self.sent: list[Command] = []

    @property
    def step(self) -> Rank:
        return self

    def remote(self, cmd: Command) -> Any:
        self.sent.append(cmd)

        async def answer() -> tuple[list[Any], Any]:
            return self.reply(cmd)

        return answer()


def prefill_reply(cmd: Command) -> tuple[list[Any], Any]:
    assert isinstance(cmd, RunPrefill)
    return [PrefillDone(cmd.worker_id, 0, cmd.request_id, 0, 0.0, torch.zeros(4))], "kv-ref"


class Events:
    """Records every EngineEvents callback."""

    def __init__(self) -> None:
        self.log: list[tuple[str, Any]] = []

    def prefill_started(self, worker_id: int, request_id: str, now: float) -> None:
        self.log.append(("started", request_id))

    def prefill_done(self, result: PrefillResult) -> None:
        self.log.append(("done", result))

    def cache_report(self, report: CacheReport) -> None:
        self.log.append(("report", report))

    def cache_op_failed(self, op_id: int, reason: str) -> None:
        self.log.append(("op_failed", (op_id, reason)))

    def worker_parked(self, worker_id: int, now: float) -> None:
        self.log.append(("parked", worker_id))

    def epoch_ack(self, worker_id: int, rank: int, epoch: int, now: float) -> None:
        self.log.append(("ack", (worker_id, rank)))

    def worker_failed(self, worker_id: int, reason: str, now: float) -> None:
        self.log.append(("failed", (worker_id, reason)))

    def kinds(self) -> list[str]:
        return [k for k, _ in self.log]


def plane(replies: dict[int, Reply]) -> tuple[RayDataPlane, Events, dict[int, Rank]]:
    """A data plane with one CP1 worker per rank in ``replies`` (worker id = rank), events recorded."""
    dp = RayDataPlane(_cfg(), Hosting(), time.monotonic)  # type: ignore[arg-type]
    ev = Events()
    dp._events = ev
    ranks = {r: Rank(reply) for r, reply in replies.items()}
    for r, rank in ranks.items():
        dp.ranks.actors[r] = rank
        dp.new_worker(WorkerGroup(r, 0, r, 1))
    return dp, ev, ranks


def job(rid: str, worker: int) -> PrefillJob:
    ids = list(range(1, 40))
    req = Request(rid, 0.0, len(ids), (11,), token_ids=ids)
    return PrefillJob(req, Placement(rid, worker, 1, 0, len(ids), 0.1, 0.0, 0.1, 1, 0))


async def settle() -> None:
    for _ in range(20):  # every ready task runs to its next wait (the stand-in ranks answer at once)
        await asyncio.sleep(0)


def test_hold_at_queue_accepts_jobs_but_starts_none_until_released() -> None:
    async def run() -> None:
        dp, ev, ranks = plane({2: prefill_reply})
        dp.holds.hold([2], HoldAt.QUEUE)
        dp.submit(2, job("a", 2))
        dp.submit(2, job("b", 2))
        await settle()
        assert ev.log == [] and ranks[2].sent == []
        assert [j.request.request_id for j in dp.withdraw(2)] == ["a", "b"]  # still queued: withdrawable
        dp.submit(2, job("c", 2))
        assert dp.holds.release([2]) == 0
        await settle()
        assert ev.kinds() == ["started", "done"] and [c.request_id for c in ranks[2].sent] == ["c"]  # type: ignore[attr-defined]
        assert ev.log[1][1].ok and ev.log[1][1].request_id == "c"

    asyncio.run(run())


def test_hold_at_start_runs_the_first_prefill_up_to_the_ranks_and_queues_the_rest() -> None:
    async def run() -> None:
        dp, ev, ranks = plane({2: prefill_reply, 3: prefill_reply})
        dp.holds.hold(None, HoldAt.START)  # every worker
        for rid in ("a", "b"):
            dp.submit(2, job(rid, 2))
        dp.submit(3, job("c", 3))
        await settle()
        assert ev.log == [("started", "a"), ("started", "c")] and not ranks[2].sent and not ranks[3].sent
        assert dp.holds.state()["waiting"] == [{"worker": 2, "request": "a"}, {"worker": 3, "request": "c"}]
        assert [j.request.request_id for j in dp.withdraw(2)] == ["b"]  # "a" runs: not withdrawable
        dp.submit(2, job("b", 2))
        assert dp.holds.release([3]) == 0  # a hold of every worker is not a named one
        assert dp.holds.release(None) == 2
        await settle()
        assert [c.request_id for c in ranks[2].sent] == ["a", "b"]  # type: ignore[attr-defined]
        assert [r.request_id for k, r in ev.log if k == "done"] == ["a", "c", "b"]

    asyncio.run(run())


def test_a_prefill_held_on_a_worker_that_failed_never_reaches_its_ranks() -> None:
    async def run() -> None:
        dp, ev, ranks = plane({2: prefill_reply})
        dp.holds.hold([2], HoldAt.START)
        dp.submit(2, job("a", 2))
        dp.submit(2, job("b", 2))
        await settle()
        dp.fail_worker(2, "test")
        dp.holds.release(None)
        await settle()
        assert ev.log == [("started", "a"), ("failed", (2, "test"))]  # the pool re-places a and b
        assert ranks[2].sent == []
        with pytest.raises(KeyError):
            dp.fail_worker(9, "no such worker")

    asyncio.run(run())


def test_a_prefill_step_that_raises_fails_its_request_not_the_worker() -> None:
    """Before: the exception was logged by the task wrapper and swallowed; the request waited forever."""

    def no_reply(cmd: Command) -> tuple[list[Any], Any]:
        return [], None  # no PrefillDone: the driver cannot find the lead rank's reply

    async def run() -> None:
        dp, ev, ranks = plane({2: no_reply})
        dp.submit(2, job("a", 2))
        await settle()
        assert ev.kinds() == ["started", "done"]
        result = ev.log[1][1]
        assert not result.ok and result.request_id == "a" and "StopIteration" in (result.error or "")
        ranks[2].reply = prefill_reply  # the worker still serves
        dp.submit(2, job("b", 2))
        await settle()
        assert ev.kinds() == ["started", "done", "started", "done"] and ev.log[3][1].ok

    asyncio.run(run())


def test_a_cache_op_step_that_raises_fails_the_op() -> None:
    """Before: swallowed — the op was never confirmed nor failed."""

    def bad_export(cmd: Command) -> tuple[list[Any], Any]:
        return [Exported(7, 3, 0, (11, 12), torch.zeros(1))], None  # two keys, one block: malformed

    async def run() -> None:
        dp, ev, _ = plane({2: prefill_reply, 3: bad_export})
        dp.execute(CacheOp(7, CacheOpKind.REPLICATE, 2, (11, 12), 0, src_worker=3))
        await settle()
        assert [k for k in ev.kinds()] == ["op_failed"] and ev.log[0][1][0] == 7
        assert "ValueError" in ev.log[0][1][1]

    asyncio.run(run())


def test_a_failed_start_up_is_raised_at_once_not_after_the_start_up_timeout() -> None:
    """Before: the runtime waited its whole start-up timeout and then said the workers were not ACTIVE."""
    cfg = _cfg()
    dp = RayDataPlane(cfg, Hosting(), time.monotonic)  # type: ignore[arg-type]
    cost = CostModel.from_file(cfg.resolve_path(cfg.cost_model.profile))
    runtime = ServingRuntime(cfg, dp, InstantDecode(), cost, "torch")
    with pytest.raises(RuntimeError, match="data plane failed to start: RuntimeError: no placement group"):
        asyncio.run(runtime.start(timeout_s=60))
    dp.close()
