"""Turning scan candidates into cache ops: destination, source and victim choice (DESIGN.md §3).

- Destination: an available degree-C worker without z, preferring (in this order) a longer retained ancestor
  path of z, enough free capacity for the missing blocks, a lower outstanding workload q_w, a lower id.
- Source: intra — the least-loaded available degree-C holder (same node as the destination on ties);
  inter — any available valid holder, same node as the destination first, then least loaded.
- Reclaim victim: an available degree-C holder of z with the highest cache pressure (lower id on ties) that
  keeps no child of z (valid or pending), does not use z for a queued / running request (pins), is not
  reading or deleting z for another op, and is not the last valid copy of z in the pool (cold single copies
  are the engines' LRU's business; reclamation removes surplus replicas).
Copies carry only the blocks the destination misses: ``first_missing`` = its retained ancestor length.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from vertumnus.cache.bits import leading_runs, mask_int, row_bits
from vertumnus.cache.ops import OpBook
from vertumnus.cache.scan import Candidate
from vertumnus.cache.trie import NONE, Trie
from vertumnus.cache.workers import WorkerInfo, WorkerTable
from vertumnus.types import CacheOp, CacheOpKind


def replication(
    trie: Trie,
    workers: WorkerTable,
    book: OpBook,
    cand: Candidate,
    queue_s: Mapping[int, float],
    inter: bool,
) -> CacheOp | None:
    """The REPLICATE op for a candidate, or None when no destination or source qualifies (or a copy of z to
    degree C is already in flight)."""
    row = cand.row
    key = int(trie.key[row])
    if book.adding_at(key, cand.dix):
        return None
    depth = int(trie.depth[row])
    path = trie.path_to(row)
    runs = leading_runs(trie.holders[path])
    held = {w.worker_id: runs.get(w.slot, 0) for w in workers.by_id.values()}
    dsts = [w for w in workers.by_id.values() if w.dix == cand.dix and w.available and held[w.worker_id] < depth]
    if not dsts:
        return None

    def dst_key(w: WorkerInfo) -> tuple[int, int, float, int]:
        have = held[w.worker_id]
        fits = w.free - w.reserved >= depth - have
        return (-have, 0 if fits else 1, queue_s.get(w.worker_id, 0.0), w.worker_id)

    dst = min(dsts, key=dst_key)
    holders = [w for w in workers.in_mask(mask_int(trie.holders[row])) if w.available and w is not dst]
    if not inter:
        holders = [w for w in holders if w.dix == cand.dix]
    if not holders:
        return None
    if inter:
        src = min(holders, key=lambda w: (w.node != dst.node, queue_s.get(w.worker_id, 0.0), w.worker_id))
    else:
        src = min(holders, key=lambda w: (queue_s.get(w.worker_id, 0.0), w.node != dst.node, w.worker_id))
    op = CacheOp(
        op_id=book.new_id(),
        kind=CacheOpKind.REPLICATE,
        dst_worker=dst.worker_id,
        keys=trie.keys_of(path),
        first_missing=held[dst.worker_id],
        src_worker=src.worker_id,
        inter_degree=src.degree != dst.degree,
        inter_node=src.node != dst.node,
    )
    book.add(op, dst)
    return op


def child_marks(trie: Trie, rows: Sequence[int]) -> dict[int, int]:
    """Per row, the OR of ``holders | pending`` over its children as an int — all rows' sibling lists walked
    together, one vector step per sibling rank. Empty unless masks are one word (then :func:`reclamation`
    walks the children itself)."""
    if trie.words != 1 or not rows:
        return {}
    z = np.asarray(rows, np.int64)
    out = np.zeros(z.size, np.uint64)
    c = trie.first_child[z].astype(np.int64)
    todo = np.flatnonzero(c != NONE)
    hold, pend, nxt = trie.hold_col[0], trie.pend_col[0], trie.next_sib
    while todo.size:
        kid = c[todo]
        out[todo] |= hold[kid] | pend[kid]
        c[todo] = nxt[kid]
        todo = todo[c[todo] != NONE]
    return dict(zip(z.tolist(), out.tolist(), strict=True))


def reclamation(
    trie: Trie,
    workers: WorkerTable,
    book: OpBook,
    cand: Candidate,
    kids: int | None = None,
    min_pressure: float | None = None,
) -> CacheOp | None:
    """The RECLAIM op for a candidate (deleting block z only: the victim keeps no descendant of it), or None
    when no holder qualifies. ``kids``: :func:`child_marks` of z, if computed. ``min_pressure`` (queue_aware):
    the victim must be at least this full *and* expecting copies that do not fit its free blocks — the space goes
    to the copy instead of to an LRU eviction of something hotter."""
    row = cand.row
    held = row_bits(trie.holders, row)
    key = int(trie.key[row])
    if held.bit_count() - book.removing_count(key) < 2:
        return None
    ok = held & workers.degree_bits[cand.dix] & workers.available_bits
    if not ok:
        return None
    # Removing z would break a descendant prefix a holder keeps: drop holders with a child of z.
    if kids is not None:
        ok &= ~kids
    else:
        nxt, holders, pending = trie.next_sib, trie.holders, trie.pending
        c = int(trie.first_child[row])
        while c != NONE and ok:
            ok &= ~(row_bits(holders, c) | row_bits(pending, c))
            c = int(nxt[c])
    if not ok:
        return None
    depth = int(trie.depth[row])
    for w in sorted(workers.in_mask(ok), key=lambda w: (-w.pressure, w.worker_id)):
        if min_pressure is not None:
            if w.pressure < min_pressure:
                break  # sorted by pressure: no later holder qualifies
            if w.reserved <= w.free:
                continue  # nothing incoming needs the room
        if book.busy(key, w.worker_id) or w.pinned(key, depth):
            continue
        op = CacheOp(
            op_id=book.new_id(),
            kind=CacheOpKind.RECLAIM,
            dst_worker=w.worker_id,
            keys=trie.keys_of(trie.path_to(row)),
            first_missing=depth - 1,
        )
        book.add(op, w)
        return op
    return None
