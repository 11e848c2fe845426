"""Struct-of-arrays prefix trie: one node per cache block (DESIGN.md §3).

Node ``i`` lives in row ``i`` of a set of growable numpy arrays; a dict maps each chained block key to its row.
Row 0 is the root (depth 0, no key). Children form doubly linked sibling lists (``first_child`` /
``next_sib`` / ``prev_sib``) so a node is unlinked in O(1) and a subtree is walked without per-node containers.

Per node and worker slot, three bit masks (``(rows, words)`` uint64, bit ``s`` of word ``s // 64``):

- ``holders``: the worker holds the complete prefix ending at the node (valid, reusable);
- ``pending``: the worker was assigned the prefix by a split / merge but must reconcile it first;
- ``present``: the worker physically has this block, but not as part of a valid complete prefix.

Invariants, per worker ``w``:
  * ``holders`` and ``holders | pending`` are ancestor-closed (holders shrink monotonically down a path);
  * ``holders & pending == 0`` and ``holders & present == 0``;
  * ``rc[d, i]`` = number of degree-index-``d`` workers in ``holders[i]`` (maintained by :mod:`.marks`);
  * ``active`` ⊇ rows with a non-zero ``access`` or ``missed`` entry, plus rows with two or more valid copies
    where some holder keeps no valid / pending block below (a possible reclamation without statistics; see
    :mod:`.marks` and :func:`.stats.decay`); it may also hold rows whose stats just decayed to zero, until
    the next scan drops them. The scan only ever touches these rows.
A node is freed as soon as it has no marks and no children; freeing cascades to its parent.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from vertumnus.cache.active import ActiveRows
from vertumnus.cache.bits import int64_array
from vertumnus.cache.lookup import lookup_rows

ROOT = 0
NONE = -1
ALL_ONES = np.uint64(0xFFFF_FFFF_FFFF_FFFF)
_NO_ROWS = np.zeros(0, np.int64)  # read-only by convention
# Per-row arrays and the value of a fresh row. rc / access / missed are laid out per degree, (degrees, rows):
# a degree's column is contiguous (per-request updates) and the scan gathers active rows with one take().
_PER_DEGREE = frozenset(("rc", "access", "missed"))
_FIELDS = (
    ("key", 0),
    ("parent", NONE),
    ("depth", NONE),
    ("first_child", NONE),
    ("next_sib", NONE),
    ("prev_sib", NONE),
    ("holders", 0),
    ("pending", 0),
    ("present", 0),
    ("rc", 0),
    ("access", 0),
    ("missed", 0),
)


class Trie:
    """The node store. Mark mutation lives in :mod:`.marks` (it also updates replica counts and worker
    counters); this class owns structure, growth and freeing."""

    __slots__ = (
        "acc_col",
        "access",
        "active",
        "depth",
        "first_child",
        "free",
        "hold_col",
        "holders",
        "index",
        "key",
        "mis_col",
        "missed",
        "n_nodes",
        "next_sib",
        "parent",
        "pend_col",
        "pending",
        "pending_marks",
        "pres_col",
        "present",
        "prev_sib",
        "rc",
        "rc_col",
        "size",
        "version",
    )

    def __init__(self, n_degrees: int, capacity: int = 1024, words: int = 1) -> None:
        cap = max(capacity, 2)
        self.index: dict[int, int] = {}  # block key -> row
        self.key = np.zeros(cap, np.int64)
        self.parent = np.full(cap, NONE, np.int32)
        self.depth = np.full(cap, NONE, np.int32)  # NONE marks a free row
        self.first_child = np.full(cap, NONE, np.int32)
        self.next_sib = np.full(cap, NONE, np.int32)
        self.prev_sib = np.full(cap, NONE, np.int32)
        self.holders = np.zeros((cap, words), np.uint64)
        self.pending = np.zeros((cap, words), np.uint64)
        self.present = np.zeros((cap, words), np.uint64)
        self.rc = np.zeros((n_degrees, cap), np.int32)
        self.access = np.zeros((n_degrees, cap), np.float64)
        self.missed = np.zeros((n_degrees, cap), np.float64)
        self.active = ActiveRows(cap)
        self.free: list[int] = []
        self.depth[ROOT] = 0
        self.size = 1  # rows [0, size) have been handed out at least once
        self.n_nodes = 0  # live nodes, root excluded
        self.version = 0  # bumped whenever rows are created or freed (cached paths become stale)
        self.pending_marks = 0  # set bits in ``pending`` over all rows (0: matching skips the pending pass)
        self._columns()

    def _columns(self) -> None:
        """1-D views per mask word k (a strided column) and per degree index d (a contiguous row): ``v[rows]``
        is numpy's fast 1-D take / put, where ``array[rows, k]`` goes through general 2-D fancy indexing at
        several times the cost. Views follow the arrays: rebuilt whenever ``_grow`` / ``add_word`` replace
        them."""
        self.hold_col = [self.holders[:, k] for k in range(self.holders.shape[1])]
        self.pend_col = [self.pending[:, k] for k in range(self.pending.shape[1])]
        self.pres_col = [self.present[:, k] for k in range(self.present.shape[1])]
        self.rc_col = list(self.rc)
        self.acc_col = list(self.access)
        self.mis_col = list(self.missed)

    # -- growth ---------------------------------------------------------------------------------------------
    @property
    def capacity(self) -> int:
        return int(self.key.shape[0])

    @property
    def words(self) -> int:
        return int(self.holders.shape[1])

    def _grow(self, need: int) -> None:
        cap = self.capacity
        new = max(2 * cap, need)
        for name, fill in _FIELDS:
            old = getattr(self, name)
            if name in _PER_DEGREE:
                arr = np.full((old.shape[0], new), fill, old.dtype)
                arr[:, :cap] = old
            else:
                arr = np.full((new, *old.shape[1:]), fill, old.dtype)
                arr[:cap] = old
            setattr(self, name, arr)
        self.active.grow(new)
        self._columns()

    def add_word(self) -> None:
        """One more 64-slot word in every mask (called when a worker slot ≥ 64·words is allocated)."""
        for name in ("holders", "pending", "present"):
            old = getattr(self, name)
            setattr(self, name, np.hstack([old, np.zeros((old.shape[0], 1), np.uint64)]))
        self._columns()

    # -- structure ------------------------------------------------------------------------------------------
    def lookup(self, keys: Sequence[int]) -> np.ndarray:
        """Rows (int64) of the longest leading run of ``keys`` present in the trie (see :mod:`.lookup`)."""
        return lookup_rows(self, keys)

    def extend(self, parent: int, keys: Sequence[int]) -> np.ndarray:
        """Create a chain of new nodes for ``keys`` under ``parent``; returns their rows (int64).

        Stops early at a key that already exists elsewhere (an inconsistent report); the caller sees the
        shorter chain. New rows come from the free list first (last freed first), then from ``size`` on.
        """
        index = self.index
        if not index.keys().isdisjoint(keys):
            keys = keys[: list(map(index.__contains__, keys)).index(True)]
        n = len(keys)
        if n == 0:
            return _NO_ROWS
        d0 = int(self.depth[parent]) + 1
        if self.free:
            arr = self._link_recycled(parent, keys, d0)
        else:
            # Fast path: rows [lo, hi) were never handed out, so every field already holds its fill value
            # (no children, no siblings, no marks, no statistics): only key / parent / depth / child are set.
            lo, hi = self.size, self.size + n
            if hi > self.capacity:
                self._grow(hi)
            self.size = hi
            arr = np.arange(lo, hi, dtype=np.int64)
            self.key[lo:hi] = int64_array(keys)
            self.parent[lo] = parent
            self.parent[lo + 1 : hi] = arr[:-1]
            self.depth[lo:hi] = arr + (d0 - lo)
            self.first_child[lo : hi - 1] = arr[1:]
        # Link the chain head in front of parent's child list.
        head = int(arr[0])
        old = int(self.first_child[parent])
        self.next_sib[head] = old
        if old != NONE:
            self.prev_sib[old] = head
        self.first_child[parent] = head
        index.update(zip(keys, arr.tolist(), strict=True))
        self.n_nodes += n
        self.version += 1
        return arr

    def _link_recycled(self, parent: int, keys: Sequence[int], d0: int) -> np.ndarray:
        """Rows for a chain that reuses freed rows (scattered: set field by field through the row list)."""
        n = len(keys)
        arr = np.asarray(self._alloc(n), np.int64)
        self.key[arr] = int64_array(keys)
        self.parent[arr[0]] = parent
        self.parent[arr[1:]] = arr[:-1]
        self.depth[arr] = np.arange(d0, d0 + n, dtype=np.int32)
        self.first_child[arr[:-1]] = arr[1:]
        self.first_child[arr[-1]] = NONE
        self.next_sib[arr[1:]] = NONE
        self.prev_sib[arr] = NONE
        return arr

    def _alloc(self, n: int) -> list[int]:
        free = self.free
        take = min(n, len(free))
        cut = len(free) - take
        rows = free[cut:][::-1]  # the order of ``take`` pops
        del free[cut:]
        rest = n - take
        if rest:
            if self.size + rest > self.capacity:
                self._grow(self.size + rest)
            rows.extend(range(self.size, self.size + rest))
            self.size += rest
        return rows

    def children(self, row: int) -> list[int]:
        """Rows of the children of ``row``."""
        out = []
        c = int(self.first_child[row])
        nxt = self.next_sib
        while c != NONE:
            out.append(c)
            c = int(nxt[c])
        return out

    def path_to(self, row: int) -> np.ndarray:
        """Rows root→``row`` (root excluded), as an int64 array of length depth(row)."""
        d = int(self.depth[row])
        out = np.empty(d, np.int64)
        par = self.parent
        for i in range(d - 1, -1, -1):
            out[i] = row
            row = int(par[row])
        return out

    def keys_of(self, rows: np.ndarray) -> tuple[int, ...]:
        """Block keys of ``rows``."""
        return tuple(self.key[rows].tolist())

    def has_marks(self, rows: np.ndarray) -> np.ndarray:
        """Boolean per row: some worker holds, pends or physically has it."""
        return (self.holders[rows] | self.pending[rows] | self.present[rows]).any(axis=1)

    def is_live(self, row: int) -> bool:
        return row != ROOT and 0 <= row < self.size and self.depth[row] > 0

    # -- freeing --------------------------------------------------------------------------------------------
    def try_free(self, rows: Iterable[int]) -> int:
        """Free every row of ``rows`` that has no marks and no children, cascading to parents; returns the
        number of freed nodes."""
        arr = np.fromiter(rows, np.int64)
        if arr.size == 0:
            return 0
        arr.sort()  # ascending and distinct, as np.unique (which also pulls in numpy.ma on first use)
        if arr.size > 1:
            keep = np.empty(arr.size, bool)
            keep[0] = True
            np.not_equal(arr[1:], arr[:-1], out=keep[1:])
            arr = arr[keep]
        arr = arr[(arr != ROOT) & (self.depth[arr] > 0)]
        arr = arr[(self.first_child[arr] == NONE) & ~self.has_marks(arr)]
        freed = 0
        cols = (*self.hold_col, *self.pend_col, *self.pres_col)  # scalar reads: rows here are one at a time
        for r in arr.tolist():
            row = r
            while row != ROOT and self.depth[row] > 0 and self.first_child[row] == NONE:
                if any(c[row] for c in cols):
                    break
                par = int(self.parent[row])
                self._free_one(row)
                freed += 1
                row = par
        return freed

    def _free_one(self, row: int) -> None:
        par = int(self.parent[row])
        prv, nxt = int(self.prev_sib[row]), int(self.next_sib[row])
        if prv != NONE:
            self.next_sib[prv] = nxt
        else:
            self.first_child[par] = nxt
        if nxt != NONE:
            self.prev_sib[nxt] = prv
        del self.index[int(self.key[row])]
        self.parent[row] = NONE
        self.depth[row] = NONE
        self.next_sib[row] = NONE
        self.prev_sib[row] = NONE
        self.access[:, row] = 0.0
        self.missed[:, row] = 0.0
        self.active.discard(row)
        self.free.append(row)
        self.n_nodes -= 1
        self.version += 1

    def nbytes(self) -> int:
        """Bytes held by the node arrays (the key dict not included)."""
        return sum(getattr(self, name).nbytes for name, _ in _FIELDS)
