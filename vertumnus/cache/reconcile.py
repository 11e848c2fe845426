"""Pending prefixes after a split / merge: reconciliation on first reuse (DESIGN.md §2).

A request placed at worker w whose match shows pending blocks beyond w's valid prefix (``held <
pending``) gets a RECONCILE op: copy the blocks of ``keys[held:end]`` that w does not physically have, from one
source that physically has every one of them — a valid holder of the prefix, or the split sibling that kept
the other rank half. ``end`` is the longest pending length one source can complete. Pending blocks beyond
``end`` have no valid copy: w's pending state there (and below) is cleared and they are an ordinary miss.

The op's ``keys[first_missing:]`` are the blocks not valid at w; the engine fetches those it lacks physically
(after a CP split: the other rank half's stripes) and keeps the others.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from vertumnus.cache import marks
from vertumnus.cache.bits import int_mask, mask_int
from vertumnus.cache.ops import OpBook
from vertumnus.cache.trie import ALL_ONES, Trie
from vertumnus.cache.workers import WorkerInfo, WorkerTable
from vertumnus.types import CacheOp, CacheOpKind


def clear_pending_below(trie: Trie, w: WorkerInfo, row: int) -> list[int]:
    """Drop w's pending state on ``row`` and every pending descendant (keeps holders|pending ancestor-closed).
    Returns the touched rows."""
    sub = marks.marked_subtree(trie, w, row, (trie.pending,))
    marks.drop_pending(trie, w, sub)
    return sub


def plan(
    trie: Trie,
    workers: WorkerTable,
    book: OpBook,
    w: WorkerInfo,
    keys: Sequence[int],
    path: np.ndarray,
    held: int,
    pending: int,
) -> tuple[CacheOp | None, int, bool]:
    """``(op, blocks, cleared)``: the RECONCILE op for ``keys`` at ``w`` (``path``: rows of
    ``keys[:pending]``) or None, the number of blocks it must copy, and whether some of w's pending state had
    no source and was cleared. No op either when nothing is pending or a copy of this prefix into w is
    already in flight (the request then simply reuses w's valid prefix)."""
    if pending <= held:
        return None, 0, False
    seg = path[held:pending]
    if book.incoming_at(int(trie.key[seg[-1]]), w.worker_id):
        return None, 0, False
    missing = (trie.present[seg, w.word] & w.bit) == 0
    if not missing.any():  # physically complete but not yet marked valid: nothing to copy
        marks.make_valid(trie, w, seg)
        marks.promote_below(trie, w, seg.tolist())
        return None, 0, False
    avail = int_mask(workers.available_bits & ~(1 << w.slot), trie.words)
    can = (trie.holders[seg] | trie.present[seg]) & avail[None, :]
    can[~missing] = ALL_ONES  # rows w already has constrain nothing
    cum = np.bitwise_and.accumulate(can, axis=0)
    n_ok = int(np.count_nonzero(cum.any(axis=1)))  # non-increasing: a leading run
    end = held + n_ok
    if end < pending:
        trie.try_free(clear_pending_below(trie, w, int(path[end])))
    if n_ok == 0 or not missing[:n_ok].any():
        if n_ok:
            marks.make_valid(trie, w, seg[:n_ok])
            marks.promote_below(trie, w, seg[:n_ok].tolist())
        return None, 0, end < pending
    srcs = workers.in_mask(mask_int(cum[n_ok - 1]))
    last = int(seg[n_ok - 1])
    src = min(
        srcs,
        key=lambda s: (
            not (trie.holders[last, s.word] & s.bit),  # a valid copy of the whole prefix first
            s.node != w.node,
            s.degree != w.degree,
            s.worker_id,
        ),
    )
    op = CacheOp(
        op_id=book.new_id(),
        kind=CacheOpKind.RECONCILE,
        dst_worker=w.worker_id,
        keys=tuple(keys[:end]),
        first_missing=held,
        src_worker=src.worker_id,
        inter_degree=src.degree != w.degree,
        inter_node=src.node != w.node,
    )
    book.add(op, w)
    return op, int(np.count_nonzero(missing[:n_ok])), end < pending
