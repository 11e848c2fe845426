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
  boundary) and assigns the worker again under its new epoch with an empty cache.
- a lost Ray node (every rank of a pool node dead at once): its workers fail as above and the rest of the pool
  serves on (its workers' process groups never include another node's ranks). The restart first waits until the
  pool node's placement group is placed again (Ray reschedules it once a Ray node offering its bundles exists:
  the host back, or a replacement) and until every replacement rank answers; only then does the world move to
  a new generation. Starting the generation change earlier would park every survivor in a rendezvous with a
  rank that cannot start, stopping the whole pool for a lost node.
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
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any

from prometheus_client.core import GaugeMetricFamily

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
    Regroup,
    Reply,
    Reports,
    RunPrefill,
)  # fmt: skip
from vertumnus.interfaces import EngineEvents, PrefillJob
from vertumnus.serving.decode_engine import KVHandle
from vertumnus.serving.handoff import Handoff
from vertumnus.serving.holds import HoldAt, PrefillHolds
from vertumnus.serving.hosting import NodePlacement, RayHosting
from vertumnus.serving.ray_cache_ops import CacheOps, StepItem, WorkerFailed, WorkerLane
from vertumnus.serving.ray_ranks import RankSet
from vertumnus.types import CacheOp, PrefillResult, ReconfigPlan, WorkerGroup

log = logging.getLogger("vertumnus.serving")

