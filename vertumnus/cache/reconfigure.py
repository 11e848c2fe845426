"""Cache metadata across a split or merge (DESIGN.md §2, §4).

Block ownership — where a worker's blocks physically live; the torch engine's layout, which the simulator and
this module compute as the same deterministic function of the store / import / merge / split history:

- store: a block computed or imported at depth d (0-based) by a degree-C worker goes to its rank d mod C;
- merge: every block stays on the rank it is on (a merge copies nothing); of a key both sources hold, the copy
  on the target's canonical rank survives if there is one, else the copy on the lowest rank;
- split: each child keeps the blocks on its ranks (renumbered from its first rank).

So a block computed by a smaller worker keeps that worker's stripes inside a merged one, and a split returns it
to the child that computed it, whole::

    CP2 lo (r0 r1) + CP2 hi (r2 r3)  --merge-->  CP4 (r0 r1 r2 r3)        --split-->  lo' (r0 r1) | hi' (r2 r3)
    A computed on lo: r0 A0 A2, r1 A1 A3         A0 A2 @r0  A1 A3 @r1                  all of A    |
    C computed on hi: r2 C0 C2, r3 C1 C3         C0 C2 @r2  C1 C3 @r3                              | all of C
    B computed on the CP4:                       B0 @r0 B1 @r1 B2 @r2 B3 @r3           B0 B1       | B2 B3

Blocks off their canonical rank ("displaced": A2, A3, C0, C1 above) are the exception — only a merge creates
them — so the manager keeps just those ranks (``WorkerInfo.displaced``); every other block of a degree-C worker
lies on rank (depth−1) mod C of the trie depth. A key both children hold after a split (each reconciled the
other's stripes) merges back canonical: one of its two copies is on its canonical CP4 rank.

Split: each child's physical blocks follow that rule; retained prefixes (the parent's leaf prefixes, valid or
pending) are assigned one by one — highest recent demand first — to the child with room for its blocks,
balancing assigned demand. Merge: physical blocks and assigned prefixes are the union of the sources'.
For every target: valid = the ancestor-closed part of its physical blocks; pending = assigned prefixes' blocks
that are not valid; present = physical blocks that are not valid; *missing* = pending blocks not physically
there (what reconciliation will copy).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from vertumnus.cache import marks
from vertumnus.cache.trie import ROOT, Trie
from vertumnus.cache.workers import WorkerInfo, WorkerTable
from vertumnus.types import ReconfigKind, ReconfigPlan, WorkerGroup


@dataclass(slots=True)
class TargetLayout:
    """What one target worker holds right after the operation."""

    group: WorkerGroup
    capacity: int
    valid: np.ndarray
    pending: np.ndarray
    present: np.ndarray
    missing: np.ndarray
    displaced: dict[int, int]  # row -> rank inside the target, for physical blocks off their canonical rank


def _split_marks(trie: Trie, w: WorkerInfo) -> tuple[np.ndarray, np.ndarray]:
    """(physical rows, assigned rows) of a worker: holders|present and holders|pending."""
    rows = marks.nodes_of(trie, w)
    h = (trie.holders[rows, w.word] & w.bit) != 0
    p = (trie.pending[rows, w.word] & w.bit) != 0
    s = (trie.present[rows, w.word] & w.bit) != 0
    return rows[h | s], rows[h | p]


def _canonical(trie: Trie, rows: np.ndarray, degree: int) -> np.ndarray:
    """Canonical rank (depth−1) mod ``degree`` of each row."""
    return (trie.depth[rows].astype(np.int64) - 1) % degree


def block_ranks(trie: Trie, w: WorkerInfo, phys: np.ndarray) -> np.ndarray:
    """Rank inside ``w`` of each of its physical rows ``phys`` (ascending, as :func:`_split_marks` gives them)."""
    out = _canonical(trie, phys, w.degree)
    if w.displaced and phys.size:
        rows = np.fromiter(w.displaced.keys(), np.int64, len(w.displaced))
        vals = np.fromiter(w.displaced.values(), np.int64, len(w.displaced))
        pos = np.minimum(np.searchsorted(phys, rows), phys.size - 1)
        hit = phys[pos] == rows
        out[pos[hit]] = vals[hit]
    return out


def block_layout(trie: Trie, w: WorkerInfo) -> dict[int, int]:
    """Block key -> rank inside ``w`` for every block ``w`` physically has, as the manager believes it (tests
    compare it with the engine's layout)."""
    phys, _ = _split_marks(trie, w)
    return dict(zip(trie.key[phys].tolist(), block_ranks(trie, w, phys).tolist(), strict=True))


def _finish(
    trie: Trie, g: WorkerGroup, cap: int, phys: np.ndarray, rank: np.ndarray, assigned: np.ndarray
) -> TargetLayout:
    valid = marks.closed_subset(trie, phys)
    pending = np.setdiff1d(assigned, valid)
    off = rank != _canonical(trie, phys, g.degree)
    return TargetLayout(
        g,
        cap,
        valid,
        pending,
        np.setdiff1d(phys, valid),
        np.setdiff1d(pending, phys, assume_unique=True),
        dict(zip(phys[off].tolist(), rank[off].tolist(), strict=True)),
    )


def _validate(plan: ReconfigPlan, workers: WorkerTable) -> None:
    for g in plan.sources:
        if g.worker_id not in workers.by_id:
            raise ValueError(f"reconfiguration source worker {g.worker_id} is not registered")
    if plan.kind == ReconfigKind.SPLIT:
        ok = len(plan.sources) == 1 and len(plan.targets) == 2
        if ok:
            (s,) = plan.sources
            ok = (
                all(
                    t.node == s.node
                    and 2 * t.degree == s.degree
                    and s.first_rank <= t.first_rank
                    and t.first_rank + t.degree <= s.first_rank + s.degree
                    for t in plan.targets
                )
                and plan.targets[0].first_rank != plan.targets[1].first_rank
            )
    else:
        ok = len(plan.sources) == 2 and len(plan.targets) == 1
        if ok:
            (t,) = plan.targets
            halves = sorted(s.first_rank for s in plan.sources)  # the target's two aligned halves
            ok = halves == [t.first_rank, t.first_rank + t.degree // 2] and all(
                s.node == t.node and 2 * s.degree == t.degree for s in plan.sources
            )
    if not ok:
        raise ValueError(f"malformed {plan.kind.name} plan: sources {plan.sources}, targets {plan.targets}")


def layout(trie: Trie, workers: WorkerTable, plan: ReconfigPlan) -> list[TargetLayout]:
    """The targets' holdings for ``plan`` (nothing is changed). Raises ValueError for a malformed plan."""
    _validate(plan, workers)
    if plan.kind == ReconfigKind.MERGE:
        (tg,) = plan.targets
        srcs = [workers.by_id[g.worker_id] for g in plan.sources]
        parts = [_split_marks(trie, w) for w in srcs]
        ranked = [
            (p, block_ranks(trie, w, p) + g.first_rank - tg.first_rank)
            for g, w, (p, _) in zip(plan.sources, srcs, parts, strict=True)
        ]
        phys, rank = _union(trie, tg, ranked)
        assigned = np.unique(np.concatenate([a for _, a in parts]))
        return [_finish(trie, tg, sum(w.capacity for w in srcs), phys, rank, assigned)]

    (sg,) = plan.sources
    parent = workers.by_id[sg.worker_id]
    phys, assigned = _split_marks(trie, parent)
    rank = block_ranks(trie, parent, phys) + sg.first_rank  # node-local ranks
    targets = sorted(plan.targets, key=lambda g: g.first_rank)
    caps = [parent.capacity * t.degree // sg.degree for t in targets]
    mine = [(rank >= t.first_rank) & (rank < t.first_rank + t.degree) for t in targets]
    chosen = _assign(trie, assigned, caps)
    return [
        _finish(trie, t, c, phys[k], rank[k] - t.first_rank, a)
        for t, c, k, a in zip(targets, caps, mine, chosen, strict=True)
    ]


def _union(
    trie: Trie, tg: WorkerGroup, parts: Sequence[tuple[np.ndarray, np.ndarray]]
) -> tuple[np.ndarray, np.ndarray]:
    """Physical rows of a merge target and their ranks in it, from the sources' (rows, target ranks): a row
    several sources have keeps the copy on its canonical target rank if any, else the one on the lowest rank."""
    rows = np.concatenate([p for p, _ in parts])
    rank = np.concatenate([r for _, r in parts])
    order = np.lexsort((rank, rank != _canonical(trie, rows, tg.degree), rows))
    rows, rank = rows[order], rank[order]
    first = np.ones(rows.size, bool)
    first[1:] = rows[1:] != rows[:-1]
    return rows[first], rank[first]


def _assign(trie: Trie, assigned: np.ndarray, caps: Sequence[int]) -> list[np.ndarray]:
    """Greedy split of the retained prefixes between children: leaves by recent demand (desc), each to the
    child it fits in (blocks not yet assigned there ≤ free room) with the least demand so far, then the one
    needing fewer new blocks, then the lower child. A prefix that fits neither child is not retained."""
    if assigned.size == 0:
        return [np.zeros(0, np.int64) for _ in caps]
    has_child = np.zeros(trie.size, bool)
    has_child[trie.parent[assigned]] = True
    leaves = assigned[~has_child[assigned]]
    demand = trie.access[:, leaves].sum(axis=0)
    order = np.lexsort((leaves, -trie.depth[leaves], -demand))
    sets: list[set[int]] = [set() for _ in caps]
    load = [0.0 for _ in caps]
    par = trie.parent
    for leaf, dem in zip(leaves[order].tolist(), demand[order].tolist(), strict=True):
        news: list[list[int]] = []
        for s in sets:
            new, row = [], leaf
            while row != ROOT and row not in s:  # each set is ancestor-closed: stop at the first member
                new.append(row)
                row = int(par[row])
            news.append(new)
        best = min(
            range(len(caps)),
            key=lambda k: (len(sets[k]) + len(news[k]) > caps[k], load[k], len(news[k]), k),
        )
        if len(sets[best]) + len(news[best]) > caps[best]:
            continue
        sets[best].update(news[best])
        load[best] += dem
    return [np.fromiter(sorted(s), np.int64, len(s)) for s in sets]


def traffic(trie: Trie, layouts: Sequence[TargetLayout]) -> float:
    """Expected reconciliation blocks: missing blocks of the targets, each weighted by its recent access
    (Σ over degrees of access[z, C]; blocks nobody reused lately weigh nothing)."""
    return float(sum(trie.access[:, t.missing].sum() for t in layouts))
