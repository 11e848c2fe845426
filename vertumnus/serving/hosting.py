"""Ray hosting: start or join a cluster and reserve one placement group per pool node.

Local start (no ``--address`` / ``RAY_ADDRESS``): ``ray.init`` with ``num_cpus`` sized for the rank slots plus the
decode actors plus one spare, no dashboard, logs in a fresh temp dir, torch limited to one thread per process.

Placement invariant: pool node n is one Ray placement group with ``gpus_per_node`` bundles (one GPU, or one CPU
slot, each) and strategy STRICT_PACK, so every bundle — and therefore every rank of every worker the lattice can
ever form on that node (split or merge never leaves a node) — lands on one Ray node. Rank r of node n runs in
bundle r; a restarted rank reuses the bundle its dead predecessor freed.

Pool node → Ray node (``serving.ray_node_resource``, docs/serving.md "Several Ray nodes"): with the resource set,
bundle 0 of every pool node's group asks for one unit of it, and each Ray node meant to host a pool node offers
exactly one unit, so two pool nodes never share a Ray node (anti-affinity by a unit resource: it works with one
KubeRay worker group of N replicas, unlike per-index resources or labels). When a Ray node is lost, Ray
reschedules its placement group (state RESCHEDULING) and places it again on the next Ray node that offers the
resource and the slots — the same host restarted, or a replacement pod::

    pool node 0 ── PG0 [b0: CPU+unit][b1: CPU] ──► Ray node A (unit 1)
    pool node 1 ── PG1 [b0: CPU+unit][b1: CPU] ──► Ray node B (unit 1)   B lost ⇒ PG1 RESCHEDULING ⇒ B' (unit 1)
    head (no unit): the server, decode actors
"""

from __future__ import annotations

import logging
import os
import tempfile
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.util.placement_group import PlacementGroup, placement_group, placement_group_table, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from vertumnus.config import VertumnusConfig

log = logging.getLogger("vertumnus.serving")


@dataclass(frozen=True, slots=True)
class NodePlacement:
    """Pool node ``node``'s placement group: the Ray node holding it (None while it is not placed) and its GCS
    state (CREATED, RESCHEDULING after its Ray node was lost, PENDING, ...)."""

    node: int
    ray_node_id: str | None
    state: str

    @property
    def placed(self) -> bool:
        return self.ray_node_id is not None

    def as_json(self) -> dict[str, Any]:
        return {"node": self.node, "ray_node_id": self.ray_node_id, "state": self.state.lower()}


@dataclass(slots=True)
class RayHosting:
    """The cluster this server runs on and the per-node placement groups of the prefill pool."""

    use_gpu: bool
    owns_cluster: bool  # this process started a local cluster (and stops it on close)
    temp_dir: str | None
    gcs_address: str = ""
    node_groups: list[PlacementGroup] = field(default_factory=list)

    def placements(self) -> list[NodePlacement]:
        """Where each pool node's placement group is now (a GCS call per group: call it off the event loop)."""
        out: list[NodePlacement] = []
        for n, pg in enumerate(self.node_groups):
            try:
                table = placement_group_table(pg)
            except Exception:  # GCS unreachable: unknown, shown as not placed
                log.debug("placement group table of pool node %d failed", n, exc_info=True)
                out.append(NodePlacement(n, None, "UNKNOWN"))
                continue
            ids = {i for i in table.get("bundles_to_node_id", {}).values() if i}
            state = str(table.get("state", "UNKNOWN"))
            out.append(NodePlacement(n, ids.pop() if state == "CREATED" and len(ids) == 1 else None, state))
        return out

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


# Scheduling priority of the Ray workers (rank and decode actors) of a cluster Vertumnus starts: the server's own.
# A cluster Vertumnus joins sets it at `ray start` (env RAY_worker_niceness=0; docs/serving.md).
WORKER_NICENESS = 0


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
                # Ray starts its workers at nice 15 by default; the rank actors *are* the engine, so any nice-0
                # process on the host (the server itself, a tokenizer, a batch job) could starve them: beside two
                # nice-0 CPU-bound processes on 2 cores, a replacement rank did not finish starting in 120 s.
                _system_config={"worker_niceness": WORKER_NICENESS},
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
    marker = cfg.serving.ray_node_resource
    if marker:
        try:
            check_pool_nodes(cfg, ray.nodes(), "GPU" if use_gpu else "CPU")
        except ValueError:
            hosting.close()
            raise
    for n in range(cfg.pool.nodes):
        bundles = [dict(bundle) for _ in range(cfg.pool.gpus_per_node)]
        if marker:
            bundles[0][marker] = 1.0  # anti-affinity: one unit per Ray node (module docstring)
        pg = placement_group(bundles, strategy="STRICT_PACK", name=f"vertumnus-node-{n}-{os.getpid()}")
        hosting.node_groups.append(pg)
    for n, pg in enumerate(hosting.node_groups):
        if not pg.wait(timeout_seconds=timeout_s):
            hosting.close()
            raise ValueError(
                f"placement group of pool node {n} was not placed within {timeout_s:.0f} s "
                f"(needs {cfg.pool.gpus_per_node} × {bundle} on one Ray node)"
            )
    return hosting


def check_pool_nodes(cfg: VertumnusConfig, nodes: list[dict[str, Any]], unit: str) -> None:
    """ValueError naming the missing resources unless at least ``pool.nodes`` alive Ray nodes offer
    ``serving.ray_node_resource`` and ``pool.gpus_per_node`` slots of ``unit`` (CPU or GPU) each: without them a
    placement group would wait forever (a hang at start-up instead of an error)."""
    marker, gpn = cfg.serving.ray_node_resource, cfg.pool.gpus_per_node
    assert marker
    fit: list[str] = []
    short: list[str] = []
    for n in nodes:
        res = n.get("Resources", {})
        if not n.get("Alive") or res.get(marker, 0.0) < 1.0:
            continue
        (fit if res.get(unit, 0.0) >= gpn else short).append(f"{n['NodeID'][:12]} ({res.get(unit, 0.0):g} {unit})")
    if len(fit) >= cfg.pool.nodes:
        return
    few = f"; with too few {unit} slots: {', '.join(short)}" if short else ""
    raise ValueError(
        f"pool.nodes={cfg.pool.nodes} needs {cfg.pool.nodes} alive Ray nodes, each offering the resource "
        f"{marker!r} (serving.ray_node_resource) and {gpn} {unit} slots (pool.gpus_per_node); the cluster has "
        f"{len(fit)}{few}. Start the missing {cfg.pool.nodes - len(fit)} with "
        f"`ray start --address <head> --num-{unit.lower()}s {gpn} --resources '{{\"{marker}\": 1}}'`"
    )


def _want_gpu(device: str, gpus: float) -> bool:
    if device == "cuda":
        if gpus < 1:
            raise ValueError("serving.device is 'cuda' but the Ray cluster has no GPUs")
        return True
    return device == "auto" and gpus >= 1
