"""Where a vLLM worker's engine runs: the Ray bundle, GPUs and CPU cores of the worker's ranks.

The server's hosting (:mod:`vertumnus.serving.hosting`) reserves one STRICT_PACK placement group per pool node,
one bundle per rank (one GPU + one CPU, or one CPU slot). A degree-C worker covers the aligned ranks
``[first, first + C)`` of one node (the lattice guarantees workers never overlap), so:

- the engine actor is scheduled into the bundle of the worker's *first* rank (1 CPU, no GPU resource: vLLM
  starts its own processes, which Ray does not track);
- GPU: its processes see exactly the GPUs of the C ranks — the physical ids each bundle was given, probed once
  per node at start-up — through ``CUDA_VISIBLE_DEVICES``; vLLM's PCP rank k runs on the k-th of them;
- CPU: the engine's OpenMP threads are bound to the rank slots' cores (rank mod core count of the node) unless
  ``vllm.cpu_threads_bind`` says otherwise.

A reconfiguration stops the participating engines before it starts the targets, so the new engine lands on the
same bundles / GPUs the old ones released.
"""

from __future__ import annotations

from typing import Any

import ray
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from vertumnus.serving.hosting import RayHosting
from vertumnus.types import WorkerGroup


@ray.remote(num_cpus=0)
def _bundle_gpu() -> list[str]:
    return [str(i) for i in ray.get_gpu_ids()]


@ray.remote(num_cpus=0)
def _node_cores() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


class Placement:
    """Per-node device ids of every rank, and the Ray options of a worker's engine actor."""

    def __init__(self, hosting: RayHosting, gpus_per_node: int) -> None:
        self.hosting = hosting
        self.gpn = gpus_per_node
        self.use_gpu = hosting.use_gpu
        self.gpu_ids: dict[tuple[int, int], str] = {}
        self.cores: dict[int, int] = {}

    def probe(self, timeout_s: float = 120.0) -> None:
        """Ask each bundle which GPU it holds (GPU) or each node how many cores it has (CPU)."""
        refs: dict[tuple[int, int], Any] = {}
        for node, pg in enumerate(self.hosting.node_groups):
            if self.use_gpu:
                for r in range(self.gpn):
                    strategy = PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=r)
                    refs[(node, r)] = _bundle_gpu.options(num_gpus=1, scheduling_strategy=strategy).remote()
            else:
                strategy = PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=0)
                refs[(node, -1)] = _node_cores.options(scheduling_strategy=strategy).remote()
        values = ray.get(list(refs.values()), timeout=timeout_s)
        for (node, r), got in zip(refs, values, strict=True):
            if r < 0:
                self.cores[node] = int(got)
            else:
                self.gpu_ids[(node, r)] = ",".join(got)

    def env(self, group: WorkerGroup) -> dict[str, str]:
        """Device visibility of the worker's engine processes."""
        if self.use_gpu:
            ids = [self.gpu_ids[(group.node, r)] for r in group.ranks]
            return {"CUDA_VISIBLE_DEVICES": ",".join(ids)}
        return {}

    def cpu_cores(self, group: WorkerGroup) -> list[int] | None:
        """The cores of the worker's CPU slots (None on GPU)."""
        if self.use_gpu:
            return None
        n = max(self.cores.get(group.node, 1), 1)
        return sorted({r % n for r in group.ranks})

    def options(self, group: WorkerGroup, env: dict[str, str]) -> dict[str, Any]:
        """``.options(...)`` of the worker's engine actor (see module docstring)."""
        strategy = PlacementGroupSchedulingStrategy(
            placement_group=self.hosting.node_groups[group.node], placement_group_bundle_index=group.first_rank
        )
        return {
            "num_cpus": 1,
            "num_gpus": 0,
            "scheduling_strategy": strategy,
            "max_restarts": 0,
            "max_concurrency": 64,
            "runtime_env": {"env_vars": env},
            "name": None,
        }
