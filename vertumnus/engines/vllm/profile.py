"""Queue-free timing of one vLLM worker per degree: the ``vllm`` engine's profiling hook.

:class:`VllmProfiler` follows :class:`vertumnus.profiling.targets.ProfilingTarget` (``setup(C)`` →
``measure(C, r, p)`` … → ``teardown(C)``), so ``vertumnus profile --engine vllm`` can use it as its target.
``setup`` brings up a one-worker pool of degree C (Ray placement group of C slots, the same engine arguments a
pool worker gets, KV events off); ``measure`` runs, inside the engine actor, a fresh random prompt of
``p + r`` tokens whose first ``p`` tokens were prefilled (untimed) just before, and returns the engine-side wall
time of the prefill with ``max_tokens=1`` — no queue, no Ray round trip. vLLM must report exactly ``p`` cached
tokens (``p`` a multiple of ``vllm.block_size``), otherwise the point is an error rather than a silently wrong
sample. :meth:`profile_prefill` is the one-call form (median of repeats).
"""

from __future__ import annotations

import contextlib
import statistics
import time
from typing import Any

import ray

from vertumnus.config import VertumnusConfig, config_from_dict
from vertumnus.engines.vllm.actor import EngineActor
from vertumnus.engines.vllm.engine_args import model_label
from vertumnus.engines.vllm.placement import Placement
from vertumnus.serving.hosting import RayHosting, start_hosting
from vertumnus.types import WorkerGroup


def one_worker_config(cfg: VertumnusConfig, degree: int) -> VertumnusConfig:
    """``cfg`` with a pool of exactly one node of ``degree`` ranks (slots) and that one degree."""
    data = cfg.model_dump(mode="json")
    data["pool"].update(nodes=1, gpus_per_node=degree, degrees=[degree], initial_composition=None)
    data["serving"].update(cpu_slots=degree, decode_actors=0)
    data["controller"]["history_trace"] = None
    return config_from_dict(data, f"<vllm profiling config, degree {degree}>")


class VllmProfiler:
    """See module docstring."""

    engine = "vllm"

    def __init__(self, cfg: VertumnusConfig) -> None:
        self.cfg = cfg
        self.model = model_label(cfg)
        self.hardware = "unknown (set up a degree first)"
        self.prefix_align = cfg.vllm.block_size
        self.max_tokens = cfg.pool.max_model_len
        self.actor: Any = None
        self.info: dict[str, Any] = {}
        self._hosting: RayHosting | None = None

    def setup(self, degree: int) -> None:
        """Start one vLLM engine of ``degree`` (vLLM's refusal message if it will not run that degree)."""
        from vertumnus.engines.vllm.data_plane import VllmDataPlane

        self.teardown(degree)
        cfg = one_worker_config(self.cfg, degree)
        self._hosting = start_hosting(cfg)
        placement = Placement(self._hosting, degree)
        placement.probe()
        plane = VllmDataPlane(cfg, self._hosting, time.monotonic, placement)
        group = WorkerGroup(0, 0, 0, degree)
        spec = plane.spec(group)
        spec.label = f"for profiling (CP{degree})"
        self.actor = ray.remote(EngineActor).options(**placement.options(group, spec.env)).remote(spec)
        self.info = ray.get(self.actor.start.remote(), timeout=cfg.vllm.start_timeout_s)
        device = "GPU" if placement.use_gpu else "CPU"
        self.hardware = (
            f"{device}: {self._describe(placement, group)}; vLLM engine, prefill_context_parallel_size={degree}"
        )

    def measure(self, degree: int, r: int, p: int) -> float:
        """Seconds of the prefill of ``r`` tokens after a cached prefix of ``p`` tokens (module docstring)."""
        return self.profile_prefill(r, p, 1)

    def profile_prefill(self, r: int, p: int, repeats: int = 1) -> float:
        """Median over ``repeats`` fresh prompts of the queue-free prefill time of (r, p), in seconds."""
        if self.actor is None:
            raise RuntimeError("setup(degree) first")
        if r < 1 or p < 0 or p % self.prefix_align:
            raise ValueError(f"need r ≥ 1 and p a multiple of vllm.block_size={self.prefix_align}; got r={r}, p={p}")
        vocab = int(self.info.get("vocab_size", self.cfg.model.vocab_size))
        times = ray.get(self.actor.profile_prefill.remote(r, p, repeats, vocab), timeout=3600)
        return float(statistics.median(times))

    def teardown(self, degree: int) -> None:
        """Stop the engine and release the slots."""
        actor, self.actor = self.actor, None
        if actor is not None:
            with contextlib.suppress(Exception):  # already dead: the kill below is enough
                ray.get(actor.shutdown.remote(), timeout=60)
            ray.kill(actor, no_restart=True)
        hosting, self._hosting = self._hosting, None
        if hosting is not None:
            hosting.close()

    @staticmethod
    def _describe(placement: Placement, group: WorkerGroup) -> str:
        if placement.use_gpu:
            return f"GPUs {placement.env(group).get('CUDA_VISIBLE_DEVICES', '?')}"
        cores = placement.cpu_cores(group) or []
        return f"cores {cores} of {placement.cores.get(group.node, '?')}"
