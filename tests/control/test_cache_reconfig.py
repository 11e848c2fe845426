"""Cache manager across split / merge: pending prefixes, reconciliation of only the missing blocks, ordinary
misses when no copy remains, merge union, reconciliation traffic of candidate operations."""

from __future__ import annotations

import pytest

from tests.control.cache_commit import commit, record
from vertumnus.cache import reconfigure
from vertumnus.cache.invariants import check_cache
from vertumnus.cache.manager import CacheManager
from vertumnus.config import CacheConfig
from vertumnus.cost_model import CostModel, CostProfile, DegreeProfile
from vertumnus.types import CacheReport, CacheReportKind, PrefixMatch, ReconfigKind, ReconfigPlan, WorkerGroup

P = tuple(range(1, 11))  # 10 blocks: block b on parent rank b mod 8
Q = (21, 22, 23)
PARENT = WorkerGroup(10, 0, 0, 8)
LO, HI = WorkerGroup(11, 0, 0, 4), WorkerGroup(12, 0, 4, 4)
SPLIT = ReconfigPlan(ReconfigKind.SPLIT, (PARENT,), (LO, HI), epoch=2)


def _manager(parent_capacity: int = 80) -> CacheManager:
    prof = CostProfile(degrees={c: DegreeProfile(d=0.1, a=0.001, b=0.0, c=0.004, alpha=0.0) for c in (4, 8)})
    m = CacheManager(CacheConfig(block_tokens=10), CostModel(prof), [4, 8])
    m.add_worker(10, 8, 0, parent_capacity)
    m.apply_report(CacheReport(10, CacheReportKind.STORED, P))
    m.apply_report(CacheReport(10, CacheReportKind.STORED, Q))
    for _ in range(3):
        record(m, P, m.lookup(P), 100, 10, 8)  # P: demand 3 per block
    record(m, Q, m.lookup(Q), 30, 10, 8)  # Q: demand 1
    return m


def test_split_keeps_each_childs_rank_half_and_assigns_prefixes_by_demand() -> None:
    m = _manager()
    assert m.reconcile_traffic(SPLIT) == 4 * 3.0 + 3 * 1.0  # P's blocks 5-8 at LO, all of Q at HI
    m.on_reconfigure(SPLIT)
    assert sorted(m.workers.by_id) == [11, 12]
    # LO holds blocks b with b mod 8 < 4 (keys 1-4, 9, 10) and gets P (more demand); HI gets Q.
    assert m.lookup(P) == PrefixMatch(10, {11: 4}, {11: 10})
    assert m.lookup(Q) == PrefixMatch(3, {11: 3}, {11: 3, 12: 3})  # Q's 3 blocks all lie on LO's ranks
    assert m.cached_blocks(11) == 9 and m.cached_blocks(12) == 4  # physically: P 1-4, 9, 10 + Q | P 5-8
    assert m.workers.by_id[11].free == 40 - 9
    check_cache(m)


def test_first_reuse_of_a_pending_prefix_copies_only_the_missing_blocks_from_the_sibling() -> None:
    m = _manager()
    m.on_reconfigure(SPLIT)
    match = m.lookup(P)
    op = commit(m, P, 11, match=match, first=False).op
    assert op is not None
    assert (op.kind.name, op.dst_worker, op.src_worker, op.keys, op.first_missing) == ("RECONCILE", 11, 12, P, 4)
    assert not op.inter_degree and not op.inter_node
    assert m.stats()["reconcile_blocks"] == 4  # keys 5-8; 9 and 10 are already on LO's ranks
    assert commit(m, P, 11, match=match, first=False).op is None  # already in flight: no second copy
    assert m.lookup(P).held_blocks == {11: 4}  # pending is not reusable until confirmed
    m.apply_report(CacheReport(11, CacheReportKind.STORED, P[4:], P[3], op.op_id))
    assert m.lookup(P) == PrefixMatch(10, {11: 10}, {11: 10})
    assert m.stats()["reconciliations_confirmed"] == 1
    check_cache(m)


