"""Cache metadata across a split or merge (DESIGN.md §2, §4).

Physical model (the torch engine's, mirrored by the simulator): inside a degree-C worker, block b of a prefix
(depth b+1) lives on rank ``b mod C``; reuse AllGathers the blocks, so a worker can reuse every prefix whose
blocks all lie somewhere in its ranks.

    parent CP4, ranks r0 r1 | r2 r3     prefix blocks  b0 b1 b2 b3 b4 b5 ...
                   lower    | upper     owner rank     r0 r1 r2 r3 r0 r1 ...
    lower child keeps b0 b1 b4 b5 ...  (valid: b0 b1; the rest of the prefix is pending until reconciled)
    upper child keeps b2 b3 b6 b7 ...  (valid: nothing — b0 is on the other half)

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


def _split_marks(trie: Trie, w: WorkerInfo) -> tuple[np.ndarray, np.ndarray]:
    """(physical rows, assigned rows) of a worker: holders|present and holders|pending."""
    rows = marks.nodes_of(trie, w)
    h = (trie.holders[rows, w.word] & w.bit) != 0
    p = (trie.pending[rows, w.word] & w.bit) != 0
    s = (trie.present[rows, w.word] & w.bit) != 0
    return rows[h | s], rows[h | p]


def _finish(trie: Trie, g: WorkerGroup, cap: int, phys: np.ndarray, assigned: np.ndarray) -> TargetLayout:
    valid = marks.closed_subset(trie, phys)
    pending = np.setdiff1d(assigned, valid)
    return TargetLayout(
        g, cap, valid, pending, np.setdiff1d(phys, valid), np.setdiff1d(pending, phys, assume_unique=True)
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
            ok = all(s.node == t.node and 2 * s.degree == t.degree for s in plan.sources)
    if not ok:
        raise ValueError(f"malformed {plan.kind.name} plan: sources {plan.sources}, targets {plan.targets}")


def layout(trie: Trie, workers: WorkerTable, plan: ReconfigPlan) -> list[TargetLayout]:
    """The targets' holdings for ``plan`` (nothing is changed). Raises ValueError for a malformed plan."""
    _validate(plan, workers)
    if plan.kind == ReconfigKind.MERGE:
        srcs = [workers.by_id[g.worker_id] for g in plan.sources]
        parts = [_split_marks(trie, w) for w in srcs]
        phys = np.unique(np.concatenate([p for p, _ in parts]))
        assigned = np.unique(np.concatenate([a for _, a in parts]))
        return [_finish(trie, plan.targets[0], sum(w.capacity for w in srcs), phys, assigned)]

    (sg,) = plan.sources
    parent = workers.by_id[sg.worker_id]
    phys, assigned = _split_marks(trie, parent)
    targets = sorted(plan.targets, key=lambda g: g.first_rank)
    caps = [parent.capacity * t.degree // sg.degree for t in targets]
    rank = sg.first_rank + (trie.depth[phys].astype(np.int64) - 1) % sg.degree
    phys_t = [phys[(rank >= t.first_rank) & (rank < t.first_rank + t.degree)] for t in targets]
    chosen = _assign(trie, assigned, caps)
    return [_finish(trie, t, c, p, a) for t, c, p, a in zip(targets, caps, phys_t, chosen, strict=True)]


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
