"""The embedded decode pool: Ray decode actors running :class:`~vertumnus.serving.decode_engine.DecodeEngine`.

Each actor is an async Ray actor; ``generate`` is a streaming generator (one Ray object per chunk). The server
passes the prefill worker's exported KV as an ObjectRef, so the KV moves rank → object store → decode actor
without passing through the server process. Sequences on one actor interleave token by token (each generator
yields control after every step). Abort is explicit and idempotent: the server calls :meth:`DecodeActor.abort`
when a client goes away, the generator notices between two steps and frees the sequence's KV.

Chunking: the first token goes out alone (it defines TTFT); later tokens are batched for up to
``_CHUNK_S`` seconds to bound the per-token Ray overhead.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import ray

from vertumnus.config import ModelConfig
from vertumnus.serving.decode_engine import DecodeEngine, KVHandle, PrefillOutput
from vertumnus.serving.handoff import DecodeChunk, DecodeRequest
from vertumnus.serving.sampling import SamplingParams, TokenLogprob

log = logging.getLogger("vertumnus.serving")
_CHUNK_S = 0.01
_MAX_ABORTED = 4096


class DecodeActor:
    """Ray actor body (wrapped with ``ray.remote`` by :class:`EmbeddedDecode`)."""

    def __init__(self, model_cfg: dict[str, Any], device: str) -> None:
        import torch

        torch.set_num_threads(1)
        self.engine = DecodeEngine(ModelConfig.model_validate(model_cfg), device)
        self._aborted: set[str] = set()
        self.finished = 0

    async def ready(self) -> bool:
        return True

    async def generate(
        self, request_id: str, handle: KVHandle, params: SamplingParams, eos_ids: frozenset[int]
    ) -> AsyncIterator[DecodeChunk]:
        """Stream one request's tokens; the sequence's KV is freed on finish, abort or error."""
        kv = await handle.kv_ref  # object store → this actor (never through the server process)
        if request_id in self._aborted:
            self._aborted.discard(request_id)
            return
        self.engine.open(request_id, PrefillOutput(kv, handle.logits), params, eos_ids)
        try:
            want_lp = params.logprobs is not None
            tok, reason, lp = self.engine.step(request_id)
            yield DecodeChunk([tok], reason, [lp] if lp is not None else None)
            while reason is None:
                toks: list[int] = []
                lps: list[TokenLogprob] = []
                t0 = time.monotonic()
                while reason is None and time.monotonic() - t0 < _CHUNK_S:
                    await asyncio.sleep(0)  # let other sequences and abort() run between steps
                    if request_id in self._aborted:
                        return
                    tok, reason, lp = self.engine.step(request_id)
                    toks.append(tok)
                    if lp is not None:
                        lps.append(lp)
                yield DecodeChunk(toks, reason, lps if want_lp else None)
        finally:
            self.engine.close(request_id)
            self._aborted.discard(request_id)
            self.finished += 1

    async def abort(self, request_id: str) -> None:
        if len(self._aborted) >= _MAX_ABORTED:
            self._aborted.clear()  # stale aborts of requests that never reached this actor
        self._aborted.add(request_id)
        self.engine.close(request_id)

    async def stats(self) -> dict[str, int]:
        return {"active": self.engine.active, "finished": self.finished}


class EmbeddedDecode:
    """DecodeBackend over ``n`` decode actors; a request goes to the actor with the fewest open streams."""

    def __init__(self, model_cfg: ModelConfig, n_actors: int, use_gpu: bool) -> None:
        if n_actors < 1:
            raise ValueError("serving.decode_actors must be ≥ 1 for the embedded decode pool")
        self.model_cfg = model_cfg
        self.n = n_actors
        self.use_gpu = use_gpu
        self.actors: list[Any] = []
        self._load: list[int] = []
        self._where: dict[str, int] = {}

    def _spawn(self) -> Any:
        opts: dict[str, Any] = {"num_cpus": 1, "num_gpus": 1 if self.use_gpu else 0, "max_concurrency": 1000}
        device = "cuda" if self.use_gpu else "cpu"
        return ray.remote(DecodeActor).options(**opts).remote(self.model_cfg.model_dump(), device)

    async def start(self) -> None:
        self.actors = [self._spawn() for _ in range(self.n)]
        self._load = [0] * self.n
        await asyncio.gather(*(a.ready.remote() for a in self.actors))

    async def stream(self, req: DecodeRequest) -> AsyncIterator[DecodeChunk]:
        rid = req.handoff.request_id
        if req.handoff.kv is None:
            raise RuntimeError("the prefill engine produced no KV hand-off for the embedded decode pool")
        i = min(range(self.n), key=self._load.__getitem__)
        self._load[i] += 1
        self._where[rid] = i
        actor = self.actors[i]
        finished = False
        try:
            gen = actor.generate.options(num_returns="streaming").remote(rid, req.handoff.kv, req.params, req.eos_ids)
            async for ref in gen:
                chunk: DecodeChunk = await ref
                finished = chunk.finish_reason is not None
                yield chunk
        except ray.exceptions.RayActorError:
            if self.actors[i] is actor:  # replace a dead decode actor once; this request fails, later ones go on
                log.warning("decode actor %d died; starting a new one", i)
                self.actors[i] = self._spawn()
            raise
        finally:
            self._load[i] -= 1
            self._where.pop(rid, None)
            if not finished:  # closed early (client gone, stop string): free the sequence's KV now
                actor.abort.remote(rid)

    async def abort(self, request_id: str) -> None:
        i = self._where.get(request_id)
        if i is not None:
            try:
                await self.actors[i].abort.remote(request_id)
            except ray.exceptions.RayError:
                log.warning("decode actor %d unreachable while aborting %s", i, request_id)

    async def stats(self) -> dict[str, Any]:
        per = await asyncio.gather(*(a.stats.remote() for a in self.actors), return_exceptions=True)
        actors = [p if isinstance(p, dict) else {"error": type(p).__name__} for p in per]
        return {"backend": "embedded", "active": sum(int(a.get("active", 0)) for a in actors), "actors": actors}

    async def close(self) -> None:
        for a in self.actors:
            try:
                ray.kill(a)
            except Exception:
                log.debug("decode actor kill failed", exc_info=True)
        self.actors = []
