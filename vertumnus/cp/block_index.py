"""Worker-level index of the KV blocks a CP worker holds: which rank stores each block, LRU order, capacity.

Every rank of a worker keeps an identical copy: all ranks receive the same command sequence and every decision
below is a deterministic function of it, so they agree on reuse, placement and eviction without talking.
The tensors themselves live in :class:`vertumnus.cp.kv_store.RankKVStore`, only on the owning rank.

Invariants
- A block is identified by its chained key; ``depth`` is its index inside its prefix (key k of a prompt).
- New blocks (computed or imported) go to rank ``depth mod C`` (canonical owner). After a merge blocks keep
  the rank they were on (no copying), so ``owner`` is stored per block and reuse gathers from wherever blocks
  are; a split child keeps the blocks on its ranks — a prefix computed by a child before a merge comes back to
  it whole. The cache manager and the simulator compute this same layout (sketch in
  :mod:`vertumnus.cache.reconfigure`), which is why no cache report is needed when new groups activate::

      CP2 + CP2 --merge--> CP4                      --split--> CP2 + CP2
      A on ranks 0 1 0 1   A0 A2 @r0, A1 A3 @r1                 lower child: all of A
      (lower child)        B computed here: B_d @ r(d mod 4)    lower: B0 B1, upper: B2 B3
- ``used[r]`` = number of blocks owned by rank r ≤ ``capacity`` (per-rank KV capacity, in blocks).
- LRU: one ordered dict per rank, oldest first. Paths are touched leaf → root, so ancestors are more recent
  than their descendants and eviction tends to take leaves.
- Evicting a block evicts every present descendant (they would be unusable); a REMOVED report therefore never
  leaves a completely held descendant behind.
- Retention (``cache.retain_reused`` = m > 0, the cache manager's; as the simulator's
  :class:`~vertumnus.engines.sim.cache.BlockCache`): ``hits`` counts the prefills that reused a block. While a
  rank's blocks with ``hits ≥ m`` number at most ``retain_fraction × capacity``, that rank evicts its least
  recently used block with ``hits < m``; beyond, plain LRU. Reuse of a prefix is reuse of every block before
  it, so hits never grow along a path and a retained block's ancestors are retained too.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass


@dataclass(slots=True)
class BlockMeta:
    parent: int | None  # key of the previous block of the prefix (None: first block)
    depth: int
    owner: int  # rank inside the worker that stores the tensor
    tick: int  # last use; larger is more recent
    hits: int = 0  # prefills that reused it (retention); non-increasing along a path


# (key, parent, depth, owner, tick, hits): the picklable form exchanged at a merge
BlockRow = tuple[int, int | None, int, int, int, int]


class BlockIndex:
    """Replicated per-worker block metadata with per-rank LRU and capacity."""

    def __init__(self, degree: int, capacity: int, retain: tuple[int, float] | None = None) -> None:
        assert degree >= 1 and capacity >= 1
        self.degree = degree
        self.capacity = capacity
        self.retain = retain if retain and retain[0] > 0 else None
        self._m = self.retain[0] if self.retain else 0  # 0: plain LRU
        self._budget = int(capacity * self.retain[1]) if self.retain else 0
        self._retained = [0] * degree  # per rank: blocks with hits ≥ m
        # Invariant (retention on): _cold[r] = rank r's keys with hits < m, in the order of _lru[r] (O(1) victim).
        self._cold: list[OrderedDict[int, None]] = [OrderedDict() for _ in range(degree)]
        self._meta: dict[int, BlockMeta] = {}
        self._children: dict[int, set[int]] = {}  # parent key -> present children (parent may be absent)
        self._lru: list[OrderedDict[int, None]] = [OrderedDict() for _ in range(degree)]
        self._tick = 0

    def __len__(self) -> int:
        return len(self._meta)

    def __contains__(self, key: int) -> bool:
        return key in self._meta

    def used(self, rank: int) -> int:
        return len(self._lru[rank])

    def owner(self, key: int) -> int:
        return self._meta[key].owner

    def match(self, keys: Sequence[int], limit: int | None = None) -> int:
        """Number of leading ``keys`` present (at most ``limit``)."""
        n = len(keys) if limit is None else min(limit, len(keys))
        for i in range(n):  # per block, not per token
            if keys[i] not in self._meta:
                return i
        return n

    def touch(self, keys: Sequence[int], reuse: bool = False) -> None:
        """Mark present ``keys`` (a path) as just used, leaf first so that ancestors end up most recent.
        ``reuse``: a prefill reuses them (counts towards retention)."""
        for key in reversed(keys):
            m = self._meta.get(key)
            if m is not None:
                self._tick += 1
                m.tick = self._tick
                self._lru[m.owner].move_to_end(key)
                if self._m and m.hits < self._m:
                    if reuse:
                        m.hits += 1
                    if m.hits == self._m:
                        self._retained[m.owner] += 1
                        del self._cold[m.owner][key]
                    else:
                        self._cold[m.owner].move_to_end(key)
                elif reuse:
                    m.hits += 1

    def _insert(self, key: int, parent: int | None, depth: int, owner: int, hits: int = 0) -> None:
        self._tick += 1
        self._meta[key] = BlockMeta(parent, depth, owner, self._tick, hits)
        self._lru[owner][key] = None
        if parent is not None:
            self._children.setdefault(parent, set()).add(key)
        if self._m:
            if hits >= self._m:
                self._retained[owner] += 1
            else:
                self._cold[owner][key] = None

    def remove(self, keys: Iterable[int]) -> list[int]:
        """Remove ``keys`` and all their present descendants; returns the removed keys (parents first)."""
        out: list[int] = []
        stack = [k for k in keys if k in self._meta]
        seen: set[int] = set()
        while stack:
            key = stack.pop()
            if key in seen or key not in self._meta:
                continue
            seen.add(key)
            out.append(key)
            stack.extend(self._children.get(key, ()))
        for key in out:
            m = self._meta.pop(key)
            del self._lru[m.owner][key]
            if self._m:
                if m.hits >= self._m:
                    self._retained[m.owner] -= 1
                else:
                    del self._cold[m.owner][key]
            if m.parent is not None:
                sib = self._children.get(m.parent)
                if sib is not None:
                    sib.discard(key)
                    if not sib:
                        del self._children[m.parent]
        return out

    def _make_room(self, rank: int, pinned: set[int], evicted: list[int]) -> bool:
        """Evict LRU subtrees owned by ``rank`` until it has a free slot; False if only pinned blocks remain."""
        while len(self._lru[rank]) >= self.capacity:
            victim = None
            if self._m and self._retained[rank] <= self._budget:  # the LRU block not retained, if any
                victim = next((k for k in self._cold[rank] if k not in pinned), None)
            if victim is None:
                victim = next((k for k in self._lru[rank] if k not in pinned), None)
            if victim is None:
                return False
            sub = self._subtree(victim)
            if pinned.intersection(sub):  # never cut a pinned path
                pinned = pinned | {victim}
                continue
            evicted.extend(self.remove([victim]))
        return True

    def _subtree(self, key: int) -> list[int]:
        out, stack = [], [key]
        while stack:
            k = stack.pop()
            out.append(k)
            stack.extend(self._children.get(k, ()))
        return out

    def add_path(self, keys: Sequence[int], first: int, only: set[int] | None = None) -> tuple[list[int], list[int]]:
        """Insert the absent blocks among ``keys[first:]`` (a prefix path), evicting LRU blocks as needed.

        Block ``keys[i]`` goes to its canonical rank ``i mod C``. With ``only``, keys outside it are skipped
        (an import installs only what a source provided). Stops at the first block that cannot be placed (its
        rank holds only blocks of this path), so the added blocks never outrun a hole they created.
        Returns (added keys, evicted keys); blocks of ``keys`` are never evicted.
        """
        pin = set(keys)
        added: list[int] = []
        evicted: list[int] = []
        for i in range(first, len(keys)):
            key = keys[i]
            if key in self._meta or (only is not None and key not in only):
                continue
            rank = i % self.degree
            if not self._make_room(rank, pin, evicted):
                break
            self._insert(key, keys[i - 1] if i > 0 else None, i, rank)
            added.append(key)
        return added, evicted

    # -- reconfiguration -----------------------------------------------------------------------------------

    def rows(self) -> list[BlockRow]:
        """All blocks, least recently used first (picklable)."""
        items = sorted(self._meta.items(), key=lambda kv: kv[1].tick)
        return [(k, m.parent, m.depth, m.owner, m.tick, m.hits) for k, m in items]

    @staticmethod
    def from_rows(
        rows: Iterable[BlockRow], degree: int, capacity: int, retain: tuple[int, float] | None = None
    ) -> BlockIndex:
        """Rebuild from :meth:`rows` (order = LRU order)."""
        idx = BlockIndex(degree, capacity, retain)
        for key, parent, depth, owner, _tick, hits in rows:
            idx._insert(key, parent, depth, owner, hits)
        return idx

    def split(self, offset: int, degree: int) -> BlockIndex:
        """The child's index after a split: blocks on ranks [offset, offset + degree), renumbered from 0."""
        rows = [(k, p, d, o - offset, t, h) for k, p, d, o, t, h in self.rows() if offset <= o < offset + degree]
        return BlockIndex.from_rows(rows, degree, self.capacity, self.retain)

    @staticmethod
    def merge(
        parts: Sequence[tuple[int, list[BlockRow]]],
        degree: int,
        capacity: int,
        retain: tuple[int, float] | None = None,
    ) -> tuple[BlockIndex, dict[int, list[int]]]:
        """Union of sources' rows (``(rank offset, rows)`` each) into one degree-``degree`` index.

        A key held by several sources keeps one copy: the one on its canonical rank (depth mod C) if any, else
        the lowest rank, counted as reused as often as its most reused copy. Returns the index and, per rank,
        the duplicate keys that rank must drop.
        LRU order across sources: by tick, then source order (ticks of different workers are only roughly
        comparable; the order is deterministic, which is what replication across ranks needs).
        """
        by_key: dict[int, list[tuple[int, int | None, int, int, int, int]]] = {}
        for offset, rows in parts:
            for key, parent, depth, owner, tick, hits in rows:
                by_key.setdefault(key, []).append((tick, parent, depth, owner + offset, offset, hits))
        drop: dict[int, list[int]] = {}
        chosen: list[tuple[int, int, int, int | None, int, int, int]] = []
        for key, copies in by_key.items():
            depth = copies[0][2]
            canon = [c for c in copies if c[3] == depth % degree]
            keep = canon[0] if canon else min(copies, key=lambda c: c[3])
            for c in copies:
                if c is not keep:
                    drop.setdefault(c[3], []).append(key)
            tick = max(c[0] for c in copies)
            hits = max(c[5] for c in copies)
            chosen.append((tick, keep[4], key, keep[1], depth, keep[3], hits))
        chosen.sort(key=lambda c: (c[0], c[1], c[2]))
        rows = [(key, parent, depth, owner, tick, hits) for tick, _o, key, parent, depth, owner, hits in chosen]
        return BlockIndex.from_rows(rows, degree, capacity, retain), drop
