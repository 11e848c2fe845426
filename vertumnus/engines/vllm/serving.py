"""The vLLM backend's seams to the server (:mod:`vertumnus.serving.launcher`).

- :func:`build_data_plane` — ``pool.engine: vllm``: probes the pool's bundles, checks that vLLM accepts every
  allowed degree for this model on this platform (``prefill_context_parallel_size = C``; on CPU and for
  non-MLA models vLLM refuses C > 1 and ``vertumnus serve`` stops with vLLM's own message — there is no
  fallback to C = 1), and returns the :class:`~vertumnus.engines.vllm.data_plane.VllmDataPlane`;
- :func:`build_decode` — the embedded vLLM decode engine (when ``serving.decode_url`` is not set).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import ray
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from vertumnus.config import VertumnusConfig
from vertumnus.engines.vllm.actor import check_spec
from vertumnus.engines.vllm.data_plane import VllmDataPlane
from vertumnus.engines.vllm.decode import VllmDecode
from vertumnus.engines.vllm.engine_args import EngineSpec
from vertumnus.engines.vllm.placement import Placement
from vertumnus.serving.hosting import RayHosting
from vertumnus.types import WorkerGroup

log = logging.getLogger("vertumnus.vllm")


@ray.remote(num_cpus=0)
def _check_specs(specs: list[EngineSpec]) -> list[str | None]:
    return [check_spec(s) for s in specs]


def check_degrees(plane: VllmDataPlane, degrees: Sequence[int], timeout_s: float = 600.0) -> None:
    """ValueError naming every degree vLLM refuses (checked on pool node 0, in its first bundle)."""
    specs = [plane.spec(WorkerGroup(-1, 0, 0, d)) for d in degrees]
    strategy = PlacementGroupSchedulingStrategy(
        placement_group=plane.hosting.node_groups[0], placement_group_bundle_index=0
    )
    env = specs[0].env if specs else {}
    ref = _check_specs.options(scheduling_strategy=strategy, runtime_env={"env_vars": env}).remote(specs)
    errors = ray.get(ref, timeout=timeout_s)
    bad = [f"CP{d}: {msg}" for d, msg in zip(degrees, errors, strict=True) if msg]
    if bad:
        raise ValueError(
            "vLLM refuses the pool's degrees for this model on this platform (pool.degrees / vllm.*):\n  "
            + "\n  ".join(bad)
        )


def build_data_plane(
    cfg: VertumnusConfig, hosting: RayHosting, clock: Callable[[], float], validate: bool = True
) -> VllmDataPlane:
    """The ``pool.engine: vllm`` data plane (see module docstring)."""
    placement = Placement(hosting, cfg.pool.gpus_per_node)
    placement.probe()
    plane = VllmDataPlane(cfg, hosting, clock, placement)
    if validate:
        check_degrees(plane, cfg.pool.degrees)
    return plane


def build_decode(cfg: VertumnusConfig, hosting: RayHosting) -> VllmDecode:
    """The embedded vLLM decode engine (one actor; a GPU of its own on GPU clusters)."""
    if not cfg.vllm.decode_engine:
        raise ValueError("pool.engine 'vllm' needs a decode side: set serving.decode_url or vllm.decode_engine")
    return VllmDecode(cfg, hosting.use_gpu)
