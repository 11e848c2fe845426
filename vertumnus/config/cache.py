"""Prefix cache: trie blocks, replication and reclamation (docs/design.md §3)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from vertumnus.config._base import Section


class CacheConfig(Section):
    block_tokens: int = Field(512, ge=1, description="Tokens per trie node (cache block).")
    replication: bool = Field(True, description="Enable replication and reclamation by the cache manager.")
    policy: Literal["rules", "queue_aware"] = Field(
        "queue_aware",
        description="rules: the paper's access-threshold scan; queue_aware (the default: it wins the cache "
        "ablation's test set, docs/results.md): copy a hot prefix off a queued holder at placement, reclaim only "
        "under pressure (vertumnus/cache/hot_copy.py). Left unset with pool.engine: vllm and "
        "vllm.replication: recompute, it resolves to rules.",
    )
    scan_interval_s: float = Field(5.0, gt=0, description="Seconds between cache-manager scans.")
    theta_inter: float = Field(0.5, ge=0, description="missed[z,C] (seconds of benefit) above this → inter copy.")
    theta_intra: float = Field(8.0, ge=0, description="access[z,C]/r above this → one more same-degree replica.")
    theta_reclaim: float = Field(0.5, ge=0, description="access[z,C]/r below this → reclaim (< theta_intra).")
    decay: float = Field(0.5, gt=0, lt=1, description="Multiplier applied to access/missed after each scan.")
    epsilon: float = Field(1e-3, gt=0, description="Statistics below this are dropped.")
    max_ops_per_scan: int = Field(4, ge=0, description="Upper bound on each candidate list per scan.")
    bytes_per_block: int = Field(
        512 * 48 * 2 * 4 * 128 * 2, ge=1, description="KV bytes of one cache block (all layers, K and V)."
    )
    intra_node_gbps: float = Field(400.0, gt=0, description="Intra-node copy bandwidth, GB/s.")
    inter_node_gbps: float = Field(50.0, gt=0, description="Inter-node copy bandwidth, GB/s.")
    # shorter prefixes cost more to move than they save: docs/tuning.md#hot_min_blocks
    hot_min_blocks: int = Field(6, ge=1, description="queue_aware: shortest prefix (blocks) worth a fetch or a copy.")
    hot_min_access: float = Field(2.0, ge=0, description="queue_aware: decayed access count that makes it hot.")
    copy_gain_s: float = Field(
        0.05, ge=0, description="queue_aware: seconds the next request must gain (q_holder − q_dst − copy time)."
    )
    fetch_max_queue_s: float = Field(
        1.0,
        ge=0,
        description="queue_aware: a worker may be priced with a prefix copied in before its prefill only while its "
        "queue is at most this long (the source must keep the blocks until then).",
    )
    # after a split the children's prefixes stay reusable instead of missing: docs/tuning.md#price_pending
    price_pending: bool = Field(
        True,
        description="Placement prices a worker's pending prefix (after a split or merge: blocks it is assigned but "
        "has not all of, the rest on its sibling's ranks) as reusable, plus the copy of the blocks it lacks over "
        "the intra-node link; False: a pending prefix counts as a miss until a request lands there by chance.",
    )
    reclaim_pressure: float = Field(
        0.9,
        ge=0,
        le=1,
        description="queue_aware: reclaim a cold surplus copy only on a worker this full whose incoming copies "
        "do not fit its free blocks.",
    )

    # keeps hot prefixes resident under KV pressure: docs/tuning.md#retain_reused
    retain_reused: int = Field(
        1,
        ge=0,
        description="queue_aware: a block reused by this many prefills is retained — engines evict the least "
        "recently used block that is not, while retained blocks fill at most retain_fraction of a worker's KV "
        "capacity (docs/design.md *Retention*); 0: plain LRU. Off with replication false or the rules policy.",
    )
    retain_fraction: float = Field(
        0.7, gt=0, le=1, description="queue_aware: the share of a worker's KV capacity retained blocks may fill."
    )

    def retention(self) -> tuple[int, float] | None:
        """(retain_reused, retain_fraction) for the engines' eviction, or None for plain LRU: retention is the
        queue_aware cache manager's, off with replication false (norepl) and under the paper's rules."""
        if not self.replication or self.policy != "queue_aware" or self.retain_reused == 0:
            return None
        return (self.retain_reused, self.retain_fraction)

    @model_validator(mode="after")
    def _thresholds(self) -> CacheConfig:
        if self.theta_reclaim >= self.theta_intra:
            raise ValueError(f"theta_reclaim ({self.theta_reclaim}) must be below theta_intra ({self.theta_intra})")
        return self
