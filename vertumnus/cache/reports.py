"""Mirroring workers' physical cache reports into the trie (DESIGN.md §3).

- STORED ``keys`` under ``parent``: nodes are created as needed. If the worker holds the parent prefix validly
  (or the chain starts at the root) it becomes a holder of the whole chain, and blocks it had physically below
  the chain become valid too; otherwise the blocks are only *present* (physical, not reusable) until the
  parent prefix becomes valid.
- REMOVED ``keys``: the worker loses each block and everything it had below it (a prefix without its parent
  block is no longer complete).
- CLEARED: the worker loses everything.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from vertumnus.cache import marks
from vertumnus.cache.trie import ROOT, Trie
from vertumnus.cache.workers import WorkerInfo


def ensure_chain(trie: Trie, parent: int, keys: Sequence[int]) -> np.ndarray:
    """Rows of ``keys`` as a chain under ``parent``, creating the missing suffix. Returns fewer rows than
    keys only for an inconsistent chain (a key that exists elsewhere in the trie)."""
    known = trie.lookup(keys)
    if known.size == len(keys):
        return known
    fresh = trie.extend(int(known[-1]) if known.size else parent, keys[known.size :])
    return np.concatenate((known, fresh)) if known.size else fresh


def stored(trie: Trie, w: WorkerInfo, keys: Sequence[int], parent_key: int | None) -> bool:
    """Apply a STORED report; False if the parent block is unknown to the trie (report ignored)."""
    if not keys:
        return True
    if parent_key is None:
        parent = ROOT
    else:
        got = trie.index.get(parent_key)
        if got is None:
            return False
        parent = got
    # Blocks the trie knows get the checked mark updates; the suffix created here carries no marks yet, so
    # it takes the unchecked ones (most of an engine's report: the blocks it has just computed).
    known = trie.lookup(keys)
    k = known.size
    fresh = trie.extend(int(known[-1]) if k else parent, keys[k:]) if k < len(keys) else None
    valid = parent == ROOT or bool(trie.hold_col[w.word][parent] & w.bit)
    if k:
        if valid:
            marks.make_valid(trie, w, known)
            marks.promote_below(trie, w, known.tolist())  # fresh rows have no children: nothing to promote
        else:
            marks.make_present(trie, w, known)
    if fresh is not None:
        marks.mark_fresh(trie, w, fresh, valid)
    return True


def make_path_valid(trie: Trie, w: WorkerInfo, keys: Sequence[int]) -> None:
    """``w`` holds the complete prefix ``keys`` (root→z) — a confirmed replication or reconciliation."""
    rows = ensure_chain(trie, ROOT, keys)
    marks.make_valid(trie, w, rows)
    marks.promote_below(trie, w, rows.tolist())


def removed(trie: Trie, w: WorkerInfo, keys: Sequence[int]) -> None:
    """Apply a REMOVED report: each block and every marked descendant of it leave ``w``."""
    masks = (trie.holders, trie.pending, trie.present)
    touched: list[int] = []
    get = trie.index.get
    for k in keys:
        row = get(k)
        if row is None or not any(m[row, w.word] & w.bit for m in masks):
            continue
        sub = marks.marked_subtree(trie, w, row, masks)
        marks.drop(trie, w, sub)
        touched.extend(sub)
    trie.try_free(touched)


def cleared(trie: Trie, w: WorkerInfo) -> None:
    """Apply a CLEARED report (or remove a worker): every mark of ``w`` goes."""
    rows = marks.nodes_of(trie, w)
    marks.drop(trie, w, rows)
    trie.try_free(rows.tolist())