def test_a_valid_copy_is_preferred_as_reconciliation_source() -> None:
    m = _manager()
    m.on_reconfigure(SPLIT)
    op = commit(m, Q, 12, match=m.lookup(Q), first=False).op
    assert op is not None
    assert (op.src_worker, op.keys, op.first_missing) == (11, Q, 0)
    check_cache(m)


def test_no_copy_left_makes_the_pending_part_an_ordinary_miss() -> None:
    m = _manager()
    m.on_reconfigure(SPLIT)
    m.apply_report(CacheReport(12, CacheReportKind.REMOVED, P[4:8]))  # HI evicts its stripe of P
    assert commit(m, P, 11, match=m.lookup(P), first=False).op is None
    assert m.lookup(P) == PrefixMatch(4, {11: 4}, {11: 4})
    assert m.stats()["reconcile_misses"] == 1
    assert m.cached_blocks(11) == 9  # blocks 9, 10 stay physically cached
    check_cache(m)


def test_merging_split_siblings_back_restores_valid_prefixes() -> None:
    m = _manager()
    m.on_reconfigure(SPLIT)
    merge = ReconfigPlan(ReconfigKind.MERGE, (LO, HI), (WorkerGroup(20, 0, 0, 8),), epoch=3)
    assert m.reconcile_traffic(merge) == 0.0
    m.on_reconfigure(merge)
    assert sorted(m.workers.by_id) == [20]
    assert m.lookup(P) == PrefixMatch(10, {20: 10}, {20: 10})
    assert m.lookup(Q) == PrefixMatch(3, {20: 3}, {20: 3})
    assert m.cached_blocks(20) == 13 and m.workers.by_id[20].free == 80 - 13
    check_cache(m)


def test_merge_marks_blocks_no_source_has_as_pending() -> None:
    m = _manager()
    m.on_reconfigure(SPLIT)
    m.apply_report(CacheReport(12, CacheReportKind.REMOVED, P[4:8]))
    merge = ReconfigPlan(ReconfigKind.MERGE, (LO, HI), (WorkerGroup(20, 0, 0, 8),), epoch=3)
    assert m.reconcile_traffic(merge) == 4 * 3.0  # P's keys 5-8, demand 3 each
    m.on_reconfigure(merge)
    assert m.lookup(P) == PrefixMatch(10, {20: 4}, {20: 10})
    assert commit(m, P, 20, match=m.lookup(P), first=False).op is None  # nobody has blocks 5-8
    assert m.lookup(P) == PrefixMatch(4, {20: 4}, {20: 4})
    check_cache(m)


def test_a_prefix_too_large_for_either_child_is_not_retained() -> None:
    m = _manager(parent_capacity=16)  # children hold 8 blocks each: P (10) fits neither, Q goes to LO
    m.on_reconfigure(SPLIT)
    assert m.lookup(P) == PrefixMatch(4, {11: 4}, {11: 4})  # the physically complete head stays valid
    assert m.lookup(Q) == PrefixMatch(3, {11: 3}, {11: 3})
    check_cache(m)


def test_malformed_plans_are_rejected_without_changes() -> None:
    m = _manager()
    bad_degree = ReconfigPlan(ReconfigKind.SPLIT, (PARENT,), (LO, WorkerGroup(12, 0, 4, 2)), epoch=2)
    with pytest.raises(ValueError, match="malformed SPLIT"):
        m.on_reconfigure(bad_degree)
    m.on_reconfigure(SPLIT)
    not_halves = ReconfigPlan(ReconfigKind.MERGE, (LO, HI), (WorkerGroup(20, 0, 4, 8),), epoch=3)
    with pytest.raises(ValueError, match="malformed MERGE"):
        m.reconcile_traffic(not_halves)  # sources must be the target's two aligned halves
    m = _manager()
    unknown = ReconfigPlan(ReconfigKind.MERGE, (LO, HI), (WorkerGroup(20, 0, 0, 8),), epoch=2)
    with pytest.raises(ValueError, match="not registered"):
        m.reconcile_traffic(unknown)
    assert sorted(m.workers.by_id) == [10]
    assert m.lookup(P).held_blocks == {10: 10}
    check_cache(m)


