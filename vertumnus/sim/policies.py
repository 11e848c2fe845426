"""Policy names -> (config, routing policy) for one simulation run.

``vertumnus`` runs the full control plane; the ablations and baselines change only configuration switches and
the routing policy, so every policy runs in the same simulator against the same cost model (DESIGN.md §6).
Baselines run a fixed composition (controller off) with engine-native LRU caching only (no replication /
reclamation), like the systems they stand for.
"""

from __future__ import annotations

from vertumnus.config import VertumnusConfig, format_composition, parse_composition
from vertumnus.controller.lattice import Lattice
from vertumnus.scheduler.policy import RoutingPolicy
from vertumnus.sim.baselines import (
    DynamoKVPolicy,
    LeastWorkPolicy,
    LengthThresholdPolicy,
    RoundRobinPolicy,
    SGLangCacheAwarePolicy,
)

VERTUMNUS_POLICIES = ("vertumnus", "vertumnus-norepl", "vertumnus-static")
BASELINES = ("round-robin", "least-work", "length-threshold", "sglang-cache-aware", "dynamo-kv")
LOWER_BOUND = "lower-bound"
POLICIES = (*VERTUMNUS_POLICIES, *BASELINES, LOWER_BOUND)


def check_policy(name: str) -> str:
    """Validate a policy name (ValueError listing the known ones)."""
    if name not in POLICIES:
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(POLICIES)}")
    return name


def normalise_composition(text: str, cfg: VertumnusConfig) -> str:
    """Parse and check a composition against the pool (degrees allowed, GPU count); canonical string."""
    counts = parse_composition(text)
    bad = sorted(c for c in counts if c not in cfg.pool.degrees)
    if bad:
        raise ValueError(f"composition {text!r} uses degree(s) {bad} not in pool.degrees {cfg.pool.degrees}")
    used = sum(c * n for c, n in counts.items())
    if used != cfg.pool.total_gpus:
        raise ValueError(f"composition {text!r} uses {used} GPUs; the pool has {cfg.pool.total_gpus}")
    # Power-of-two blocks dividing the node size always tile the nodes when the GPU count matches (buddy).
    return format_composition(counts)


def configure(
    policy: str, cfg: VertumnusConfig, composition: str | None = None
) -> tuple[VertumnusConfig, RoutingPolicy | None]:
    """The run's config (a copy) and routing policy (None = Vertumnus' placement cost)."""
    check_policy(policy)
    if policy == LOWER_BOUND:
        return cfg, None
    out = cfg.model_copy(deep=True)
    if composition is not None:
        out.pool.initial_composition = normalise_composition(composition, cfg)
    if policy == "vertumnus":
        return out, None
    if policy == "vertumnus-norepl":
        out.cache.replication = False
        return out, None
    out.controller.enabled = False
    if policy == "vertumnus-static":
        return out, None
    out.cache.replication = False
    b = out.cache.block_tokens
    router: RoutingPolicy
    if policy == "round-robin":
        router = RoundRobinPolicy()
    elif policy == "least-work":
        router = LeastWorkPolicy()
    elif policy == "length-threshold":
        router = LengthThresholdPolicy(out.controller.rules.long_threshold_tokens)
    elif policy == "sglang-cache-aware":
        router = SGLangCacheAwarePolicy(b)
    else:
        router = DynamoKVPolicy(b)
    return out, router


def all_compositions(cfg: VertumnusConfig) -> list[str]:
    """Every reachable composition of the pool's lattice, most small-degree workers first (the fixed
    compositions an evaluation runs)."""
    lat = Lattice(cfg.pool.nodes, cfg.pool.gpus_per_node, cfg.pool.degrees)
    return [format_composition(lat.as_dict(c)) for c in sorted(lat.reachable(), reverse=True)]
