"""Restart of a FAILED worker of the Ray-hosted torch engine, run for
:class:`~vertumnus.serving.ray_data_plane.RayDataPlane`.

A restart respawns dead ranks, moves the whole world to a new generation (newcomers connect, survivors Regroup —
through their worker's FIFO, at a step boundary) and assigns the worker again under its new epoch with an empty
cache. An attempt that fails is retried with backoff, its ranks replaced again.

A lost Ray node (every rank of a pool node dead at once): the restart first waits until the pool node's placement
group is placed again (Ray reschedules it once a Ray node offering its bundles exists: the host back, or a
replacement) and until every replacement rank answers; only then does the world move to a new generation.
Starting the generation change earlier would park every survivor in a rendezvous with a rank that cannot start,
stopping the whole pool for a lost node.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from vertumnus.engines.torch.messages import Regroup
from vertumnus.serving.ray_cache_ops import StepItem, WorkerFailed, WorkerLane
from vertumnus.types import WorkerGroup

if TYPE_CHECKING:
    from vertumnus.serving.ray_data_plane import RayDataPlane

log = logging.getLogger("vertumnus.serving")

RESTART_BACKOFF_S = (1.0, 30.0)  # first retry delay of a failed restart attempt, cap of the doubling
PROBE_S = 3.0  # a survivor rank of a failed worker that does not answer within this is replaced


class WorkerRecovery:
    """Restarts FAILED workers of a data plane (see module docstring)."""

    def __init__(self, plane: RayDataPlane) -> None:
        self.plane = plane
        self.failures = 0  # failed restart attempts (/v1/pool ``engine_stats.restart_failures``)
        self._stale: set[int] = set()  # ranks to replace on the next restart attempt (a failed attempt's)
        self._fresh: set[int] = set()  # replaced and joined, not yet assigned (their worker still FAILED)
        self._regroups: dict[int, asyncio.Future[None]] = {}  # worker -> its pending regroup (restart waits)

    def worker_failed(self, worker_id: int) -> None:
        """``worker_id`` failed: its regroup will never run, so the restart waiting for it fails now (and
        retries) instead of hanging."""
        regroup = self._regroups.pop(worker_id, None)
        if regroup is not None and not regroup.done():
            regroup.set_exception(WorkerFailed(f"worker {worker_id} failed before its regroup"))

    async def restart(self, group: WorkerGroup, epoch: int) -> None:
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
                if self.plane.ranks.closing:
                    return
                log.warning(
                    "restart of worker %d (attempt %d) failed: %s: %s; retrying in %.0f s",
                    group.worker_id, attempt, type(e).__name__, e, delay,
                )  # fmt: skip
                self.failures += 1
                self._stale.update(group.global_ranks(self.plane.gpn))
                await asyncio.sleep(delay)
                delay = min(delay * 2, RESTART_BACKOFF_S[1])

    async def _restart_once(self, group: WorkerGroup, epoch: int) -> None:
        p = self.plane
        await p.placement.until_placed(group.node)  # a lost Ray node: wait for it (module docstring)
        async with p.world_lock:
            # fresh actors for: dead ranks, the ranks of a failed earlier attempt, and every survivor of a failed
            # worker that does not answer a probe within PROBE_S (its step lane is busy: it sits in a collective
            # with its dead peer until the collective timeout). A survivor that answers is idle: it regroups
            # with the rest (its process group is rebuilt, its cache emptied by the assignment) — replacing it
            # would cost a process start (seconds to tens of seconds on a loaded 2-core machine)
            t0 = p.clock()
            stale = set(p.ranks.dead()) | self._stale
            survivors = sorted(
                {r for w in p.workers.values() if w.failed for r in w.ranks} - stale - self._fresh
            )  # fmt: skip
            answers = await asyncio.gather(*(p.ranks.responsive(r, PROBE_S) for r in survivors))
            stale.update(r for r, ok in zip(survivors, answers, strict=True) if not ok)
            for r in sorted(stale):
                p.ranks.replace(r)
            self._stale -= stale
            # every newcomer runs before the generation changes: the survivors' regroup is a rendezvous with
            # the newcomers, and a survivor parked in it serves nothing (its placement group may have been
            # placed but an actor can still fail to start there)
            try:
                await self._newcomers_ready(sorted(stale))
            except RuntimeError:
                self._stale |= stale
                raise
            gen = p.ranks.generation + 1
            p.ranks.generation = gen
            waits: list[Awaitable[Any]] = [p.ranks.connect(r, gen) for r in sorted(stale)]
            in_live: set[int] = set()
            for w in p.workers.values():
                if w.failed:
                    continue
                in_live.update(w.ranks)
                fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                self._regroups[w.group.worker_id] = fut
                p.enqueue(w, StepItem(self._regroup_item(w, gen, fut)), front=True)
                waits.append(fut)
            # ranks in no live worker that were replaced by an earlier restart (their worker still FAILED)
            idle = [r for r in range(p.ranks.world) if r not in in_live and r not in stale]
            if idle:
                waits.append(p.step_ranks(idle, lambda r: Regroup(gen)))
            try:
                await asyncio.gather(*waits)
            except BaseException:
                # whatever did not join this generation is replaced on the next attempt
                self._fresh -= stale | set(idle)
                self._stale |= stale | set(idle)
                raise
            self._fresh |= stale
            t_world = p.clock()
            # test hook: a restarting worker held at START waits here, its ranks back, until released (so a
            # test sees the outage: /health 503 while it is the only worker)
            await p.holds.at_start(group.worker_id, "restart")
            lane = p.new_worker(group)
            self._fresh -= set(group.global_ranks(p.gpn))
            try:
                await p.assign(group, epoch)
            except BaseException:
                # not a new failure for the pool (it still waits for this restart's acks): the lane only must not
                # count as live on the next attempt (its ranks are replaced, not regrouped)
                lane.failed = True
                lane.queue.clear()
                raise
            log.warning(
                "worker %d restarted under epoch %d in %.1f s (ranks replaced: %s, kept: %s; generation %d in %.1f s)",
                group.worker_id, epoch, p.clock() - t0, sorted(stale) or "none",
                sorted(set(survivors) - stale) or "none", gen, t_world - t0,
            )  # fmt: skip

    async def _newcomers_ready(self, ranks: list[int]) -> None:
        """Until every rank of ``ranks`` (fresh actors) answers; RuntimeError after ``ranks.timeout_s``, or at
        once when the pool node of one of them is no longer placed. The second case is a lost Ray node whose
        ranks' deaths arrived (connection lost: ActorUnavailableError) before the GCS declared the node dead and
        rescheduled its group: the attempt then ends instead of waiting the whole bound for actors that cannot
        start, and the retry waits for the placement (``PlacementWatch.until_placed``)."""
        p = self.plane
        deadline = p.clock() + p.ranks.timeout_s
        pending = list(ranks)
        while pending:
            ok = await asyncio.gather(*(p.ranks.responsive(r, 1.0) for r in pending))
            pending = [r for r, up in zip(pending, ok, strict=True) if not up]
            if not pending:
                return
            lost = sorted({r // p.gpn for r in pending if not p.placement.placed(r // p.gpn)})
            if lost:
                raise RuntimeError(f"pool node(s) {lost} lost their placement while ranks {pending} started")
            if p.clock() > deadline:
                raise RuntimeError(f"replacement ranks {pending} did not start within {p.ranks.timeout_s:.0f} s")

    def _regroup_item(self, w: WorkerLane, gen: int, fut: asyncio.Future[None]) -> Callable[[], Awaitable[None]]:
        async def run() -> None:
            try:
                await self.plane.worker_step(w, lambda r: Regroup(gen))
            finally:
                if self._regroups.get(w.group.worker_id) is fut:
                    del self._regroups[w.group.worker_id]
                if not fut.done():
                    fut.set_result(None)

        return run
