"""The embedded vLLM decode engine: a :class:`~vertumnus.serving.handoff.DecodeBackend` over one vLLM actor.

Used when the pool runs vLLM workers and ``serving.decode_url`` is not set (``vllm.decode_engine``). It serves
the same model with prefix caching; with a KV connector configured it is the ``kv_consumer`` and the hand-off's
``kv_transfer_params`` go with each request, so it loads the prefill worker's KV instead of recomputing the
prompt (vLLM's P/D pattern). Without a connector it recomputes the prompt — correct, just slower. Ends of
generation are decided by the server's ``eos_ids`` (sent as stop ids, EOS itself ignored), like the external
endpoint backend.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

import ray

from vertumnus.config import VertumnusConfig
from vertumnus.engines.vllm.actor import EngineActor
from vertumnus.engines.vllm.engine_args import EngineSpec, decode_spec
from vertumnus.engines.vllm.worker import call
from vertumnus.serving.handoff import DecodeChunk, DecodeRequest

log = logging.getLogger("vertumnus.vllm")


class VllmDecode:
    """DecodeBackend on one embedded vLLM engine actor (see module docstring)."""

    def __init__(self, cfg: VertumnusConfig, use_gpu: bool) -> None:
        spec = decode_spec(cfg, use_gpu)
        self.spec = EngineSpec(spec.kwargs, spec.env, kv_transfer=spec.kv_transfer, label="decode")
        self.use_gpu = use_gpu
        self.timeout_s = cfg.vllm.start_timeout_s
        self.actor: Any = None
        self.info: dict[str, Any] = {}
        self._open: set[str] = set()
        self.external_hit_tokens = 0  # prompt tokens the decode engine did not compute (cache or connector)

    async def start(self) -> None:
        cls = ray.remote(EngineActor)
        self.actor = cls.options(
            num_cpus=1, num_gpus=1 if self.use_gpu else 0, max_concurrency=1000, max_restarts=0,
            runtime_env={"env_vars": self.spec.env},
        ).remote(self.spec)  # fmt: skip
        self.info = await call(self.actor.start.remote())
        log.info("vLLM decode engine started in %.1f s", self.info["start_s"])

    async def stream(self, req: DecodeRequest) -> AsyncIterator[DecodeChunk]:
        assert self.actor is not None, "start() not called"
        h, p = req.handoff, req.params
        rid = h.request_id
        self._open.add(rid)
        gen = self.actor.stream.options(num_returns="streaming").remote(
            rid, list(h.token_ids), p.max_tokens, p.temperature, p.top_p, p.seed,
            sorted(req.eos_ids | p.stop_token_ids), h.kv_transfer_params,
        )  # fmt: skip
        first = True
        try:
            async for ref in gen:
                ids, reason, cached = await ref
                if first:
                    self.external_hit_tokens += int(cached)
                    first = False
                yield DecodeChunk(list(ids), reason)
        finally:
            self._open.discard(rid)

    async def abort(self, request_id: str) -> None:
        if self.actor is not None and request_id in self._open:
            with contextlib.suppress(Exception):
                await self.actor.abort.remote(request_id)

    async def stats(self) -> dict[str, Any]:
        return {"backend": "vllm", "active": len(self._open), "cached_prompt_tokens": self.external_hit_tokens}

    async def close(self) -> None:
        actor, self.actor = self.actor, None
        if actor is not None:
            with contextlib.suppress(Exception):
                await call(actor.shutdown.remote())
            with contextlib.suppress(Exception):
                ray.kill(actor, no_restart=True)