RESTART_BACKOFF_S = (1.0, 30.0)  # first retry delay of a failed restart attempt, cap of the doubling
PROBE_S = 3.0  # a survivor rank of a failed worker that does not answer within this is replaced
PLACEMENT_POLL_S = 0.5  # how often the pool nodes' placement groups are read (restart wait, /v1/pool, metrics)


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
        self._world = asyncio.Lock()  # generation changes and restarts, one at a time
        self._ops = CacheOps(self)
        self.holds = PrefillHolds()
        self.holds.on_release = self._pump_all
        self.startup_error: BaseException | None = None
        self._stale: set[int] = set()  # ranks to replace on the next restart attempt (a failed attempt's)
        self._fresh: set[int] = set()  # replaced and joined, not yet assigned (their worker still FAILED)
        self.restart_failures = 0
        self._regroups: dict[int, asyncio.Future[None]] = {}  # worker -> its pending regroup (restart waits)
        self._kv_export = exporter_for(cfg)  # None unless serving.kv_export_path: files for a vLLM decode instance
        self.hosting = hosting
        self.placements: list[NodePlacement] = []  # the pool nodes' placement groups, refreshed every poll

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

    def _new_worker(self, group: WorkerGroup) -> WorkerLane:
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
        regroup = self._regroups.pop(w.group.worker_id, None)
        if regroup is not None and not regroup.done():
            # its regroup will never run: the restart waiting for it fails now (and retries) instead of hanging
            regroup.set_exception(WorkerFailed(f"worker {w.group.worker_id} failed before its regroup"))
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
        self.spawn_task(self._watch_placements(), "placement watch")

    async def _watch_placements(self) -> None:
        """Keep :attr:`placements` current (GCS calls in a thread: never on the event loop)."""
        while True:
            try:
                now = await asyncio.to_thread(self.hosting.placements)
            except Exception:  # logged; the next poll tries again
                log.debug("reading the placement groups failed", exc_info=True)
            else:
                if now != self.placements:
                    if self.placements:
                        log.warning(
                            "pool nodes' placement: %s",
                            ", ".join(f"{p.node}: {p.state.lower()} on {(p.ray_node_id or '-')[:12]}" for p in now),
                        )
                    self.placements = now
            await asyncio.sleep(PLACEMENT_POLL_S)

    async def _until_placed(self, node: int) -> None:
        """Return once pool node ``node``'s placement group is placed (its Ray node alive): at once normally,
        after the node is back (or replaced) when it was lost. No bound: a worker whose node is gone stays
        FAILED — visibly, in /v1/pool's ``ray_nodes`` and /health — until Ray can place its group again."""
        told = False
        while True:
            # read now, not the last poll's: the worker's failure can arrive before the poll saw its node go
            fresh = await asyncio.to_thread(self.hosting.placements)
            p = fresh[node] if node < len(fresh) else None
            if p is not None and p.placed:
                return
            if not told and p is not None:
                log.warning("pool node %d is not placed (%s): its workers restart once it is", node, p.state.lower())
                told = True
            await asyncio.sleep(PLACEMENT_POLL_S)

    # -- EngineStatsSource: where the pool nodes are ------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """/v1/pool ``engine_stats``: each pool node's Ray node and placement state, the world generation."""
        return {
            "ray_nodes": [p.as_json() for p in self.placements],
            "generation": self.ranks.generation,
            "restart_failures": self.restart_failures,
        }

    def collector(self) -> PlacementCollector:
        return PlacementCollector(self)

    def _startup_failed(self, e: BaseException) -> None:
        self.startup_error = e

    async def _start(self, groups: list[WorkerGroup], epoch: int) -> None:
        async with self._world:
            for r in range(self.ranks.world):
                self.ranks.spawn(r)
            self.ranks.generation = 0
            await asyncio.gather(*(self.ranks.connect(r, 0) for r in range(self.ranks.world)))
            for g in groups:
                self._new_worker(g)
            await asyncio.gather(*(self._assign(g, epoch) for g in groups))

    async def _assign(self, g: WorkerGroup, epoch: int) -> None:
        ranks = g.global_ranks(self.gpn)
        self._acks(await self.step_ranks(ranks, lambda r: Assign(g, epoch)), ranks)

    def restart(self, group: WorkerGroup, epoch: int) -> None:
        self.spawn_task(self._restart(group, epoch), f"restart of worker {group.worker_id}")

    async def _restart(self, group: WorkerGroup, epoch: int) -> None:
        """Bring ``group`` back under ``epoch``; an attempt that fails (a newcomer that cannot start or join,
        a survivor that cannot regroup) is retried with backoff, its ranks replaced again — the worker must not
        stay FAILED because one attempt failed. Requests wait in the pool meanwhile (/health says why)."""
        delay = RESTART_BACKOFF_S[0]
        attempt = 0
        while True:
            attempt += 1
            try:
                await self._restart_once(group, epoch)
                return
            except Exception as e:
                if self.ranks.closing:
                    return
                log.warning(
                    "restart of worker %d (attempt %d) failed: %s: %s; retrying in %.0f s",
                    group.worker_id, attempt, type(e).__name__, e, delay,
                )  # fmt: skip
                self.restart_failures += 1
                self._stale.update(group.global_ranks(self.gpn))
                await asyncio.sleep(delay)
                delay = min(delay * 2, RESTART_BACKOFF_S[1])

    async def _restart_once(self, group: WorkerGroup, epoch: int) -> None:
        await self._until_placed(group.node)  # a lost Ray node: wait for it (module docstring)
        async with self._world:
            # fresh actors for: dead ranks, the ranks of a failed earlier attempt, and every survivor of a failed
            # worker that does not answer a probe within PROBE_S (its step lane is busy: it sits in a collective
            # with its dead peer until the collective timeout). A survivor that answers is idle: it regroups
            # with the rest (its process group is rebuilt, its cache emptied by the assignment) — replacing it
            # would cost a process start (seconds to tens of seconds on a loaded 2-core machine)
            t0 = self.clock()
            stale = set(self.ranks.dead()) | self._stale
            survivors = sorted(
                {r for w in self.workers.values() if w.failed for r in w.ranks} - stale - self._fresh
            )  # fmt: skip
            answers = await asyncio.gather(*(self.ranks.responsive(r, PROBE_S) for r in survivors))
            stale.update(r for r, ok in zip(survivors, answers, strict=True) if not ok)
            for r in sorted(stale):
                self.ranks.replace(r)
            self._stale -= stale
            # every newcomer runs before the generation changes: the survivors' regroup is a rendezvous with
            # the newcomers, and a survivor parked in it serves nothing (its placement group may have been
            # placed but an actor can still fail to start there)
            try:
                await self._newcomers_ready(sorted(stale))
            except RuntimeError:
                self._stale |= stale
                raise
            gen = self.ranks.generation + 1
            self.ranks.generation = gen
            waits: list[Awaitable[Any]] = [self.ranks.connect(r, gen) for r in sorted(stale)]
            in_live: set[int] = set()
            for w in self.workers.values():
                if w.failed:
                    continue
                in_live.update(w.ranks)
                fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                self._regroups[w.group.worker_id] = fut
                self.enqueue(w, StepItem(self._regroup_item(w, gen, fut)), front=True)
                waits.append(fut)
            # ranks in no live worker that were replaced by an earlier restart (their worker still FAILED)
            idle = [r for r in range(self.ranks.world) if r not in in_live and r not in stale]
            if idle:
                waits.append(self.step_ranks(idle, lambda r: Regroup(gen)))
            try:
                await asyncio.gather(*waits)
            except BaseException:
                # whatever did not join this generation is replaced on the next attempt
                self._fresh -= stale | set(idle)
                self._stale |= stale | set(idle)
                raise
            self._fresh |= stale
            t_world = self.clock()
            # test hook: a restarting worker held at START waits here, its ranks back, until released (so a
            # test sees the outage: /health 503 while it is the only worker)
            await self.holds.at_start(group.worker_id, "restart")
            lane = self._new_worker(group)
            self._fresh -= set(group.global_ranks(self.gpn))
            try:
                await self._assign(group, epoch)
            except BaseException:
                # not a new failure for the pool (it still waits for this restart's acks): the lane only must not
                # count as live on the next attempt (its ranks are replaced, not regrouped)
                lane.failed = True
                lane.queue.clear()
                raise
            log.warning(
                "worker %d restarted under epoch %d in %.1f s (ranks replaced: %s, kept: %s; generation %d in %.1f s)",
                group.worker_id, epoch, self.clock() - t0, sorted(stale) or "none",
                sorted(set(survivors) - stale) or "none", gen, t_world - t0,
            )  # fmt: skip

    async def _newcomers_ready(self, ranks: list[int]) -> None:
        """Until every rank of ``ranks`` (fresh actors) answers; RuntimeError after ``ranks.timeout_s``, or at
        once when the pool node of one of them is no longer placed. The second case is a lost Ray node whose
        ranks' deaths arrived (connection lost: ActorUnavailableError) before the GCS declared the node dead and
        rescheduled its group: the attempt then ends instead of waiting the whole bound for actors that cannot
        start, and the retry waits for the placement (``_until_placed``)."""
        deadline = self.clock() + self.ranks.timeout_s
        pending = list(ranks)
        while pending:
            ok = await asyncio.gather(*(self.ranks.responsive(r, 1.0) for r in pending))
            pending = [r for r, up in zip(pending, ok, strict=True) if not up]
            if not pending:
                return
            lost = sorted({r // self.gpn for r in pending if not self._placed(r // self.gpn)})
            if lost:
                raise RuntimeError(f"pool node(s) {lost} lost their placement while ranks {pending} started")
            if self.clock() > deadline:
                raise RuntimeError(f"replacement ranks {pending} did not start within {self.ranks.timeout_s:.0f} s")

    def _placed(self, node: int) -> bool:
        """Whether pool node ``node`` is placed as of the last poll (True before the first: unknown yet)."""
        return node >= len(self.placements) or self.placements[node].placed

    def _regroup_item(self, w: WorkerLane, gen: int, fut: asyncio.Future[None]) -> Callable[[], Awaitable[None]]:
        async def run() -> None:
            try:
                await self.worker_step(w, lambda r: Regroup(gen))
            finally:
                if self._regroups.get(w.group.worker_id) is fut:
                    del self._regroups[w.group.worker_id]
                if not fut.done():
                    fut.set_result(None)

        return run

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
        targets = [self._new_worker(t) for t in plan.targets]
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


class PlacementCollector:
    """``vertumnus_pool_node_placed{node}``: 1 while pool node n's placement group is placed on a live Ray node,
    0 while it is not (its Ray node lost, Ray rescheduling the group); read at scrape time."""

    def __init__(self, plane: RayDataPlane) -> None:
        self._plane = plane

    def collect(self) -> Iterator[GaugeMetricFamily]:
        g = GaugeMetricFamily(
            "vertumnus_pool_node_placed",
            "1 while the pool node's placement group is placed on a live Ray node, else 0.",
            labels=["node"],
        )
        for p in self._plane.placements:
            g.add_metric([str(p.node)], 1.0 if p.placed else 0.0)
        yield g
