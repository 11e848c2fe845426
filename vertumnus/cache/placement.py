"""The cache side of one placement: what a lookup offers to fetch, and what a commit returns to the pool.

One request path (:class:`~vertumnus.pool.PrefillPool`)::

    match = cache.lookup(keys)                        held / pending prefixes + FetchOffer (queue_aware)
    placement = scheduler.place(request, match, now)  worker, price, Placement.fetch: FetchPlan | None
    commit = cache.commit(request, match, placement)  statistics, the copy to attach (reconcile or fetch), pin
    data_plane.submit(worker, job(commit.op, commit.reuse_blocks))
    cache.replicate_hot(keys, match, placement, loads, now)   queue_aware push, after the job (never ahead of it)

The scheduler never calls the cache and the cache reads the scheduler only through :class:`WorkerLoads`, a
read-only view the pool passes to the hot copy (the one step that needs every worker's queue, computed only
once the cheap conditions hold).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from vertumnus.cache.ops import OpBook
from vertumnus.cache.trie import Trie
from vertumnus.cache.workers import WorkerTable
from vertumnus.config import CacheConfig
from vertumnus.types import CacheOp, CacheOpKind, FetchOffer, FetchPlan


@dataclass(slots=True, frozen=True)
class Pin:
    """``keys[:blocks]`` in use at ``worker_id`` by one queued / running request: never reclaimed there until
    :meth:`~vertumnus.cache.manager.CacheManager.release`."""

    worker_id: int
    keys: tuple[int, ...]
    blocks: int


@dataclass(slots=True, frozen=True)
class CacheCommit:
    """What :meth:`~vertumnus.cache.manager.CacheManager.commit` decided for one placement.

    ``op``: the copy attached to the job (a reconcile of a pending prefix, or the placement's fetch), run before
    the prefill; ``reuse_blocks``: the leading blocks the engine may reuse (valid prefix, the attached copy's, or
    blocks an earlier request's copy brings); ``pin``: the pin taken on them (None: nothing reused)."""

    op: CacheOp | None
    reuse_blocks: int
    pin: Pin | None


class WorkerLoads(Protocol):
    """The scheduler's load, read by the hot copy (the :class:`~vertumnus.scheduler.scheduler.Scheduler`)."""

    def queue_map(self, now: float) -> dict[int, float]:
        """q_w(now) per worker id."""
        ...

    def waiting_at(self, worker_id: int) -> int:
        """Prefills placed at the worker and not started yet."""
        ...


def fetch_offer(cfg: CacheConfig, workers: WorkerTable, held: Mapping[int, int]) -> FetchOffer | None:
    """``cache.policy: queue_aware``: the longest valid prefix an available worker holds (V), the seconds a block
    takes over the slower (inter-node) link, ``cache.fetch_max_queue_s`` and the available holders of V blocks.
    None when the policy is off or less than ``hot_min_blocks`` is held."""
    if not cfg.replication or cfg.policy != "queue_aware" or not held:
        return None
    by_id = workers.by_id
    v = 0
    sources: list[int] = []
    for wid, h in held.items():
        w = by_id.get(wid)
        if w is None or not w.available or h < v:
            continue
        if h > v:
            v, sources = h, [wid]
        else:
            sources.append(wid)
    if v < cfg.hot_min_blocks:
        return None
    block_s = cfg.bytes_per_block / (min(cfg.intra_node_gbps, cfg.inter_node_gbps) * 1e9)
    return FetchOffer(v, block_s, cfg.fetch_max_queue_s, tuple(sources))


def fetch_op(
    trie: Trie, workers: WorkerTable, book: OpBook, path: np.ndarray, worker_id: int, have: int, plan: FetchPlan
) -> CacheOp | None:
    """The REPLICATE op of ``plan`` into ``worker_id`` (attached to the job like a reconcile; confirmed by STORED
    with its op id); ``path``: the trie rows of the first ``plan.blocks`` blocks. None when the destination or
    the source is gone or unavailable, or the destination already holds the blocks."""
    w = workers.by_id.get(worker_id)
    src = workers.by_id.get(plan.src_worker)
    if w is None or src is None or not src.available or have >= plan.blocks:
        return None
    op = CacheOp(
        op_id=book.new_id(),
        kind=CacheOpKind.REPLICATE,
        dst_worker=worker_id,
        keys=trie.keys_of(path),
        first_missing=have,
        src_worker=src.worker_id,
        inter_degree=src.degree != w.degree,
        inter_node=src.node != w.node,
    )
    book.add(op, w)
    return op


def as_tuple(keys: Sequence[int]) -> tuple[int, ...]:
    """``keys`` as a tuple (request keys already are one: no copy)."""
    return keys if type(keys) is tuple else tuple(keys)
