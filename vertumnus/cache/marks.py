"""Mask mutations of one worker over a set of trie rows.

Every change of ``holders`` / ``pending`` / ``present`` goes through these functions, which keep the trie's
replica counts (``rc``) and the worker's counters (``n_valid`` / ``n_pending`` / ``n_present``) exact. Callers
keep the ancestor-closure invariants of :mod:`.trie` (e.g. they only make a row valid when its parent is).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from vertumnus.cache.trie import ROOT, Trie
from vertumnus.cache.workers import WorkerInfo

_EMPTY = np.zeros(0, np.int64)


def _rows(rows: Iterable[int] | np.ndarray) -> np.ndarray:
    if isinstance(rows, np.ndarray):
        return rows.astype(np.int64, copy=False)
    return np.fromiter(rows, np.int64)


def _with_bit(mask: np.ndarray, rows: np.ndarray, w: WorkerInfo) -> np.ndarray:
    return rows[(mask[rows, w.word] & w.bit) != 0]


def make_valid(trie: Trie, w: WorkerInfo, rows: Iterable[int] | np.ndarray) -> np.ndarray:
    """``w`` holds the complete prefixes ending at ``rows``; returns the rows that were not valid before."""
    r = _rows(rows)
    if r.size == 0:
        return _EMPTY
    new = r[(trie.holders[r, w.word] & w.bit) == 0]
    if new.size == 0:
        return _EMPTY
    trie.holders[new, w.word] |= w.bit
    trie.rc[new, w.dix] += 1
    w.n_valid += int(new.size)
    clear = ~w.bit
    pend = _with_bit(trie.pending, new, w)
    if pend.size:
        trie.pending[pend, w.word] &= clear
        w.n_pending -= int(pend.size)
        trie.pending_marks -= int(pend.size)
    pres = _with_bit(trie.present, new, w)
    if pres.size:
        trie.present[pres, w.word] &= clear
        w.n_present -= int(pres.size)
    return new


def make_pending(trie: Trie, w: WorkerInfo, rows: Iterable[int] | np.ndarray) -> None:
    """``w`` is assigned ``rows`` but must reconcile them before reuse (rows it holds validly are skipped)."""
    r = _rows(rows)
    if r.size == 0:
        return
    r = r[((trie.holders[r, w.word] | trie.pending[r, w.word]) & w.bit) == 0]
    trie.pending[r, w.word] |= w.bit
    w.n_pending += int(r.size)
    trie.pending_marks += int(r.size)


def make_present(trie: Trie, w: WorkerInfo, rows: Iterable[int] | np.ndarray) -> None:
    """``w`` physically has the blocks ``rows`` (not as valid prefixes; valid rows are skipped)."""
    r = _rows(rows)
    if r.size == 0:
        return
    r = r[((trie.holders[r, w.word] | trie.present[r, w.word]) & w.bit) == 0]
    trie.present[r, w.word] |= w.bit
    w.n_present += int(r.size)


def drop(trie: Trie, w: WorkerInfo, rows: Iterable[int] | np.ndarray) -> None:
    """Clear every mark of ``w`` on ``rows``."""
    r = _rows(rows)
    if r.size == 0:
        return
    clear = ~w.bit
    held = _with_bit(trie.holders, r, w)
    if held.size:
        trie.holders[held, w.word] &= clear
        trie.rc[held, w.dix] -= 1
        w.n_valid -= int(held.size)
    pend = _with_bit(trie.pending, r, w)
    if pend.size:
        trie.pending[pend, w.word] &= clear
        w.n_pending -= int(pend.size)
        trie.pending_marks -= int(pend.size)
    pres = _with_bit(trie.present, r, w)
    if pres.size:
        trie.present[pres, w.word] &= clear
        w.n_present -= int(pres.size)


def drop_pending(trie: Trie, w: WorkerInfo, rows: Iterable[int] | np.ndarray) -> None:
    """Clear only the pending mark of ``w`` on ``rows`` (physical presence stays)."""
    r = _rows(rows)
    if r.size == 0:
        return
    pend = _with_bit(trie.pending, r, w)
    if pend.size:
        trie.pending[pend, w.word] &= ~w.bit
        w.n_pending -= int(pend.size)
        trie.pending_marks -= int(pend.size)


def marked_subtree(trie: Trie, w: WorkerInfo, row: int, masks: tuple[np.ndarray, ...]) -> list[int]:
    """``row`` plus every descendant reachable through rows where ``w`` has a bit in one of ``masks``."""
    out = [row]
    stack = [row]
    word, bit = w.word, w.bit
    while stack:
        for c in trie.children(stack.pop()):
            if any(m[c, word] & bit for m in masks):
                out.append(c)
                stack.append(c)
    return out


def promote_below(trie: Trie, w: WorkerInfo, rows: Iterable[int]) -> None:
    """After ``w`` became valid on ``rows``: children it physically has become valid too, recursively."""
    if w.n_present == 0:
        return
    stack = list(rows)
    word, bit = w.word, w.bit
    while stack:
        found = [c for c in trie.children(stack.pop()) if trie.present[c, word] & bit]
        if found:
            make_valid(trie, w, found)
            stack.extend(found)


def nodes_of(trie: Trie, w: WorkerInfo) -> np.ndarray:
    """Every row where ``w`` has any mark (a full-column scan; for rare whole-worker operations)."""
    n = trie.size
    col = trie.holders[:n, w.word] | trie.pending[:n, w.word] | trie.present[:n, w.word]
    rows = np.flatnonzero(col & w.bit)
    return rows[rows != ROOT]


def closed_subset(trie: Trie, rows: np.ndarray) -> np.ndarray:
    """The rows of ``rows`` whose whole root path lies in ``rows`` (maximal ancestor-closed subset)."""
    if rows.size == 0:
        return _EMPTY
    inside = np.zeros(trie.size, bool)
    inside[rows] = True
    ok = np.zeros(trie.size, bool)
    ok[ROOT] = True
    depth = trie.depth[rows]
    order = np.argsort(depth, kind="stable")
    srt, dep = rows[order], depth[order]
    bounds = np.flatnonzero(np.diff(dep)) + 1
    for level in np.split(srt, bounds):  # parents are one level up: resolved before their children
        ok[level] = ok[trie.parent[level]]
    return rows[ok[rows] & inside[rows]]
