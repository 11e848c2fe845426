"""The trie rows with live statistics or surplus replicas (DESIGN.md §3): what the periodic scan and the decay
touch.

A flag per row plus the arrays of rows flagged since the last snapshot, so a placement marks its path with a few
vector operations (no per-block set insertions) and a snapshot costs O(active rows), never O(trie size).

Invariants:
  * ``flag[r]`` ⇔ row r is active; ``n`` = number of flagged rows;
  * ``stuck[r]``: the scan found that every holder of row r keeps a valid / pending block below it, so no
    reclamation can take r until that changes (:mod:`.marks` clears it when r gains a holder or a holder of
    r loses its blocks below); a freed row is never stuck;
  * every flagged row is in ``_rows`` or in one of the ``_new`` arrays (they may also hold stale rows — since
    unflagged, freed or recycled — and duplicates: a snapshot filters by ``flag`` and deduplicates).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

_EMPTY = np.zeros(0, np.int64)


class ActiveRows:
    """Set of active trie rows (see the module docstring)."""

    __slots__ = ("_new", "_rows", "flag", "n", "stuck")

    def __init__(self, capacity: int) -> None:
        self.flag = np.zeros(capacity, bool)
        self.stuck = np.zeros(capacity, bool)
        self.n = 0
        self._rows = _EMPTY  # sorted distinct rows as of the last snapshot
        self._new: list[np.ndarray] = []  # rows flagged since

    def grow(self, capacity: int) -> None:
        """Room for rows up to ``capacity`` (the trie grew)."""
        flag = np.zeros(capacity, bool)
        flag[: self.flag.size] = self.flag
        self.flag = flag
        stuck = np.zeros(capacity, bool)
        stuck[: self.stuck.size] = self.stuck
        self.stuck = stuck

    def __len__(self) -> int:
        return self.n

    def __contains__(self, row: int) -> bool:
        return bool(self.flag[row])

    def __iter__(self) -> Iterator[int]:
        return iter(self.rows().tolist())

    def add(self, rows: np.ndarray) -> None:
        """Flag ``rows`` (distinct row numbers, e.g. a root→leaf path)."""
        flagged = self.flag[rows]
        if flagged.all():
            return
        new = rows[~flagged]
        if new.size:
            self.flag[new] = True
            self.n += int(new.size)
            self._new.append(new)

    def remove(self, rows: np.ndarray) -> None:
        """Unflag ``rows`` (distinct, all flagged)."""
        self.flag[rows] = False
        self.n -= int(rows.size)

    def discard(self, row: int) -> None:
        """Unflag one row if it is flagged (a freed row; it is not stuck either)."""
        self.stuck[row] = False
        if self.flag[row]:
            self.flag[row] = False
            self.n -= 1

    def rows(self) -> np.ndarray:
        """The active rows, sorted ascending (a snapshot; callers must not modify it)."""
        if self._new:
            rows = np.concatenate([self._rows, *self._new])
            self._new = []
            rows = rows[self.flag[rows]]
            rows.sort()
            if rows.size > 1:
                keep = np.empty(rows.size, bool)
                keep[0] = True
                np.not_equal(rows[1:], rows[:-1], out=keep[1:])
                rows = rows[keep]
        else:
            rows = self._rows[self.flag[self._rows]]
        self._rows = rows
        assert rows.size == self.n, "active flags and rows disagree"
        return rows
