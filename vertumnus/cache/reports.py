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


def ensure_chain(trie: Trie, parent: int, keys: Sequence[int]) -> list[int]:
    """Rows of ``keys`` as a chain under ``parent``, creating the missing suffix. Returns fewer rows than
    keys only for an inconsistent chain (a key that exists elsewhere in the trie)."""
    rows = trie.lookup(keys)
    if len(rows) < len(keys):
        rows.extend(trie.extend(rows[-1] if rows else parent, keys[len(rows) :]))
    return rows


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
    rows = np.asarray(ensure_chain(trie, parent, keys), np.int64)
    if parent == ROOT or trie.holders[parent, w.word] & w.bit:
        marks.make_valid(trie, w, rows)
        marks.promote_below(trie, w, rows.tolist())
    else:
        marks.make_present(trie, w, rows)
    return True


def make_path_valid(trie: Trie, w: WorkerInfo, keys: Sequence[int]) -> None:
    """``w`` holds the complete prefix ``keys`` (root→z) — a confirmed replication or reconciliation."""
    rows = ensure_chain(trie, ROOT, keys)
    marks.make_valid(trie, w, rows)
    marks.promote_below(trie, w, rows)


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
