"""The body of a vLLM engine actor: one ``AsyncLLM`` per CP worker (or the embedded decode engine).

The data plane wraps :class:`EngineActor` with ``ray.remote`` and places it in the bundle of the worker's first
rank (:mod:`~vertumnus.engines.vllm.placement`); vLLM's own processes (engine core, and for PCP > 1 one worker
process per rank) are children of the actor and see exactly the worker's GPUs (``CUDA_VISIBLE_DEVICES``) or CPU
cores (``VLLM_CPU_OMP_THREADS_BIND``). vLLM is imported only inside the methods, so this module can be imported
where vLLM is not installed.

Start-up failures keep vLLM's own message (e.g. ``Model Runner V1 does not support: prefill context parallel``
when PCP is refused on this platform / model): there is no fallback to another degree.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import time
from collections.abc import AsyncIterator
from typing import Any

import numpy as np

from vertumnus.engines.vllm.engine_args import EngineSpec
from vertumnus.ports import free_port


class EngineRefused(RuntimeError):
    """vLLM refused to build or start the engine; the message is vLLM's."""


def engine_args(spec: EngineSpec, replay_endpoint: str | None) -> Any:
    """``AsyncEngineArgs`` of ``spec`` (raises vLLM's own errors)."""
    from vllm import AsyncEngineArgs
    from vllm.config import KVEventsConfig, KVTransferConfig

    kw = dict(spec.kwargs)
    if spec.events_endpoint is not None:
        kw["kv_events_config"] = KVEventsConfig(
            enable_kv_cache_events=True,
            publisher="zmq",
            endpoint=spec.events_endpoint,
            replay_endpoint=replay_endpoint,
            topic=spec.topic,
        )
    if spec.kv_transfer is not None:
        kw["kv_transfer_config"] = KVTransferConfig(**spec.kv_transfer)
    return AsyncEngineArgs(**kw)


def check_spec(spec: EngineSpec) -> str | None:
    """Build vLLM's full engine configuration without starting anything; vLLM's refusal message or None."""
    os.environ.update(spec.env)
    try:
        engine_args(spec, None).create_engine_config()
    except Exception as e:  # vLLM raises ValueError / pydantic ValidationError / AssertionError / RuntimeError
        return _message(e)
    return None


def _message(e: BaseException) -> str:
    """vLLM's error as one line (pydantic validation errors: just their messages)."""
    errors = getattr(e, "errors", None)
    if callable(errors):
        try:
            return "; ".join(str(err["msg"]) for err in errors())
        except Exception:  # not a pydantic error after all
            pass
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


