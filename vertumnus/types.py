"""Typed boundary objects shared by the policy code (scheduler, controller, cache manager), the engines, the
simulator and the server. Nothing here imports torch or ray.

Identity conventions
--------------------
- ``worker_id``: int, unique for the lifetime of a pool (never reused after split / merge), assigned by the
  controller's lattice.
- ``request_id``: str, unique per pool.
- block keys: ``int`` (63-bit) chained hashes of cache blocks (see :mod:`vertumnus.cache.block_keys`); the key of
  block k already depends on blocks 0..k-1, so equal keys mean equal prefixes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum


class WorkerState(IntEnum):
    """Worker lifecycle. Only ACTIVE workers are schedulable.

    ACTIVE -> DRAINING -> PARKED -> SWITCHING -> (retired; children/parent become ACTIVE after every rank acked)
    any -> FAILED -> (ranks restarted) -> ACTIVE under a new epoch
    """

    ACTIVE = 0
    DRAINING = 1
    PARKED = 2
    SWITCHING = 3
    FAILED = 4


@dataclass(slots=True, frozen=True)
class WorkerGroup:
    """Geometry of one CP worker: aligned buddy block ``[first_rank, first_rank + degree)`` of a node."""

    worker_id: int
    node: int
    first_rank: int  # rank index inside the node
    degree: int

    @property
    def ranks(self) -> tuple[int, ...]:
        return tuple(range(self.first_rank, self.first_rank + self.degree))

    def global_ranks(self, gpus_per_node: int) -> tuple[int, ...]:
        base = self.node * gpus_per_node + self.first_rank
        return tuple(range(base, base + self.degree))


@dataclass(slots=True)
class Request:
    """A prefill request as the control plane sees it.

    ``block_keys`` are the chained keys of the *full* cache blocks of the prompt (computed once at admission);
    ``token_ids`` is present for real engines and absent in the simulator.
    """

    request_id: str
    arrival_s: float
    input_len: int
    block_keys: tuple[int, ...]
    output_len: int = 1
    slo_s: float = float("inf")
    token_ids: list[int] | None = None


@dataclass(slots=True, frozen=True)
class FetchOffer:
    """A copy the cache could run before a prefill (``cache.policy: queue_aware``), found by the lookup.

    ``blocks`` (V): the longest valid prefix of the request an available worker holds; ``block_s``: seconds a
    block takes over the slower (inter-node) link; ``max_queue_s``: the longest queue a fetching worker may have
    (the source must keep the blocks until the prefill starts); ``sources``: the available workers holding the V
    blocks validly (any order).
    """

    blocks: int
    block_s: float
    max_queue_s: float
    sources: tuple[int, ...] = ()


@dataclass(slots=True, frozen=True)
class FetchPlan:
    """The copy of the request's first ``blocks`` blocks from ``src_worker`` that the placement was priced with
    (or, when it was priced with a pending prefix, the copy that brings the blocks if no reconcile does)."""

    src_worker: int
    blocks: int


@dataclass(slots=True)
class PrefixMatch:
    """Result of walking the global trie with a request's block keys (``CacheManager.lookup``).

    ``matched_blocks``: leading blocks some worker holds validly or has pending, any degree (the cache
    statistics use only the validly held part, ``max(held_blocks.values())``).
    ``held_blocks``: worker_id -> leading blocks of the request that worker holds *validly* (not pending);
    workers absent hold nothing. ``pending_blocks``: worker_id -> leading blocks held at least pending (for
    reconciliation after split / merge); ≥ held. ``fetch``: the copy the scheduler may price, or None.
    """

    matched_blocks: int
    held_blocks: dict[int, int]
    pending_blocks: dict[int, int] = field(default_factory=dict)
    # Derived from held_blocks, worker availability and the cache config: not part of a match's equality.
    fetch: FetchOffer | None = field(default=None, compare=False)


@dataclass(slots=True)
class Placement:
    """The scheduler's decision for one request."""

    request_id: str
    worker_id: int
    degree: int
    cached_tokens: int  # P_{i,w} predicted reusable prefix
    uncached_tokens: int  # R_{i,w}
    predicted_s: float  # Ê_{i,w}
    queue_s: float  # q_w(t_i) before the reservation
    cost: float  # J_{i,w}
    preferred_degree: int  # C_pref(i)
    epoch: int
    fetch: FetchPlan | None = None  # the copy to run before the prefill (cache.policy: queue_aware)


class CacheReportKind(IntEnum):
    STORED = 0
    REMOVED = 1
    CLEARED = 2


@dataclass(slots=True)
class CacheReport:
    """A worker's physical cache change, as engines report it (sim, torch, and vLLM KV events mapped to
    manager blocks).

    STORED: ``keys`` is a chain of consecutive blocks whose first block's parent is ``parent`` (None = root).
    REMOVED: the worker no longer holds ``keys`` (it then holds no descendant of them completely either).
    CLEARED: the worker holds nothing.
    """

    worker_id: int
    kind: CacheReportKind
    keys: tuple[int, ...] = ()
    parent: int | None = None
    op_id: int | None = None  # set when the change confirms a CacheOp


class CacheOpKind(IntEnum):
    REPLICATE = 0  # copy blocks src -> dst (intra: same degree, corresponding ranks; inter: re-partition)
    RECLAIM = 1  # delete blocks from dst
    RECONCILE = 2  # after split / merge: fetch a pending prefix's missing blocks from a valid copy


@dataclass(slots=True)
class CacheOp:
    """An order from the cache manager to an engine. Completion is confirmed by a CacheReport carrying
    ``op_id`` (STORED for replicate / reconcile, REMOVED for reclaim) or by ``CacheManager.op_failed``."""

    op_id: int
    kind: CacheOpKind
    dst_worker: int  # worker that receives (replicate / reconcile) or loses (reclaim) the blocks
    keys: tuple[int, ...]  # full root -> z path of block keys
    first_missing: int  # blocks keys[first_missing:] are the ones to copy / delete
    src_worker: int | None = None  # None for reclaim, or reconcile with no valid copy (then: ordinary miss)
    inter_degree: bool = False
    inter_node: bool = False

    @property
    def num_blocks(self) -> int:
        return len(self.keys) - self.first_missing


class ReconfigKind(IntEnum):
    SPLIT = 0
    MERGE = 1


@dataclass(slots=True)
class ReconfigPlan:
    """One split (one 2C worker -> two C workers) or merge (two sibling C workers -> one 2C worker)."""

    kind: ReconfigKind
    sources: tuple[WorkerGroup, ...]
    targets: tuple[WorkerGroup, ...]
    epoch: int  # epoch the targets become schedulable in
    predicted_drain_s: float = 0.0
    reconcile_blocks: float = 0.0


@dataclass(slots=True)
class PrefillResult:
    """What an engine reports when a prefill completes."""

    request_id: str
    worker_id: int
    cached_tokens: int  # prefix tokens actually reused
    started_s: float
    finished_s: float
    ok: bool = True
    error: str | None = None