# -- ownership across merge → split (blocks stay on the ranks that computed them) ------------------------------
A, B, C = (1, 2, 3, 4), (11, 12, 13, 14), (21, 22, 23, 24)
L2, U2, M4 = WorkerGroup(1, 0, 0, 2), WorkerGroup(2, 0, 2, 2), WorkerGroup(3, 0, 0, 4)
L2b, U2b = WorkerGroup(4, 0, 0, 2), WorkerGroup(5, 0, 2, 2)


def _ranks(m: CacheManager, wid: int) -> dict[int, int]:
    """key -> rank inside the worker, for every block the manager believes it physically has."""
    return reconfigure.block_layout(m.trie, m.workers.by_id[wid])


def _merged_after_cp2_cp2() -> CacheManager:
    """A computed on the lower CP2, C on the upper CP2, merge to CP4, B computed there; then C reused 3×, A 2×,
    B 1× on the CP4 (the demand that orders the split's assignment: C → lower child, A and B → upper)."""
    prof = CostProfile(degrees={c: DegreeProfile(d=0.1, a=0.001, b=0.0, c=0.004, alpha=0.0) for c in (2, 4)})
    m = CacheManager(CacheConfig(block_tokens=10), CostModel(prof), [2, 4])
    m.add_worker(1, 2, 0, 40)
    m.add_worker(2, 2, 0, 40)
    m.apply_report(CacheReport(1, CacheReportKind.STORED, A))
    m.apply_report(CacheReport(2, CacheReportKind.STORED, C))
    merge = ReconfigPlan(ReconfigKind.MERGE, (L2, U2), (M4,), epoch=2)
    assert m.reconcile_traffic(merge) == 0.0
    m.on_reconfigure(merge)
    m.apply_report(CacheReport(3, CacheReportKind.STORED, B))
    for keys, n in ((C, 3), (A, 2), (B, 1)):
        for _ in range(n):
            record(m, keys, m.lookup(keys), 45, 3, 4)
    return m


def test_a_merge_keeps_blocks_on_the_ranks_that_computed_them() -> None:
    m = _merged_after_cp2_cp2()
    #            r0        r1        r2        r3
    #  A (L2)    A0 A2     A1 A3                          displaced: canonical would be A2→r2, A3→r3
    #  C (U2)                        C0 C2     C1 C3      displaced: C0→r0, C1→r1
    #  B (M4)    B0        B1        B2        B3
    assert _ranks(m, 3) == {1: 0, 2: 1, 3: 0, 4: 1, 21: 2, 22: 3, 23: 2, 24: 3, 11: 0, 12: 1, 13: 2, 14: 3}
    assert m.workers.by_id[3].displaced == {m.trie.index[k]: r for k, r in ((3, 0), (4, 1), (21, 2), (22, 3))}
    for keys in (A, B, C):
        assert m.lookup(keys) == PrefixMatch(4, {3: 4}, {3: 4})
    check_cache(m)