class EngineActor:
    """Ray actor body (async: one event loop runs the engine's output handler and every call)."""

    def __init__(self, spec: EngineSpec) -> None:
        self.spec = spec
        self.engine: Any = None
        self.info: dict[str, Any] = {}
        self._rng = np.random.default_rng(0)

    async def start(self) -> dict[str, Any]:
        """Build and start the engine; returns what the data plane needs (block size, hash seed, replay
        endpoint, start-up seconds). Raises :class:`EngineRefused` with vLLM's message on failure."""
        from vllm.v1.engine.async_llm import AsyncLLM

        os.environ.update(self.spec.env)
        replay = None
        if self.spec.events_endpoint is not None:
            host = self.spec.replay_host
            replay = f"tcp://{host}:{free_port(host)}"
        t0 = time.perf_counter()
        try:
            self.engine = AsyncLLM.from_engine_args(engine_args(self.spec, replay))
        except Exception as e:
            raise EngineRefused(f"vLLM engine {self.spec.label} did not start: {_message(e)}") from None
        cfg = self.engine.vllm_config
        self.info = {
            "start_s": time.perf_counter() - t0,
            "block_size": int(cfg.cache_config.block_size),
            "dcp": int(cfg.parallel_config.decode_context_parallel_size),
            "pcp": int(cfg.parallel_config.prefill_context_parallel_size),
            "hash_algo": str(cfg.cache_config.prefix_caching_hash_algo),
            "hash_seed": os.environ.get("PYTHONHASHSEED"),
            "replay_endpoint": replay,
            "max_model_len": int(cfg.model_config.max_model_len),
            "vocab_size": int(cfg.model_config.get_vocab_size()),
            "kv_blocks": int(cfg.cache_config.num_gpu_blocks or 0),
            "pid": os.getpid(),
        }
        return self.info

    async def prefill(
        self,
        request_id: str,
        token_ids: list[int],
        kv_transfer_params: dict[str, Any] | None = None,
        report_hits: bool = False,
    ) -> dict[str, Any]:
        """One prefill (``max_tokens=1``). ``report_hits``: vLLM also publishes BlockStored for the blocks it
        reused (``kv_cache_report_mode="full"``) — cache ops use it to confirm blocks already resident."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        extra: dict[str, Any] = {}
        if kv_transfer_params is not None:
            extra["kv_transfer_params"] = kv_transfer_params
        if report_hits:
            extra["kv_cache_report_mode"] = "full"
        sp = SamplingParams(max_tokens=1, temperature=0.0, detokenize=False, extra_args=extra or None)
        t0 = time.perf_counter()
        out = None
        async for step in self.engine.generate(TokensPrompt(prompt_token_ids=token_ids), sp, request_id=request_id):
            out = step
        assert out is not None and out.finished
        return {
            "cached_tokens": int(out.num_cached_tokens or 0),
            "kv_transfer_params": out.kv_transfer_params,
            "first_token": int(out.outputs[0].token_ids[0]) if out.outputs[0].token_ids else None,
            "elapsed_s": time.perf_counter() - t0,
        }

    async def stream(
        self,
        request_id: str,
        token_ids: list[int],
        max_tokens: int,
        temperature: float,
        top_p: float,
        seed: int | None,
        stop_token_ids: list[int],
        kv_transfer_params: dict[str, Any] | None = None,
    ) -> AsyncIterator[tuple[list[int], str | None, int]]:
        """Decode: yields (new token ids, finish reason or None, cached prompt tokens) as vLLM produces them."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        extra = {"kv_transfer_params": kv_transfer_params} if kv_transfer_params is not None else None
        sp = SamplingParams(
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=top_p,
            seed=seed,
            stop_token_ids=stop_token_ids,
            ignore_eos=True,
            detokenize=False,
            extra_args=extra,
        )
        sent = 0
        try:
            async for out in self.engine.generate(TokensPrompt(prompt_token_ids=token_ids), sp, request_id=request_id):
                ids = list(out.outputs[0].token_ids)
                reason = out.outputs[0].finish_reason if out.finished else None
                if len(ids) > sent or reason is not None:
                    yield ids[sent:], reason, int(out.num_cached_tokens or 0)
                    sent = len(ids)
        finally:
            with contextlib.suppress(Exception):
                await self.engine.abort(request_id)

    async def abort(self, request_id: str) -> None:
        with contextlib.suppress(Exception):
            await self.engine.abort(request_id)

    async def profile_prefill(self, r: int, p: int, repeats: int, vocab: int) -> list[float]:
        """Queue-free prefill times (seconds, engine-side) of r uncached tokens after a cached prefix of p
        tokens: per repeat, a fresh random prompt; its first p tokens are prefilled untimed first. Raises if
        vLLM reused anything but exactly p tokens (p must be a multiple of the block size)."""
        return [seconds for seconds, _ in await self.profile_runs(r, p, repeats, vocab)]

    async def profile_runs(self, r: int, p: int, repeats: int, vocab: int) -> list[tuple[float, int]]:
        """:meth:`profile_prefill` with the cached tokens vLLM reported: ``(seconds, cached)`` per repeat."""
        runs: list[tuple[float, int]] = []
        for i in range(repeats):
            toks = self._rng.integers(0, vocab, size=r + p).tolist()
            tag = f"profile-{time.monotonic_ns()}-{i}"
            if p:
                await self.prefill(f"{tag}-prefix", toks[:p])
            got = await self.prefill(tag, toks)
            if got["cached_tokens"] != p:
                raise RuntimeError(f"vLLM reused {got['cached_tokens']} cached tokens, expected {p}")
            runs.append((float(got["elapsed_s"]), int(got["cached_tokens"])))
        return runs

    async def reset_prefix_cache(self) -> bool:
        """Drop every cached block (vLLM publishes AllBlocksCleared)."""
        return bool(await self.engine.reset_prefix_cache())

    async def ping(self) -> int:
        return os.getpid()

    async def shutdown(self, timeout_s: float = 2.0) -> None:
        """Stop the engine and its processes (SIGTERM, SIGKILL after ``timeout_s``; callers stop only idle,
        parked engines); the actor itself is killed by the caller."""
        engine, self.engine = self.engine, None
        if engine is not None:
            await asyncio.get_running_loop().run_in_executor(
                None, functools.partial(engine.shutdown, timeout=timeout_s)
            )
