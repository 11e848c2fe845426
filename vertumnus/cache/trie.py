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
  * ``rc[i, d]`` = number of degree-index-``d`` workers in ``holders[i]`` (maintained by :mod:`.marks`);
  * ``active`` = rows with a non-zero ``access`` or ``missed`` entry (plus rows whose stats just decayed
    to zero, until the next scan drops them); the scan only ever touches these rows.
A node is freed as soon as it has no marks and no children; freeing cascades to its parent.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

ROOT = 0
NONE = -1
ALL_ONES = np.uint64(0xFFFF_FFFF_FFFF_FFFF)
# Per-row arrays and the value of a fresh row.
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


def mask_int(mask: np.ndarray) -> int:
    """A ``(words,)`` uint64 mask as one Python int (bit s = slot s)."""
    return int.from_bytes(np.ascontiguousarray(mask, dtype="<u8").tobytes(), "little")


def int_mask(bits: int, words: int) -> np.ndarray:
    """Inverse of :func:`mask_int`."""
    return np.frombuffer(bits.to_bytes(8 * words, "little"), dtype="<u8").astype(np.uint64)


def leading_runs(rows: np.ndarray) -> dict[int, int]:
    """Per worker slot with a non-empty run, the number of leading rows of ``rows`` (``(n, words)`` uint64
    masks along a root→z path) that have the slot's bit: the blocks each worker holds at the head of the path.

    Masks are ancestor-closed, so a slot's rows form a leading run and each slot leaves it at most once: only
    rows where the mask changes are looked at — O(n) vector work plus O(changes + slots) Python.
    """
    n = rows.shape[0]
    if n == 0:
        return {}
    if rows.shape[1] == 1:
        col = rows[:, 0]
        at = np.flatnonzero(col[1:] != col[:-1])
        before, after, last = col[at].tolist(), col[at + 1].tolist(), int(col[-1])
    else:
        at = np.flatnonzero((rows[1:] != rows[:-1]).any(axis=1))
        before = [mask_int(rows[i]) for i in at.tolist()]
        after = [mask_int(rows[i + 1]) for i in at.tolist()]
        last = mask_int(rows[-1])
    out: dict[int, int] = {}
    for i, a, b in zip(at.tolist(), before, after, strict=True):
        gone = a & ~b  # slots holding exactly rows [0, i]
        while gone:
            low = gone & -gone
            out[low.bit_length() - 1] = i + 1
            gone ^= low
    while last:
        low = last & -last
        out[low.bit_length() - 1] = n
        last ^= low
    return out


class Trie:
    """The node store. Mark mutation lives in :mod:`.marks` (it also updates replica counts and worker
    counters); this class owns structure, growth and freeing."""

    __slots__ = (
        "access",
        "active",
        "depth",
        "first_child",
        "free",
        "holders",
        "index",
        "key",
        "missed",
        "n_nodes",
        "next_sib",
        "parent",
        "pending",
        "pending_marks",
        "present",
        "prev_sib",
        "rc",
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
        self.rc = np.zeros((cap, n_degrees), np.int32)
        self.access = np.zeros((cap, n_degrees), np.float64)
        self.missed = np.zeros((cap, n_degrees), np.float64)
        self.active: set[int] = set()
        self.free: list[int] = []
        self.depth[ROOT] = 0
        self.size = 1  # rows [0, size) have been handed out at least once
        self.n_nodes = 0  # live nodes, root excluded
        self.version = 0  # bumped whenever rows are created or freed (cached paths become stale)
        self.pending_marks = 0  # set bits in ``pending`` over all rows (0: matching skips the pending pass)

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
            arr = np.full((new, *old.shape[1:]), fill, old.dtype)
            arr[:cap] = old
            setattr(self, name, arr)

    def add_word(self) -> None:
        """One more 64-slot word in every mask (called when a worker slot ≥ 64·words is allocated)."""
        for name in ("holders", "pending", "present"):
            old = getattr(self, name)
            setattr(self, name, np.hstack([old, np.zeros((old.shape[0], 1), np.uint64)]))

    # -- structure ------------------------------------------------------------------------------------------
    def lookup(self, keys: Sequence[int]) -> list[int]:
        """Rows of the longest leading run of ``keys`` present in the trie.

        Chained keys make presence prefix-closed (a present key's parent is present), so the run's end is
        found by binary search — O(log n) probes — and only the matched keys are then mapped to rows.
        """
        index = self.index
        n = len(keys)
        if n == 0:
            return []
        if keys[n - 1] in index:
            m = n
        else:
            lo, hi = 0, n - 1  # keys[hi] is absent; find the first absent position
            while lo < hi:
                mid = (lo + hi) // 2
                if keys[mid] in index:
                    lo = mid + 1
                else:
                    hi = mid
            m = lo
        rows = list(map(index.get, keys[:m]))
        if None in rows:  # only for an inconsistent (non-chained) key sequence
            rows = rows[: rows.index(None)]
        return rows  # type: ignore[return-value]

    def extend(self, parent: int, keys: Sequence[int]) -> list[int]:
        """Create a chain of new nodes for ``keys`` under ``parent``; returns their rows.

        Stops early at a key that already exists elsewhere (an inconsistent report); the caller sees the
        shorter chain.
        """
        index = self.index
        seen = list(map(index.__contains__, keys))
        n = seen.index(True) if True in seen else len(keys)
        if n == 0:
            return []
        keys = keys[:n]
        rows = self._alloc(n)
        arr = np.asarray(rows, np.int64)
        self.key[arr] = np.asarray(keys, np.int64)
        self.parent[arr[0]] = parent
        self.parent[arr[1:]] = arr[:-1]
        d0 = int(self.depth[parent]) + 1
        self.depth[arr] = np.arange(d0, d0 + n, dtype=np.int32)
        self.first_child[arr[:-1]] = arr[1:]
        self.first_child[arr[-1]] = NONE
        self.next_sib[arr[1:]] = NONE
        self.prev_sib[arr] = NONE
        # Link the chain head in front of parent's child list.
        head = arr[0]
        old = self.first_child[parent]
        self.next_sib[head] = old
        if old != NONE:
            self.prev_sib[old] = head
        self.first_child[parent] = head
        index.update(zip(keys, rows, strict=True))
        self.n_nodes += n
        self.version += 1
        return rows

    def _alloc(self, n: int) -> list[int]:
        take = min(n, len(self.free))
        rows = [self.free.pop() for _ in range(take)]
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
        arr = np.unique(np.fromiter(rows, np.int64))
        if arr.size == 0:
            return 0
        arr = arr[(arr != ROOT) & (self.depth[arr] > 0)]
        arr = arr[(self.first_child[arr] == NONE) & ~self.has_marks(arr)]
        freed = 0
        for r in arr.tolist():
            row = r
            while row != ROOT and self.depth[row] > 0 and self.first_child[row] == NONE:
                if self.holders[row].any() or self.pending[row].any() or self.present[row].any():
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
        self.access[row] = 0.0
        self.missed[row] = 0.0
        self.active.discard(row)
        self.free.append(row)
        self.n_nodes -= 1
        self.version += 1

    def nbytes(self) -> int:
        """Bytes held by the node arrays (the key dict not included)."""
        return sum(getattr(self, name).nbytes for name, _ in _FIELDS)