def test_split_after_merge_gives_each_child_the_blocks_it_physically_has() -> None:
    m = _merged_after_cp2_cp2()
    split = ReconfigPlan(ReconfigKind.SPLIT, (M4,), (L2b, U2b), epoch=3)
    # missing at the new owners, weighted by access: C (3 per block) at the lower child, A (2) and B0, B1 (1)
    # at the upper child
    assert m.reconcile_traffic(split) == 4 * 3.0 + 4 * 2.0 + 2 * 1.0
    m.on_reconfigure(split)
    # The lower child has all of A (computed there before the merge) and B's first stripe; the upper child all
    # of C and B's second stripe. C is assigned to the lower child, A and B to the upper one.
    assert _ranks(m, 4) == {1: 0, 2: 1, 3: 0, 4: 1, 11: 0, 12: 1}
    assert _ranks(m, 5) == {21: 0, 22: 1, 23: 0, 24: 1, 13: 0, 14: 1}
    assert m.workers.by_id[4].displaced == {} and m.workers.by_id[5].displaced == {}
    assert m.lookup(A) == PrefixMatch(4, {4: 4}, {4: 4, 5: 4})
    assert m.lookup(C) == PrefixMatch(4, {5: 4}, {4: 4, 5: 4})
    assert m.lookup(B) == PrefixMatch(4, {4: 2}, {4: 2, 5: 4})
    assert m.cached_blocks(4) == m.cached_blocks(5) == 6
    # reconciliation copies exactly what each child lacks, from the sibling that physically has it
    ops = [commit(m, k, w, match=m.lookup(k), first=False).op for k, w in ((C, 4), (A, 5), (B, 5))]
    assert [(o.dst_worker, o.src_worker, o.keys, o.first_missing) for o in ops if o] == [
        (4, 5, C, 0),
        (5, 4, A, 0),
        (5, 4, B, 0),
    ]
    assert m.stats()["reconcile_blocks"] == 4 + 4 + 2
    assert commit(m, A, 4, match=m.lookup(A), first=False).op is None  # valid at the lower child: nothing to copy
    check_cache(m)


def test_repeated_merge_and_split_return_to_canonical_halves() -> None:
    m = _merged_after_cp2_cp2()
    m.on_reconfigure(ReconfigPlan(ReconfigKind.SPLIT, (M4,), (L2b, U2b), epoch=3))
    for keys, w in ((C, 4), (A, 5), (B, 5)):
        op = commit(m, keys, w, match=m.lookup(keys), first=False).op
        assert op is not None
        # the engine imports the blocks it lacked on their canonical ranks and confirms the whole missing part
        m.apply_report(CacheReport(w, CacheReportKind.STORED, keys, None, op.op_id))
    assert _ranks(m, 4) == {1: 0, 2: 1, 3: 0, 4: 1, 11: 0, 12: 1, 21: 0, 22: 1, 23: 0, 24: 1}
    assert _ranks(m, 5) == {21: 0, 22: 1, 23: 0, 24: 1, 13: 0, 14: 1, 1: 0, 2: 1, 3: 0, 4: 1, 11: 0, 12: 1}
    # merge again: every key both children hold keeps its copy on the canonical CP4 rank (depth mod 4)
    m4 = WorkerGroup(6, 0, 0, 4)
    m.on_reconfigure(ReconfigPlan(ReconfigKind.MERGE, (L2b, U2b), (m4,), epoch=4))
    assert _ranks(m, 6) == {k: i for keys in (A, B, C) for i, k in enumerate(keys)}
    assert m.workers.by_id[6].displaced == {}
    # and split again: the classic halves, each prefix pending at its assigned child
    m.on_reconfigure(ReconfigPlan(ReconfigKind.SPLIT, (m4,), (WorkerGroup(7, 0, 0, 2), WorkerGroup(8, 0, 2, 2)), 5))
    assert _ranks(m, 7) == {k: i for keys in (A, B, C) for i, k in enumerate(keys[:2])}
    assert _ranks(m, 8) == {k: i for keys in (A, B, C) for i, k in enumerate(keys[2:])}
    for keys in (A, B, C):
        assert m.lookup(keys).held_blocks == {7: 2}
    check_cache(m)


def test_losing_a_displaced_block_forgets_its_rank() -> None:
    m = _merged_after_cp2_cp2()
    m.apply_report(CacheReport(3, CacheReportKind.REMOVED, (A[2],)))  # A2 and A3 go (a prefix loses its tail)
    assert set(m.workers.by_id[3].displaced) == {m.trie.index[21], m.trie.index[22]}
    m.apply_report(CacheReport(3, CacheReportKind.STORED, A[2:], A[1]))  # recomputed by the CP4: canonical
    assert {k: r for k, r in _ranks(m, 3).items() if k in A} == {1: 0, 2: 1, 3: 2, 4: 3}
    m.apply_report(CacheReport(3, CacheReportKind.CLEARED))
    assert m.workers.by_id[3].displaced == {} and _ranks(m, 3) == {}
    check_cache(m)
