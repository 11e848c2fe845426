"""Ray hosting: start or join a cluster and reserve one placement group per pool node.

Local start (no ``--address`` / ``RAY_ADDRESS``): ``ray.init`` with ``num_cpus`` sized for the rank slots plus the
decode actors plus one spare, no dashboard, logs in a fresh temp dir, torch limited to one thread per process.

Placement invariant: pool node n is one Ray placement group with ``gpus_per_node`` bundles (one GPU, or one CPU
slot, each) and strategy STRICT_PACK, so every bundle — and therefore every rank of every worker the lattice can
ever form on that node (split or merge never leaves a node) — lands on one Ray node. Rank r of node n runs in
bundle r; a restarted rank reuses the bundle its dead predecessor freed.
"""

from __future__ import annotations

import logging
import os
import tempfile
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from vertumnus.config import VertumnusConfig

log = logging.getLogger("vertumnus.serving")


@dataclass(slots=True)
class RayHosting:
    """The cluster this server runs on and the per-node placement groups of the prefill pool."""

    use_gpu: bool
    owns_cluster: bool  # this process started a local cluster (and stops it on close)
    temp_dir: str | None
    gcs_address: str = ""
    node_groups: list[PlacementGroup] = field(default_factory=list)

    def rank_options(self, node: int, local_rank: int) -> dict[str, Any]:
        """``.options(...)`` for the rank actor of (node, local rank): its bundle, one GPU or one CPU."""
        strategy = PlacementGroupSchedulingStrategy(
            placement_group=self.node_groups[node], placement_group_bundle_index=local_rank
        )
        res: dict[str, Any] = {"num_cpus": 1, "num_gpus": 1} if self.use_gpu else {"num_cpus": 1}
        return {**res, "scheduling_strategy": strategy, "max_restarts": 0}

    def close(self) -> None:
        """Remove the placement groups; stop the cluster if this process started it."""
        for pg in self.node_groups:
            try:
                remove_placement_group(pg)
            except Exception:  # cluster already gone
                log.debug("placement group removal failed", exc_info=True)
        self.node_groups.clear()
        if self.owns_cluster and ray.is_initialized():
            ray.shutdown()


def start_hosting(cfg: VertumnusConfig, address: str | None = None, timeout_s: float = 300.0) -> RayHosting:
    """Start (or join) Ray and reserve the pool's placement groups; ValueError when the cluster cannot hold
    them (e.g. fewer GPUs than ``pool.nodes × pool.gpus_per_node``)."""
    address = address or os.environ.get("RAY_ADDRESS") or None
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    temp_dir: str | None = None
    started = False
    if not ray.is_initialized():  # already initialised: inside a Ray actor (e.g. a Ray Serve replica)
        if address:
            ray.init(address=address, namespace="vertumnus", log_to_driver=False)
        else:
            temp_dir = tempfile.mkdtemp(prefix="vertumnus-ray-")
            slots = cfg.pool.total_gpus
            ray.init(
                num_cpus=slots + max(cfg.serving.decode_actors, 0) + 1,
                include_dashboard=False,
                namespace="vertumnus",
                _temp_dir=temp_dir,
                log_to_driver=False,
                configure_logging=False,
            )
            started = True
            log.info("local Ray cluster started; logs under %s", temp_dir)
    resources = ray.cluster_resources()
    use_gpu = _want_gpu(cfg.serving.device, float(resources.get("GPU", 0.0)))
    gcs = ray.get_runtime_context().gcs_address
    hosting = RayHosting(use_gpu, owns_cluster=started, temp_dir=temp_dir, gcs_address=gcs)
    bundle = {"GPU": 1.0, "CPU": 1.0} if use_gpu else {"CPU": 1.0}
    need = cfg.pool.total_gpus
    if not use_gpu and cfg.serving.cpu_slots != need:
        hosting.close()
        raise ValueError(
            f"serving.cpu_slots={cfg.serving.cpu_slots} must equal pool.nodes × pool.gpus_per_node "
            f"= {need} when the ranks run on CPU slots"
        )
    have = float(resources.get("GPU" if use_gpu else "CPU", 0.0))
    if have < need:
        hosting.close()
        unit = "GPUs" if use_gpu else "CPU slots"
        raise ValueError(f"the Ray cluster has {have:g} {unit}; the pool needs {need} (pool.nodes × gpus_per_node)")
    for n in range(cfg.pool.nodes):
        pg = placement_group(
            [dict(bundle) for _ in range(cfg.pool.gpus_per_node)],
            strategy="STRICT_PACK",
            name=f"vertumnus-node-{n}-{os.getpid()}",
        )
        hosting.node_groups.append(pg)
    for n, pg in enumerate(hosting.node_groups):
        if not pg.wait(timeout_seconds=timeout_s):
            hosting.close()
            raise ValueError(
                f"placement group of pool node {n} was not placed within {timeout_s:.0f} s "
                f"(needs {cfg.pool.gpus_per_node} × {bundle} on one Ray node)"
            )
    return hosting


def _want_gpu(device: str, gpus: float) -> bool:
    if device == "cuda":
        if gpus < 1:
            raise ValueError("serving.device is 'cuda' but the Ray cluster has no GPUs")
        return True
    return device == "auto" and gpus >= 1
