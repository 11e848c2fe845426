"""The grouping lattice: which worker compositions exist and which are one split / merge apart.

Ranks of a node are tiled by aligned buddy blocks; a degree-C worker covers node ranks [jC, (j+1)C)::

    node ranks   0 1 2 3 4 5 6 7
    CP8          [──────────────]            split 8 → 4+4: the two aligned halves
    CP4 + CP4    [──────][──────]            merge 4+4 → 8: siblings [0,4) and [4,8) only
    CP4+CP2+CP2  [──────][──][──]            ([2,4) and [4,6) are not siblings: no merge)

A composition is the multiset of degrees (``{4: 2, 8: 1}``); GPU count is invariant under split / merge.
Worker ids come from a counter and are never reused, so a worker id names one geometry for the pool's life.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache

from vertumnus.types import ReconfigKind, WorkerGroup

Counts = tuple[int, ...]  # worker count per degree, in the lattice's ascending degree order


@lru_cache(maxsize=64)
def block_tilings(size: int, degrees: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
    """All buddy tilings of an aligned block of ``size`` ranks with allowed degrees (rank order)."""
    out: list[tuple[int, ...]] = []
    if size in degrees:
        out.append((size,))
    half = size // 2
    if size % 2 == 0 and half >= min(degrees):
        halves = block_tilings(half, degrees)
        out.extend(a + b for a in halves for b in halves)
    return tuple(out)


@lru_cache(maxsize=64)
def node_tilings(gpus_per_node: int, degrees: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
    """Buddy tilings of one node: top-level blocks of the largest degree, each tiled recursively.

    One tiling per distinct degree multiset, the one placing large workers at low ranks.
    """
    top = max(degrees)
    per_block = block_tilings(top, degrees)
    tilings: list[tuple[int, ...]] = [()]
    for _ in range(gpus_per_node // top):
        tilings = [t + b for t in tilings for b in per_block]
    seen: dict[tuple[int, ...], tuple[int, ...]] = {}
    for t in sorted(tilings, key=lambda t: [-d for d in t]):
        seen.setdefault(tuple(sorted(t)), t)
    return tuple(seen.values())


@dataclass(slots=True, frozen=True)
class LatticeOp:
    """A candidate move: sources (1 for split, 2 siblings for merge) and the target geometries."""

    kind: ReconfigKind
    sources: tuple[WorkerGroup, ...]
    targets: tuple[WorkerGroup, ...]


class Lattice:
    """Current composition of the pool plus the moves to adjacent compositions."""

    def __init__(self, nodes: int, gpus_per_node: int, degrees: Iterable[int]) -> None:
        self.nodes = nodes
        self.gpus_per_node = gpus_per_node
        self.degrees = tuple(sorted(set(degrees)))
        for d in self.degrees:
            if d < 1 or d & (d - 1) or gpus_per_node % d:
                raise ValueError(f"degree {d} must be a power of two dividing gpus_per_node={gpus_per_node}")
        self.groups: dict[int, WorkerGroup] = {}
        self._next_id = 0

    # -- compositions -------------------------------------------------------------------------------------
    def reachable(self) -> dict[Counts, tuple[tuple[int, ...], ...]]:
        """Every reachable composition → one per-node tiling realising it (DP over nodes)."""
        options = node_tilings(self.gpus_per_node, self.degrees)
        states: dict[Counts, tuple[tuple[int, ...], ...]] = {(0,) * len(self.degrees): ()}
        for _ in range(self.nodes):
            nxt: dict[Counts, tuple[tuple[int, ...], ...]] = {}
            for counts, layout in states.items():
                for tiling in options:
                    c = list(counts)
                    for d in tiling:
                        c[self.degrees.index(d)] += 1
                    nxt.setdefault(tuple(c), (*layout, tiling))
            states = nxt
        return states

    def as_dict(self, counts: Counts) -> dict[int, int]:
        return {d: n for d, n in zip(self.degrees, counts, strict=True) if n}

    def as_counts(self, composition: dict[int, int]) -> Counts:
        for d in composition:
            if d not in self.degrees:
                raise ValueError(f"degree {d} not in allowed degrees {list(self.degrees)}")
        return tuple(composition.get(d, 0) for d in self.degrees)

    def build(self, composition: dict[int, int]) -> list[WorkerGroup]:
        """Set the composition (fresh ids, node order then rank order) and return its groups."""
        layouts = self.reachable()
        counts = self.as_counts(composition)
        if counts not in layouts:
            raise ValueError(
                f"composition {composition} is not a buddy tiling of {self.nodes} node(s) × "
                f"{self.gpus_per_node} GPUs with degrees {list(self.degrees)}"
            )
        self.groups = {}
        for node, tiling in enumerate(layouts[counts]):
            first = 0
            for d in tiling:
                g = WorkerGroup(self.new_id(), node, first, d)
                self.groups[g.worker_id] = g
                first += d
        return list(self.groups.values())

    def composition(self) -> dict[int, int]:
        out: dict[int, int] = {}
        for g in self.groups.values():
            out[g.degree] = out.get(g.degree, 0) + 1
        return dict(sorted(out.items()))

    def new_id(self) -> int:
        wid = self._next_id
        self._next_id += 1
        return wid

    @property
    def next_id(self) -> int:
        return self._next_id

    def reserve_ids(self, upto: int) -> None:
        """Never hand out ids below ``upto`` again (targets of a plan in flight own them)."""
        self._next_id = max(self._next_id, upto)

    # -- adjacency ----------------------------------------------------------------------------------------
    def split_of(self, worker_id: int, first_id: int | None = None) -> LatticeOp | None:
        """The split of one worker into its two aligned halves, or None if the half degree is not allowed.

        Target ids are ``first_id`` and ``first_id + 1`` (default: the next unallocated ids).
        """
        g = self.groups[worker_id]
        half = g.degree // 2
        if g.degree % 2 or half not in self.degrees:
            return None
        a = self._next_id if first_id is None else first_id
        targets = (WorkerGroup(a, g.node, g.first_rank, half), WorkerGroup(a + 1, g.node, g.first_rank + half, half))
        return LatticeOp(ReconfigKind.SPLIT, (g,), targets)

    def sibling(self, worker_id: int) -> WorkerGroup | None:
        """The buddy a worker can merge with (same node and degree, together an aligned 2C block)."""
        g = self.groups[worker_id]
        if 2 * g.degree not in self.degrees:
            return None
        buddy_first = g.first_rank ^ g.degree  # aligned blocks: the buddy differs in exactly the bit C
        for other in self.groups.values():
            if other.node == g.node and other.first_rank == buddy_first and other.degree == g.degree:
                return other
        return None

    def merge_of(self, worker_id: int, target_id: int | None = None) -> LatticeOp | None:
        """The merge of a worker with its sibling, or None if there is none."""
        g = self.groups[worker_id]
        buddy = self.sibling(worker_id)
        if buddy is None:
            return None
        lo, hi = sorted((g, buddy), key=lambda x: x.first_rank)
        tid = self._next_id if target_id is None else target_id
        return LatticeOp(ReconfigKind.MERGE, (lo, hi), (WorkerGroup(tid, g.node, lo.first_rank, 2 * g.degree),))

    def ops(self, kind: ReconfigKind) -> list[LatticeOp]:
        """All moves of one kind from the current composition (merges listed once, by their lower sibling)."""
        out: list[LatticeOp] = []
        for wid in sorted(self.groups):
            op = self.split_of(wid) if kind == ReconfigKind.SPLIT else self.merge_of(wid)
            if op is not None and (kind == ReconfigKind.SPLIT or op.sources[0].worker_id == wid):
                out.append(op)
        return out

    def apply(self, sources: Iterable[WorkerGroup], targets: Iterable[WorkerGroup]) -> None:
        """Replace sources by targets (commit of a reconfiguration)."""
        for s in sources:
            del self.groups[s.worker_id]
        for t in targets:
            assert t.worker_id not in self.groups
            self.groups[t.worker_id] = t
            self._next_id = max(self._next_id, t.worker_id + 1)
