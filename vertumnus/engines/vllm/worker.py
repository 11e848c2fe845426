"""One vLLM CP worker as the data plane sees it: its engine actor, KV-event feed, block mirror and FIFO.

Lifecycle: ``launch`` (subscriber bound, actor placed, engine started, replay socket known) → ready → items run
one at a time from the FIFO → ``stop`` (engine shut down, actor killed, feed closed). A restarted or
reconfigured worker is a new :class:`VllmWorker` (new actor, new feed whose sequence numbers restart at 0);
the old object's late events are dropped because they name its ``generation``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import ray

from vertumnus.engines.vllm.actor import EngineActor
from vertumnus.engines.vllm.blockmap import WorkerBlocks
from vertumnus.engines.vllm.engine_args import EngineSpec
from vertumnus.engines.vllm.hashing import VllmBlockHasher
from vertumnus.engines.vllm.subscriber import KvEventSubscriber
from vertumnus.interfaces import PrefillJob
from vertumnus.types import WorkerGroup

log = logging.getLogger("vertumnus.vllm")

_ActorCls = ray.remote(EngineActor)

# What a P/D prefill sends (vLLM's disaggregation proxies send the same keys; connectors fill in the rest).
REMOTE_DECODE_PARAMS: dict[str, Any] = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}


@dataclass(slots=True)
class RestartRecord:
    """One reconfiguration on vLLM workers: engines stopped, then the targets' engines started."""

    epoch: int
    sources: tuple[int, ...]
    targets: tuple[int, ...]
    stop_s: float
    start_s: float

    @property
    def total_s(self) -> float:
        return self.stop_s + self.start_s


def check_engine(info: dict[str, Any], hasher: VllmBlockHasher | None, seed: str | None) -> None:
    """The started engine hashes blocks as Vertumnus does (block size, seed, sha256_cbor) or RuntimeError."""
    assert hasher is not None
    e_tokens = int(info["block_size"]) * int(info.get("dcp", 1))
    if e_tokens != hasher.block_tokens or info.get("hash_seed") != seed:
        raise RuntimeError(
            f"engine hashes blocks of {e_tokens} tokens with seed {info.get('hash_seed')!r}; expected "
            f"{hasher.block_tokens} tokens and seed {seed!r} (vllm.block_size / vllm.hash_seed)"
        )
    if info.get("hash_algo") != "sha256_cbor":
        raise RuntimeError(f"engine uses prefix_caching_hash_algo={info.get('hash_algo')!r}, need sha256_cbor")


@dataclass(slots=True)
class Item:
    """One FIFO entry: a prefill (``job`` set, withdrawable) or an internal step (cache op, park)."""

    run: Callable[[], Awaitable[None]]
    job: PrefillJob | None = None
    op_id: int | None = None  # a cache op's prefill: failed explicitly if the worker goes away first


@dataclass(slots=True)
class VllmWorker:
    group: WorkerGroup
    generation: int
    ranks: tuple[int, ...]
    actor: Any = None
    feed: KvEventSubscriber | None = None
    blocks: WorkerBlocks | None = None
    hasher: VllmBlockHasher | None = None
    info: dict[str, Any] = field(default_factory=dict)
    queue: deque[Item] = field(default_factory=deque)
    busy: bool = False
    ready: bool = False
    parking: bool = False
    failed: bool = False
    stopped: bool = False

    @property
    def worker_id(self) -> int:
        return self.group.worker_id

    async def launch(
        self, spec: EngineSpec, options: dict[str, Any], feed: KvEventSubscriber, timeout_s: float
    ) -> dict[str, Any]:
        """Start ``feed`` (its SUB socket is already bound), place the actor, start the engine; returns the
        engine's info. Raises with vLLM's message (or a timeout) — the caller marks the worker FAILED."""
        self.feed = feed
        feed.start()
        spec.events_endpoint = feed.endpoint
        spec.topic = f"vertumnus-w{self.worker_id}"
        self.actor = _ActorCls.options(**options).remote(spec)
        self.info = await asyncio.wait_for(_ref(self.actor.start.remote()), timeout_s)
        feed.set_replay(self.info.get("replay_endpoint"))
        return self.info

    async def stop(self, timeout_s: float = 30.0) -> None:
        """Shut the engine down (its processes exit), kill the actor, close the feed (idempotent)."""
        if self.stopped:
            return
        self.stopped = True
        self.ready = False
        actor, self.actor = self.actor, None
        if actor is not None:
            try:
                await asyncio.wait_for(_ref(actor.shutdown.remote()), timeout_s)
            except Exception:  # dead actor or stuck shutdown: the kill below ends it
                log.debug("engine shutdown of worker %d failed", self.worker_id, exc_info=True)
            with contextlib.suppress(Exception):
                ray.kill(actor, no_restart=True)
        if self.feed is not None:
            self.feed.stop()
        if self.blocks is not None:
            self.blocks.detach()


async def _ref(ref: Any) -> Any:
    """Await a Ray ObjectRef, unwrapping Ray's task error into the original exception's message."""
    try:
        return await ref
    except ray.exceptions.RayTaskError as e:
        cause = e.cause if getattr(e, "cause", None) is not None else e
        text = " ".join(str(cause).split()) or type(cause).__name__
        raise RuntimeError(text[:2000]) from None


async def call(ref: Any) -> Any:
    """Public alias of :func:`_ref` for the data plane's engine calls."""
    return await _ref(ref)


def stop_all(workers: list[VllmWorker], timeout_s: float = 30.0) -> None:
    """Synchronous shutdown of many engines at once (server exit): graceful first, then killed."""
    refs = [w.actor.shutdown.remote() for w in workers if w.actor is not None]
    if refs:
        ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
    for w in workers:
        w.ready = False
        w.stopped = True
        if w.actor is not None:
            with contextlib.suppress(Exception):
                ray.kill(w.actor, no_restart=True)
            w.actor = None
        if w.feed is not None:
            w.feed.stop()
