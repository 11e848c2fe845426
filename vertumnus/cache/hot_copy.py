"""Queue-aware replication (``cache.policy: queue_aware``): copy a hot prefix off a queued holder, at placement.

The paper's threshold rules replicate on decayed access counts at a periodic scan. Out of sample that is close to
neutral: a copy helps only a request that would otherwise *wait* behind a holder or recompute the prefix
elsewhere, and the rules neither see queues nor know when a copy lands. This rule runs right after a placement,
when the pool knows exactly what the next request with the same prefix would face:

    request i reuses h blocks at holder w, which has q_w seconds of work queued before i
    d = the least-loaded available same-degree worker without the h blocks, and with no prefill waiting
    copy_s = (h − held_d) · bytes_per_block ÷ link bandwidth (intra- or inter-node)

    copy the h blocks w → d  iff
      (1) h ≥ hot_min_blocks and access[z_h, C] ≥ hot_min_access   (shared and recently reused, not a one-off)
      (2) q_w − q_d − copy_s ≥ copy_gain_s                           (the next such request gains from d)
      (3) rate(z_h) · (q_w + Ê_i − copy_s) ≥ 1                       (one arrives before w's queue drains:
                                                                    a copy landing after that is not made)
      (4) no copy of z_h to degree C is in flight, d has room once its LRU makes it (a copy never waits)

rate(z) is the decayed access count turned into a rate: a scan every s seconds multiplies counts by δ, so a steady
rate r keeps about r·s/(1 − δ) in the count. Condition (2) makes a copy only to a destination whose queue is
short, and the destination must have no prefill waiting, so a copy never competes with a waiting prefill there
(copies use the copy engines / link, not the SMs).

Reclamation under this policy only makes room for copies: a cold surplus copy (the scan's reclaim list) is removed
on a worker whose pressure is ≥ ``reclaim_pressure`` and whose incoming copies do not fit its free blocks, so the
copy takes the space of a cold duplicate instead of an LRU eviction of something hotter. Reclaiming anywhere else
only throws reuse away early — engines evict by LRU when they need room (measured on the tuning set: reclaiming
on every full worker moved P90 by up to ±10% where the pool was overloaded and never helped at loads it served).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np

from vertumnus.cache.ops import OpBook
from vertumnus.cache.trie import Trie
from vertumnus.cache.workers import WorkerInfo, WorkerTable
from vertumnus.config import CacheConfig
from vertumnus.types import CacheOp, CacheOpKind

if TYPE_CHECKING:
    from vertumnus.cache.placement import WorkerLoads


def copy_seconds(cfg: CacheConfig, blocks: int, src: WorkerInfo, dst: WorkerInfo) -> float:
    """Link time of ``blocks`` cache blocks from ``src`` to ``dst``."""
    gbps = cfg.intra_node_gbps if src.node == dst.node else cfg.inter_node_gbps
    return blocks * cfg.bytes_per_block / (gbps * 1e9)


def access_rate(cfg: CacheConfig, count: float) -> float:
    """Requests/s that keep a decayed access count at ``count`` (module docstring)."""
    return count * (1.0 - cfg.decay) / cfg.scan_interval_s


def plan(
    cfg: CacheConfig,
    trie: Trie,
    workers: WorkerTable,
    book: OpBook,
    path: np.ndarray,
    held: Mapping[int, int],
    chosen: int,
    queue_before_s: float,
    predicted_s: float,
    loads: WorkerLoads,
    now: float,
) -> CacheOp | None:
    """The REPLICATE op for the prefix a request just reused at worker ``chosen`` (None: no copy pays).

    ``path``: trie rows of the request's matched blocks; ``held``: valid leading blocks per worker;
    ``queue_before_s`` / ``predicted_s``: q_w before the request and its Ê; ``loads``: the scheduler's q per worker
    id at ``now`` (read only once the cheap conditions hold) and the prefills queued and not started per worker."""
    w = workers.by_id.get(chosen)
    h = min(held.get(chosen, 0), int(path.size))
    if w is None:
        return None
    # The hot part of the reused prefix: its leading blocks reused often enough (a session's own later turns
    # below a shared system prompt are reused once, by the next turn; copying them pays nothing).
    acc = trie.access[w.dix, path[:h]]
    cold = np.flatnonzero(acc < cfg.hot_min_access)
    h = int(cold[0]) if cold.size else h
    if h < cfg.hot_min_blocks:
        return None
    row = int(path[h - 1])
    count = float(acc[h - 1])
    key = int(trie.key[row])
    if book.adding_at(key, w.dix):
        return None
    q = loads.queue_map(now)
    q_w = queue_before_s
    best: tuple[float, bool, int] | None = None
    dst: WorkerInfo | None = None
    for d in workers.by_id.values():
        if d is w or d.dix != w.dix or not d.available or held.get(d.worker_id, 0) >= h:
            continue
        if loads.waiting_at(d.worker_id) > 0 or d.capacity < h:
            continue
        rank = (q.get(d.worker_id, 0.0), d.node != w.node, d.worker_id)
        if best is None or rank < best:
            best, dst = rank, d
    if dst is None or best is None:
        return None
    have = held.get(dst.worker_id, 0)
    copy_s = copy_seconds(cfg, h - have, w, dst)
    if q_w - best[0] - copy_s < cfg.copy_gain_s:
        return None
    if access_rate(cfg, count) * (q_w + predicted_s - copy_s) < 1.0:
        return None
    op = CacheOp(
        op_id=book.new_id(),
        kind=CacheOpKind.REPLICATE,
        dst_worker=dst.worker_id,
        keys=trie.keys_of(path[:h]),
        first_missing=have,
        src_worker=w.worker_id,
        inter_degree=False,
        inter_node=w.node != dst.node,
    )
    book.add(op, dst)
    return op
