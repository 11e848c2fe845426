"""Mask mutations of one worker over a set of trie rows.

Every change of ``holders`` / ``pending`` / ``present`` goes through these functions, which keep the trie's
replica counts (``rc``) and the worker's counters (``n_valid`` / ``n_pending`` / ``n_present``) exact. Callers
keep the ancestor-closure invariants of :mod:`.trie` (e.g. they only make a row valid when its parent is).

They also flag rows that may have become reclaimable without any statistics (DESIGN.md §3: access 0 <
r·θ_reclaim), so the scan, which looks at active rows only, sees them: a row that gains a holder while another
worker holds it too, and a row whose holder lost every marked block below it (it may now be that holder's last
block, the only kind reclamation deletes).
"""

from __future__ import annotations

from collections.abc import Iterable, Sized

import numpy as np

from vertumnus.cache.bits import distinct
from vertumnus.cache.trie import NONE, ROOT, Trie
from vertumnus.cache.workers import WorkerInfo

_EMPTY = np.zeros(0, np.int64)


def _rows(rows: Iterable[int] | np.ndarray) -> np.ndarray:
    if isinstance(rows, np.ndarray):
        return rows.astype(np.int64, copy=False)
    return np.fromiter(rows, np.int64)


def _with_bit(cols: list[np.ndarray], rows: np.ndarray, w: WorkerInfo) -> np.ndarray:
    return rows[(cols[w.word][rows] & w.bit) != 0]


def make_valid(trie: Trie, w: WorkerInfo, rows: Iterable[int] | np.ndarray) -> np.ndarray:
    """``w`` holds the complete prefixes ending at ``rows``; returns the rows that were not valid before."""
    r = _rows(rows)
    if r.size == 0:
        return _EMPTY
    held = trie.hold_col[w.word]
    new = r[(held[r] & w.bit) == 0]
    if new.size == 0:
        return _EMPTY
    held[new] |= w.bit
    trie.rc_col[w.dix][new] += 1
    w.n_valid += int(new.size)
    _clear_pending(trie, w, new)
    _clear_present(trie, w, new)
    flag_replicated(trie, new)
    return new


def flag_replicated(trie: Trie, rows: np.ndarray) -> None:
    """``rows`` (distinct) gained a holder, or a holder of theirs lost its blocks below them: they are no longer
    known to be stuck, and those with two or more valid copies over all degrees become active — surplus
    replicas are reclamation candidates even if no request ever touched them (no statistics)."""
    if rows.size:
        trie.active.stuck[rows] = False
        rc = trie.rc_col
        copies = rc[0][rows] if len(rc) == 1 else trie.rc[:, rows].sum(axis=0)
        multi = rows[copies >= 2]
        if multi.size:
            trie.active.add(multi)


def _flag_parents(trie: Trie, w: WorkerInfo, rows: np.ndarray) -> None:
    """``w`` lost its marks on ``rows``: a parent it still holds may now be its last block on that path."""
    par = trie.parent[rows]
    par = par[par != ROOT]
    if par.size:
        par = par[(trie.hold_col[w.word][par] & w.bit) != 0]
        if par.size:
            flag_replicated(trie, distinct(par.astype(np.int64)))


# n_pending / n_present count w's bits exactly: when zero there is nothing to look for.
def _clear_pending(trie: Trie, w: WorkerInfo, rows: np.ndarray) -> None:
    if w.n_pending:
        pend = _with_bit(trie.pend_col, rows, w)
        if pend.size:
            trie.pend_col[w.word][pend] &= ~w.bit
            w.n_pending -= int(pend.size)
            trie.pending_marks -= int(pend.size)


def _clear_present(trie: Trie, w: WorkerInfo, rows: np.ndarray) -> None:
    if w.n_present:
        pres = _with_bit(trie.pres_col, rows, w)
        if pres.size:
            trie.pres_col[w.word][pres] &= ~w.bit
            w.n_present -= int(pres.size)


def mark_fresh(trie: Trie, w: WorkerInfo, rows: np.ndarray, valid: bool) -> None:
    """``w`` holds (``valid``) or physically has ``rows``: nodes :meth:`Trie.extend` just created, which carry
    no mark of any worker yet — so the bit is set without reading it, and rc goes from 0 to 1."""
    if rows.size == 0:
        return
    if valid:
        trie.hold_col[w.word][rows] = w.bit
        trie.rc_col[w.dix][rows] = 1
        w.n_valid += int(rows.size)
    else:
        trie.pres_col[w.word][rows] = w.bit
        w.n_present += int(rows.size)


