"""The torch CP engine hosted on Ray: a :class:`~vertumnus.interfaces.DataPlane` over rank actors.

Per worker the driver (this object, on the server's event loop) keeps one FIFO of *items* and runs one at a time;
an item is one engine step sent to every rank of the worker concurrently, so all ranks of a worker execute the
same command sequence (required: their block indexes are replicated and every collective needs all of them)::

    submit ──► [prefill][prefill][import]... ──► step(cmd) on ranks r0..rC-1 ──► replies ──► EngineEvents

- prefill: (reconcile import first, if the job carries one) → RunPrefill → PrefillDone from every rank; the
  first rank's cache reports and the KV ObjectRef (put into the object store by the rank) → hand-off;
- park / activate: Park on every rank, then Activate on every rank of every target (split / merge in place);
- cache ops: Export is read-only and rank-local, so it goes straight to the source ranks (no queue: a worker
  waiting for a copy from another worker can never deadlock on it); Import / Remove change the replicated index
  and therefore go through the destination's FIFO;
- failures: a dead rank actor (watcher), an actor error or a RankFailed reply marks the worker FAILED once
  (``events.worker_failed``; the pool re-places its jobs); ``restart`` respawns dead ranks, moves the whole
  world to a new generation (newcomers connect, survivors Regroup — through their worker's FIFO, at a step
  boundary) and assigns the worker again under its new epoch with an empty cache (serving/ray_recovery.py).
- a lost Ray node (every rank of a pool node dead at once): its workers fail as above and the rest of the pool
  serves on (its workers' process groups never include another node's ranks). The restart first waits until the
  pool node's placement group is placed again (Ray reschedules it once a Ray node offering its bundles exists:
  the host back, or a replacement) and until every replacement rank answers; only then does the world move to
  a new generation. Starting the generation change earlier would park every survivor in a rendezvous with a
  rank that cannot start, stopping the whole pool for a lost node (serving/ray_placement.py: the wait).
- errors: every background task belongs to something that fails visibly when the task raises — a prefill's
  request (``prefill_done`` with ``ok=False``: the client gets a 500), a cache op (``cache_op_failed``), a
  worker (FAILED: its jobs are re-placed), the targets of an activation (FAILED), the start-up (``startup_error``,
  which the runtime raises at once instead of waiting out its start-up timeout).
- test hook (``serving.test_hooks``, vertumnus/serving/holds.py): a held worker does not start, or does not run,
  its next prefill until released.
Re-entrancy: no DataPlane method calls back into the pool synchronously; all work runs in loop tasks.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from vertumnus.config import VertumnusConfig
from vertumnus.engines.torch.kv_export import exporter_for
from vertumnus.engines.torch.messages import (
    Activate,
    Assign,
    Command,
    EpochAck,
    Park,
    PrefillDone,
    RankFailed,
    Reply,
    Reports,
    RunPrefill,
)  # fmt: skip
from vertumnus.interfaces import EngineEvents, PrefillJob
from vertumnus.serving.decode_engine import KVHandle
from vertumnus.serving.handoff import Handoff
from vertumnus.serving.holds import HoldAt, PrefillHolds
from vertumnus.serving.hosting import RayHosting
from vertumnus.serving.ray_cache_ops import CacheOps, StepItem, WorkerFailed, WorkerLane
from vertumnus.serving.ray_placement import PlacementCollector, PlacementWatch
from vertumnus.serving.ray_ranks import RankSet
from vertumnus.serving.ray_recovery import WorkerRecovery
from vertumnus.types import CacheOp, PrefillResult, ReconfigPlan, WorkerGroup

log = logging.getLogger("vertumnus.serving")


class RayDataPlane:
    """See module docstring."""

    def __init__(self, cfg: VertumnusConfig, hosting: RayHosting, clock: Callable[[], float]) -> None:
        self.cfg = cfg
        self.clock = clock
        self.gpn = cfg.pool.gpus_per_node
        self.ranks = RankSet(cfg, hosting, timeout_s=min(cfg.serving.startup_timeout_s, 120.0))
        self.ranks.on_death = self._rank_died
        self.workers: dict[int, WorkerLane] = {}
        self.rank_worker: dict[int, int] = {}
        self._handoffs: dict[str, Handoff] = {}
        self._events: EngineEvents | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self.world_lock = asyncio.Lock()  # generation changes and restarts, one at a time
        self._ops = CacheOps(self)
        self.holds = PrefillHolds()
        self.holds.on_release = self._pump_all
        self.startup_error: BaseException | None = None
        self._kv_export = exporter_for(cfg)  # None unless serving.kv_export_path: files for a vLLM decode instance
        self.placement = PlacementWatch(hosting)  # the pool nodes' placement groups, refreshed every poll
        self._recovery = WorkerRecovery(self)

    # -- plumbing -------------------------------------------------------------------------------------------
    @property
    def events(self) -> EngineEvents:
        assert self._events is not None, "start() not called"
        return self._events

    def spawn_task(
        self, coro: Awaitable[Any], what: str, on_error: Callable[[BaseException], None] | None = None
    ) -> None:
        """Run ``coro`` on the loop. An exception is logged and handed to ``on_error``, which fails what the task
        belongs to (a request, an op, a worker) so that nobody waits for it; tasks without an owner only log."""

        async def guarded() -> None:
            try:
                await coro
            except Exception as e:
                log.exception("torch data plane: %s failed", what)
                if on_error is not None:
                    on_error(e)

        task = asyncio.get_running_loop().create_task(guarded())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def new_worker(self, group: WorkerGroup) -> WorkerLane:
        w = WorkerLane(group, group.global_ranks(self.gpn))
        self.workers[group.worker_id] = w
        for r in w.ranks:
            self.rank_worker[r] = group.worker_id
        return w

    def enqueue(self, w: WorkerLane, item: StepItem, front: bool = False) -> None:
        (w.queue.appendleft if front else w.queue.append)(item)
        self._pump(w)

    def _pump(self, w: WorkerLane) -> None:
        """Start the next runnable item (prefills wait while the worker parks or is held at QUEUE)."""
        if w.busy or w.failed or not w.queue:
            return
        if w.queue[0].job is not None and (w.parking or self.holds.mode(w.group.worker_id) == HoldAt.QUEUE):
            return
        item = w.queue.popleft()
        w.busy = True
        self.spawn_task(self._run(w, item), f"worker {w.group.worker_id} step")

    def fail_worker(self, worker_id: int, reason: str) -> None:
        """Test hook: fail ``worker_id`` as a dead rank would (the pool re-places its jobs and restarts it with
        an empty cache under a new epoch)."""
        w = self.workers.get(worker_id)
        if w is None:
            raise KeyError(worker_id)
        self._fail(w, reason)

    def _pump_all(self) -> None:
        for w in list(self.workers.values()):
            self._pump(w)

    async def _run(self, w: WorkerLane, item: StepItem) -> None:
        try:
            await item.run()
        except WorkerFailed:
            pass  # already reported
        except Exception as e:  # a bug in a step: the worker is in an unknown state, so it fails (visibly)
            log.exception("torch data plane: step on worker %d failed", w.group.worker_id)
            self._fail(w, f"step raised {type(e).__name__}: {e}")
        finally:
            w.busy = False
            self._pump(w)

    async def step_ranks(self, ranks: Sequence[int], cmds: Callable[[int], Command]) -> list[tuple[list[Reply], Any]]:
        """Send one command per rank concurrently; WorkerFailed if any rank died or failed."""
        refs = [self.ranks.actors[r].step.remote(cmds(r)) for r in ranks]
        out = await asyncio.gather(*refs, return_exceptions=True)
        for r, res in zip(ranks, out, strict=True):
            if isinstance(res, BaseException):
                raise WorkerFailed(f"rank {r}: {type(res).__name__}: {res}")
            for rep in res[0]:
                if isinstance(rep, RankFailed):
                    raise WorkerFailed(f"rank {r}: {rep.message.strip().splitlines()[-1]}")
        return out  # type: ignore[return-value]

    async def worker_step(self, w: WorkerLane, cmds: Callable[[int], Command]) -> list[tuple[list[Reply], Any]]:
        try:
            return await self.step_ranks(w.ranks, cmds)
        except WorkerFailed as e:
            self._fail(w, str(e))
            raise

    def _fail(self, w: WorkerLane, reason: str) -> None:
        """Mark FAILED once and tell the pool (which re-places the jobs and calls restart)."""
        if w.failed or self.workers.get(w.group.worker_id) is not w:
            return
        w.failed = True
        w.queue.clear()
        self._recovery.worker_failed(w.group.worker_id)
        self.events.worker_failed(w.group.worker_id, reason, self.clock())

    def _rank_died(self, rank: int, reason: str) -> None:
        wid = self.rank_worker.get(rank)
        w = self.workers.get(wid) if wid is not None else None
        if w is not None:
            self._fail(w, reason)

    def _acks(self, out: list[tuple[list[Reply], Any]], ranks: Sequence[int]) -> None:
        now = self.clock()
        for r, (replies, _) in zip(ranks, out, strict=True):
            for rep in replies:
                if isinstance(rep, EpochAck):
                    self.events.epoch_ack(rep.worker_id, r, rep.epoch, now)
                elif isinstance(rep, Reports):
                    for rp in rep.reports:
                        self.events.cache_report(rp)

    # -- DataPlane: lifecycle -------------------------------------------------------------------------------
    def start(self, groups: Sequence[WorkerGroup], epoch: int, events: EngineEvents) -> None:
        self._events = events
        self.spawn_task(self._start(list(groups), epoch), "start-up", self._startup_failed)
        self.spawn_task(self.placement.run(), "placement watch")

    # -- EngineStatsSource: where the pool nodes are ------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """/v1/pool ``engine_stats``: each pool node's Ray node and placement state, the world generation."""
        return {
            "ray_nodes": [p.as_json() for p in self.placement.placements],
            "generation": self.ranks.generation,
            "restart_failures": self._recovery.failures,
        }

    def collector(self) -> PlacementCollector:
        return PlacementCollector(self.placement)

    def _startup_failed(self, e: BaseException) -> None:
        self.startup_error = e

    async def _start(self, groups: list[WorkerGroup], epoch: int) -> None:
        async with self.world_lock:
            for r in range(self.ranks.world):
                self.ranks.spawn(r)
            self.ranks.generation = 0
            await asyncio.gather(*(self.ranks.connect(r, 0) for r in range(self.ranks.world)))
            for g in groups:
                self.new_worker(g)
            await asyncio.gather(*(self.assign(g, epoch) for g in groups))

    async def assign(self, g: WorkerGroup, epoch: int) -> None:
        ranks = g.global_ranks(self.gpn)
        self._acks(await self.step_ranks(ranks, lambda r: Assign(g, epoch)), ranks)

    def restart(self, group: WorkerGroup, epoch: int) -> None:
        self.spawn_task(self._recovery.restart(group, epoch), f"restart of worker {group.worker_id}")

    def close(self) -> None:
        for t in list(self._tasks):
            t.cancel()
        self.ranks.close()
        self._handoffs.clear()

    # -- DataPlane: requests --------------------------------------------------------------------------------
    def submit(self, worker_id: int, job: PrefillJob) -> None:
        w = self.workers[worker_id]
        self.enqueue(w, StepItem(lambda: self._prefill(w, job), job))

    def withdraw(self, worker_id: int) -> list[PrefillJob]:
        w = self.workers[worker_id]
        jobs = [it.job for it in w.queue if it.job is not None]
        w.queue = deque(it for it in w.queue if it.job is None)
        return jobs

    async def _prefill(self, w: WorkerLane, job: PrefillJob) -> None:
        req, wid = job.request, w.group.worker_id
        started = self.clock()
        self.events.prefill_started(wid, req.request_id, started)
        try:
            await self._prefill_steps(w, job, started)
        except WorkerFailed:
            raise  # the worker failed: the pool re-places this job with the others
        except Exception as e:  # this request cannot be served as asked: fail it, not the whole worker
            log.exception("torch data plane: prefill of %s on worker %d failed", req.request_id, wid)
            err = f"{type(e).__name__}: {e}"
            self.events.prefill_done(PrefillResult(req.request_id, wid, 0, started, self.clock(), ok=False, error=err))

    async def _prefill_steps(self, w: WorkerLane, job: PrefillJob, started: float) -> None:
        req, wid = job.request, w.group.worker_id
        await self.holds.at_start(wid, req.request_id)
        if w.failed:
            return  # failed while held: the pool has re-placed the job already
        if job.reconcile is not None:
            await self._ops.copy(job.reconcile, w)
        ids = list(req.token_ids or ())
        cmd = RunPrefill(wid, req.request_id, ids, tuple(req.block_keys), job.max_reuse_blocks, return_kv=True)
        out = await self.worker_step(w, lambda r: cmd)
        done = [rep for replies, _ in out for rep in replies if isinstance(rep, PrefillDone)]
        lead = next(d for d in done if d.rank == 0)
        logits = next(d.logits for d in done if d.logits is not None)
        kv_ref = next(ref for _, ref in out if ref is not None)
        for rep in lead.reports:
            self.events.cache_report(rep)
        if self._kv_export is not None:  # before prefill_done: the decode request must find the files
            await asyncio.to_thread(self._kv_export.export, ids, await kv_ref)
        self._handoffs[req.request_id] = Handoff(req.request_id, ids, KVHandle(kv_ref, logits.cpu()))
        self.events.prefill_done(PrefillResult(req.request_id, wid, lead.cached_tokens, started, self.clock()))
        self._handoffs.pop(req.request_id, None)  # still here: the pool did not accept this completion

    def take_handoff(self, request_id: str) -> Handoff | None:
        return self._handoffs.pop(request_id, None)

    # -- DataPlane: reconfiguration -------------------------------------------------------------------------
    def park(self, worker_ids: Sequence[int]) -> None:
        for wid in worker_ids:
            w = self.workers[wid]
            w.parking = True
            self.enqueue(w, StepItem(lambda w=w: self._park(w)), front=True)  # type: ignore[misc]

    async def _park(self, w: WorkerLane) -> None:
        await self.worker_step(w, lambda r: Park(w.group.worker_id))
        self.events.worker_parked(w.group.worker_id, self.clock())

    def activate(self, plan: ReconfigPlan) -> None:
        what = f"activation of epoch {plan.epoch}"
        self.spawn_task(self._activate(plan), what, lambda e: self._fail_targets(plan, e))

    def _fail_targets(self, plan: ReconfigPlan, e: BaseException) -> None:
        for t in plan.targets:
            w = self.workers.get(t.worker_id)
            if w is not None:
                self._fail(w, f"activation failed: {type(e).__name__}: {e}")

    async def _activate(self, plan: ReconfigPlan) -> None:
        for s in plan.sources:
            self.workers.pop(s.worker_id, None)
        cmds: dict[int, Activate] = {}
        for t in plan.targets:
            for r in t.global_ranks(self.gpn):
                cmds[r] = Activate(plan.kind, plan.epoch, t, tuple(plan.sources))
        ranks = sorted(cmds)
        targets = [self.new_worker(t) for t in plan.targets]
        try:
            out = await self.step_ranks(ranks, cmds.__getitem__)
        except WorkerFailed as e:
            for w in targets:
                self._fail(w, f"activation failed: {e}")
            return
        self._acks(out, ranks)

    # -- DataPlane: cache ops (vertumnus/serving/ray_cache_ops.py) -------------------------------------------
    def execute(self, op: CacheOp) -> None:
        self._ops.execute(op)
