"""The rank actors of the Ray-hosted torch engine: creation in their placement-group bundles, the rendezvous
store, generations of the process-group world, and death detection.

World invariant: every rank of the pool belongs to one torch.distributed world per *generation*; the store is
a ``TCPStore`` served by the server process, keys prefixed by the generation. A dead rank breaks every group
it was in, so bringing a replacement in means a new generation: the newcomer ``connect``s and every surviving
rank ``Regroup``s (destroy + re-init + re-create the aligned groups, weights and KV untouched). Rendezvous is
collective, so a generation change involves all ranks at once.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import ray
import torch.distributed as dist

from vertumnus.config import VertumnusConfig
from vertumnus.engines.torch.messages import RankFailed, RankSpec, Ready
from vertumnus.serving.hosting import RayHosting
from vertumnus.serving.rank_actor import RankActor

log = logging.getLogger("vertumnus.serving")


def rank_actor_name(server_pid: int, rank: int, incarnation: int = 0) -> str:
    """Ray actor name of a rank (namespace ``vertumnus``); unique per server process and incarnation: the
    first actor of rank r is ``vertumnus-<pid>-rank-<r>``, its n-th replacement ``...-rank-<r>.<n>``. A fresh
    name per replacement because a crashed actor's name (SIGKILL, OOM) stays taken until the GCS has processed
    its death, which can be after the replacement is created (``ray.kill`` frees it at once; a crash does not)."""
    base = f"vertumnus-{server_pid}-rank-{rank}"
    return base if incarnation == 0 else f"{base}.{incarnation}"


class RankSet:
    """All rank actors of the pool, indexed by global rank."""

    def __init__(self, cfg: VertumnusConfig, hosting: RayHosting, timeout_s: float) -> None:
        self.cfg = cfg
        self.hosting = hosting
        self.gpn = cfg.pool.gpus_per_node
        self.world = cfg.pool.total_gpus
        self.timeout_s = timeout_s
        self.actors: dict[int, Any] = {}
        self.alive: dict[int, bool] = {}
        self.incarnation: dict[int, int] = {}  # rank -> how many actors it had (names: rank_actor_name)
        self.generation = -1
        # the rendezvous store lives in this process: loopback on a local cluster, the node address otherwise
        self.host = "127.0.0.1" if hosting.owns_cluster else ray.util.get_node_ip_address()
        self.store = dist.TCPStore(
            self.host, 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=timeout_s)
        )
        self.port = self.store.port
        self._cls = ray.remote(RankActor)
        self._watchers: set[asyncio.Task[None]] = set()
        self.closing = False
        self.on_death: Callable[[int, str], None] = lambda rank, reason: None

    def spec(self, rank: int) -> RankSpec:
        c = self.cfg
        return RankSpec(
            rank=rank, world_size=self.world, gpus_per_node=self.gpn, degrees=tuple(c.pool.degrees), model=c.model,
            block_tokens=c.cache.block_tokens, capacity_blocks=c.pool.kv_capacity_blocks_per_rank,
            retain=c.cache.retention(),
            device="cuda" if self.hosting.use_gpu else "cpu", threads=1, timeout_s=self.timeout_s,
        )  # fmt: skip

    def spawn(self, rank: int) -> None:
        """Create the actor of ``rank`` in its node's placement-group bundle and start watching it."""
        node, local = divmod(rank, self.gpn)
        opts = self.hosting.rank_options(node, local)
        # named so an operator (or the fault tests) can find a rank: ray.get_actor(name, namespace="vertumnus")
        n = self.incarnation.get(rank, -1) + 1
        self.incarnation[rank] = n
        name = rank_actor_name(os.getpid(), rank, n)
        actor = self._cls.options(max_concurrency=2, name=name, **opts).remote(self.spec(rank))
        self.actors[rank] = actor
        self.alive[rank] = True
        task = asyncio.get_running_loop().create_task(self._watch(rank, actor))
        self._watchers.add(task)
        task.add_done_callback(self._watchers.discard)

    async def _watch(self, rank: int, actor: Any) -> None:
        """Returns when the actor closes; its death (any error) is reported at once."""
        try:
            await actor.watch.remote()
        except Exception as e:  # RayActorError / ActorDiedError / ActorUnavailableError
            if self.closing or self.actors.get(rank) is not actor:
                return
            self.alive[rank] = False
            self.on_death(rank, f"rank {rank} actor died: {type(e).__name__}")

    async def connect(self, rank: int, generation: int) -> None:
        """A fresh actor joins the world of ``generation`` (collective with every other rank)."""
        reply = await self.actors[rank].connect.remote(self.host, self.port, generation)
        if isinstance(reply, RankFailed):
            raise RuntimeError(f"rank {rank} could not join generation {generation}: {reply.message}")
        assert isinstance(reply, Ready)

    def dead(self) -> list[int]:
        return sorted(r for r, ok in self.alive.items() if not ok)

    async def responsive(self, rank: int, timeout_s: float) -> bool:
        """Whether the actor of ``rank`` answers a trivial call within ``timeout_s``: its step lane is free
        (``max_concurrency=2``: one thread for ``watch``, one for everything else), so no step is stuck in it."""
        actor = self.actors.get(rank)
        if actor is None or not self.alive.get(rank, False):
            return False
        try:
            await asyncio.wait_for(asyncio.wrap_future(actor.pid.remote().future()), timeout_s)
        except Exception:  # TimeoutError, or the actor died meanwhile
            return False
        return True

    def replace(self, rank: int) -> None:
        """Kill the actor of ``rank`` (if any is left) and spawn a fresh one under a new name: for a dead rank,
        and for a survivor that does not answer (blocked in a collective with its dead peer until the collective
        timeout)."""
        old = self.actors.pop(rank, None)  # popped first: its watcher then ignores the death we cause
        if old is not None:
            try:
                ray.kill(old, no_restart=True)
            except Exception:
                log.debug("kill of rank %d failed", rank, exc_info=True)
        self.spawn(rank)

    def kill(self, rank: int) -> None:
        actor = self.actors.get(rank)
        if actor is not None:
            try:
                ray.kill(actor, no_restart=True)
            except Exception:
                log.debug("kill of rank %d failed", rank, exc_info=True)

    def close(self) -> None:
        """Kill every rank actor (the store goes away with this object)."""
        self.closing = True
        for t in list(self._watchers):
            t.cancel()
        for r in list(self.actors):
            self.kill(r)
        self.actors.clear()