def make_pending(trie: Trie, w: WorkerInfo, rows: Iterable[int] | np.ndarray) -> None:
    """``w`` is assigned ``rows`` but must reconcile them before reuse (rows it holds validly are skipped)."""
    r = _rows(rows)
    if r.size == 0:
        return
    r = r[((trie.hold_col[w.word][r] | trie.pend_col[w.word][r]) & w.bit) == 0]
    trie.pend_col[w.word][r] |= w.bit
    w.n_pending += int(r.size)
    trie.pending_marks += int(r.size)


def make_present(trie: Trie, w: WorkerInfo, rows: Iterable[int] | np.ndarray) -> None:
    """``w`` physically has the blocks ``rows`` (not as valid prefixes; valid rows are skipped)."""
    r = _rows(rows)
    if r.size == 0:
        return
    r = r[((trie.hold_col[w.word][r] | trie.pres_col[w.word][r]) & w.bit) == 0]
    trie.pres_col[w.word][r] |= w.bit
    w.n_present += int(r.size)


def drop(trie: Trie, w: WorkerInfo, rows: Iterable[int] | np.ndarray) -> None:
    """Clear every mark of ``w`` on ``rows``."""
    if isinstance(rows, Sized) and len(rows) == 1:  # an evicted leaf: >99% of drops under KV pressure
        _drop_one(trie, w, int(next(iter(rows))))
    else:
        _drop_rows(trie, w, _rows(rows))


def _drop_rows(trie: Trie, w: WorkerInfo, r: np.ndarray) -> None:
    if r.size == 0:
        return
    if w.displaced:  # the block leaves the worker: a later copy of it is stored on its canonical rank
        for row in r.tolist():
            w.displaced.pop(row, None)
    if w.n_valid:
        held = _with_bit(trie.hold_col, r, w)
        if held.size:
            trie.hold_col[w.word][held] &= ~w.bit
            trie.rc_col[w.dix][held] -= 1
            w.n_valid -= int(held.size)
    _clear_pending(trie, w, r)
    _clear_present(trie, w, r)
    _flag_parents(trie, w, r)


def _take_bit(col: np.ndarray, row: int, bit: np.uint64) -> bool:
    """Clear ``bit`` in ``col[row]``; whether it was set."""
    if col[row] & bit:
        col[row] &= ~bit
        return True
    return False


def _drop_one(trie: Trie, w: WorkerInfo, row: int) -> None:
    """:func:`_drop_rows` of the single row ``row`` in scalar operations, where array operations on a
    one-element array cost more than the work. Same effects, in the same order."""
    word, bit = w.word, w.bit
    if w.displaced:
        w.displaced.pop(row, None)
    if w.n_valid and _take_bit(trie.hold_col[word], row, bit):
        trie.rc_col[w.dix][row] -= 1
        w.n_valid -= 1
    if w.n_pending and _take_bit(trie.pend_col[word], row, bit):
        w.n_pending -= 1
        trie.pending_marks -= 1
    if w.n_present and _take_bit(trie.pres_col[word], row, bit):
        w.n_present -= 1
    par = int(trie.parent[row])
    if par != ROOT and trie.hold_col[word][par] & bit:  # flag_replicated of the one row, in scalars
        trie.active.stuck[par] = False
        rc = trie.rc_col
        copies = rc[0][par] if len(rc) == 1 else trie.rc[:, par].sum()
        if copies >= 2 and not trie.active.flag[par]:
            trie.active.add(np.array([par], np.int64))


def drop_pending(trie: Trie, w: WorkerInfo, rows: Iterable[int] | np.ndarray) -> None:
    """Clear only the pending mark of ``w`` on ``rows`` (physical presence stays)."""
    r = _rows(rows)
    if r.size == 0:
        return
    _clear_pending(trie, w, r)
    _flag_parents(trie, w, r)


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
    # Collect the whole present subtree first, then mark it in one call: make_valid's per-row effects (bits,
    # counters, flags) do not depend on the order, and the closure holds once the call returns (every collected
    # row's parent is a row of ``rows`` or a collected row). A long prompt's chain is hundreds of blocks and each
    # call has numpy's fixed overhead; the sibling lists are walked inline for the same reason (this runs on
    # every stored report).
    stack = list(rows)
    present, bit = trie.pres_col[w.word], w.bit
    first, nxt = trie.first_child, trie.next_sib
    below: list[int] = []
    while stack:
        c = int(first[stack.pop()])
        while c != NONE:
            if present[c] & bit:
                below.append(c)
                stack.append(c)
            c = int(nxt[c])
    if below:
        make_valid(trie, w, below)


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
