"""A simulated worker's physical KV cache: blocks with LRU eviction, like an engine's prefix cache.

Entries are manager-size blocks (``cache.block_tokens`` tokens) keyed by chained block keys; each entry knows
its depth b in the prefix, its parent key and the rank of the worker it lives on. Ownership follows the torch
engine (:mod:`vertumnus.cache.reconfigure` has the sketch): a stored block goes to rank ``b mod C``; a merge
keeps every block on its rank (of a key both sources hold, the copy on the canonical rank of the merged worker
wins, else the lowest rank); a split gives each child the blocks on its ranks. The cache manager predicts the
same layout, so a split child holds exactly what the trie says.

Recency invariant (as vLLM's free-block queue): whenever a chain of blocks is used, it is touched from the last
block to the first, so a block is never less recently used than any of its descendants. LRU eviction therefore
removes descendants before their ancestors, and every eviction leaves the remaining holdings prefix-closed along
each chain that was stored complete.

Retention (the cache manager's, ``cache.retain_reused`` = m > 0; docs/design.md *Retention*): a block reused by
at least m prefills (its ``hits``; a store is not a reuse) is *retained*. Eviction takes the least recently used
block that is not retained, unless retained blocks fill more than ``cache.retain_fraction`` of the capacity, in
which case it takes the least recently used block of all. A prefix's reuse is a reuse of every block before it,
so hits never grow along a chain: a retained block's ancestors are retained too, and eviction stays
prefix-closed. With m = 0 eviction is plain LRU (the engines' own, what ``norepl`` runs).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Container, Iterable, Sequence
from dataclasses import dataclass


@dataclass(slots=True)
class _Entry:
    depth: int  # block index in its prefix (0 = first block)
    parent: int | None  # key of block depth-1, None at depth 0
    tick: int  # last use (monotone counter shared by a data plane); orders LRU across merged caches
    rank: int  # rank inside the worker that stores it
    hits: int = 0  # prefills that reused it (retention); non-increasing along a chain


class BlockCache:
    """LRU set of blocks of a degree-``degree`` worker with a capacity in blocks; every mutator returns what it
    evicted / removed."""

    __slots__ = (
        "_budget",
        "_children",
        "_cold",
        "_entries",
        "_m",
        "_retained",
        "capacity",
        "degree",
        "retain",
    )

    def __init__(self, capacity: int, degree: int = 1, retain: tuple[int, float] | None = None) -> None:
        if capacity < 1:
            raise ValueError(f"cache capacity must be ≥ 1 block, got {capacity}")
        if degree < 1:
            raise ValueError(f"cache degree must be ≥ 1, got {degree}")
        self.capacity = capacity
        self.degree = degree
        # retain = (m, fraction): blocks reused ≥ m times outlive the others while they fill ≤ fraction × capacity
        # (a split's children and a merge inherit it).
        self.retain = retain if retain and retain[0] > 0 else None
        self._m = self.retain[0] if self.retain else 0  # 0: plain LRU
        self._budget = int(capacity * self.retain[1]) if self.retain else 0
        self._retained = 0  # held entries with hits ≥ m (when m > 0)
        # Invariant (retention on): _cold = the held keys with hits < m, in the LRU order of _entries, so the
        # victim is found in O(1).
        self._cold: OrderedDict[int, None] = OrderedDict()
        # Invariant: iteration order = LRU order (front = least recently used); len ≤ capacity.
        self._entries: OrderedDict[int, _Entry] = OrderedDict()
        # Invariant: _children[p] = held keys whose parent key is p (p itself need not be held).
        self._children: dict[int, set[int]] = {}

    def _add(self, key: int, entry: _Entry) -> None:
        """Insert at the MRU end."""
        self._entries[key] = entry
        if entry.parent is not None:
            self._children.setdefault(entry.parent, set()).add(key)
        if self._m:
            if entry.hits >= self._m:
                self._retained += 1
            else:
                self._cold[key] = None

    def _drop(self, key: int) -> None:
        e = self._entries.pop(key)
        if e.parent is not None:
            sibs = self._children[e.parent]
            sibs.discard(key)
            if not sibs:
                del self._children[e.parent]
        if self._m:
            if e.hits >= self._m:
                self._retained -= 1
            else:
                del self._cold[key]

    def _evict_lru(self, chain: Container[int] = ()) -> int:
        """Evict one block; ``chain`` = blocks being stored, all at the MRU end behind at least one other."""
        entries = self._entries
        key = next(iter(entries))
        m = self._m
        if m and self._retained <= self._budget and entries[key].hits >= m and self._cold:
            # The LRU block not retained. If that is a block of the chain, everything else is retained: the LRU
            # block goes after all.
            k = next(iter(self._cold))
            if k not in chain:
                key = k
        self._drop(key)
        return key

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: int) -> bool:
        return key in self._entries

    @property
    def free(self) -> int:
        return self.capacity - len(self._entries)

    def keys(self) -> list[int]:
        """Held keys, least recently used first."""
        return list(self._entries)

    def layout(self) -> dict[int, int]:
        """Held key -> rank inside the worker that stores it."""
        return {k: e.rank for k, e in self._entries.items()}

    def leading(self, keys: Sequence[int], limit: int | None = None) -> int:
        """Number of leading blocks of ``keys`` held (at most ``limit``)."""
        n = len(keys) if limit is None else min(limit, len(keys))
        entries = self._entries
        for i in range(n):
            if keys[i] not in entries:
                return i
        return n

    def missing(self, keys: Sequence[int], start: int = 0) -> int:
        """How many of ``keys[start:]`` are not held."""
        entries = self._entries
        return sum(1 for k in keys[start:] if k not in entries)

    def touch(self, keys: Sequence[int], tick: int, reuse: bool = False) -> None:
        """Mark the held blocks of a chain used, last block first (keeps the recency invariant). ``reuse``: a
        prefill reuses them (counts towards retention)."""
        entries = self._entries
        m = self._m
        cold = self._cold
        for k in reversed(keys):
            e = entries.get(k)
            if e is not None:
                e.tick = tick
                entries.move_to_end(k)
                if m and e.hits < m:
                    if reuse:
                        e.hits += 1
                    if e.hits == m:
                        self._retained += 1
                        del cold[k]
                    else:
                        cold.move_to_end(k)
                elif reuse:
                    e.hits += 1

    def store(self, keys: Sequence[int], tick: int) -> tuple[int | None, list[int]]:
        """Hold the chain ``keys`` (the leading ``capacity`` blocks if it is longer).

        Returns ``(first_new, evicted)``: index of the first block that was not held before (None if all were),
        and the keys evicted to make room (LRU first). Blocks of the chain itself are never evicted.
        """
        n = min(len(keys), self.capacity)
        chain = keys[:n]
        entries = self._entries
        first_new: int | None = None
        for i, k in enumerate(chain):
            if k not in entries:
                first_new = i
                break
        evicted: list[int] = []
        if first_new is not None:
            need = sum(1 for k in chain[first_new:] if k not in entries)
            if len(entries) + need > self.capacity:
                self.touch(chain, tick)  # protect the held chain blocks: they move to the MRU end
                # held-chain + new ≤ n ≤ capacity, so the front holds a non-chain victim while over budget.
                held = set(chain) if self._m else ()
                while len(entries) + need > self.capacity:
                    evicted.append(self._evict_lru(held))
            for i in range(n - 1, first_new - 1, -1):  # insert last block first: ancestors end up more recent
                k = chain[i]
                if k not in entries:
                    self._add(k, _Entry(i, chain[i - 1] if i else None, tick, i % self.degree))
        self.touch(chain, tick)
        return first_new, evicted

    def remove(self, keys: Iterable[int]) -> list[int]:
        """Drop ``keys`` and every held descendant of them; returns what was removed."""
        entries, children = self._entries, self._children
        todo = [k for k in dict.fromkeys(keys) if k in entries]
        gone: list[int] = []
        seen = set(todo)
        while todo:  # held descendants, through held blocks only
            k = todo.pop()
            gone.append(k)
            for c in children.get(k, ()):
                if c not in seen:
                    seen.add(c)
                    todo.append(c)
        removed = sorted(gone, key=self._lru_rank)  # LRU order: (last use, deeper first)
        for k in removed:
            self._drop(k)
        return removed

    def _lru_rank(self, key: int) -> tuple[int, int]:
        e = self._entries[key]
        return (e.tick, -e.depth)

    def clear(self) -> list[int]:
        """Drop everything; returns what was held."""
        out = list(self._entries)
        self._entries.clear()
        self._children.clear()
        self._cold.clear()
        self._retained = 0
        return out

    def split(self, capacities: tuple[int, int]) -> tuple[BlockCache, BlockCache, list[int], list[int]]:
        """Split the worker's cache between its lower and upper rank halves: each child keeps the blocks on its
        ranks (renumbered from 0), in LRU order, and evicts LRU blocks beyond its capacity. Returns (lower,
        upper, evicted_lower, evicted_upper)."""
        assert self.degree % 2 == 0, f"cannot split a degree-{self.degree} cache"
        half = self.degree // 2
        lo, hi = BlockCache(capacities[0], half, self.retain), BlockCache(capacities[1], half, self.retain)
        for k, e in self._entries.items():
            if e.rank < half:
                lo._add(k, _Entry(e.depth, e.parent, e.tick, e.rank, e.hits))
            else:
                hi._add(k, _Entry(e.depth, e.parent, e.tick, e.rank - half, e.hits))
        return lo, hi, lo._shrink(), hi._shrink()

    @staticmethod
    def merge(
        parts: Sequence[tuple[int, BlockCache]], capacity: int, degree: int, retain: tuple[int, float] | None = None
    ) -> tuple[BlockCache, list[int]]:
        """Union of sibling caches, each given with its first rank inside the merged degree-``degree`` worker.

        Blocks stay on their ranks (no copying). A key several parts hold keeps one copy: the one on its
        canonical rank ``depth mod degree`` if any, else the one on the lowest rank; it counts as used at its
        latest use and as reused as often as its most reused copy. LRU order by last-use tick; evicts beyond
        capacity.
        """
        best: dict[int, _Entry] = {}
        for offset, part in parts:
            for k, e in part._entries.items():
                new = _Entry(e.depth, e.parent, e.tick, e.rank + offset, e.hits)
                cur = best.get(k)
                if cur is not None:  # keep the copy on the canonical rank, else the lower rank
                    better = (new.rank == new.depth % degree, -new.rank) > (cur.rank == cur.depth % degree, -cur.rank)
                    new.tick = cur.tick = max(cur.tick, new.tick)
                    new.hits = cur.hits = max(cur.hits, new.hits)
                    new = new if better else cur
                best[k] = new
        out = BlockCache(capacity, degree, retain)
        # Sort by tick, deeper blocks first on equal ticks (recency invariant: ancestors never older).
        for k, e in sorted(best.items(), key=lambda kv: (kv[1].tick, -kv[1].depth)):
            out._add(k, e)
        return out, out._shrink()

    def _shrink(self) -> list[int]:
        evicted: list[int] = []
        while len(self._entries) > self.capacity:
            evicted.append(self._evict_lru())
        return evicted
