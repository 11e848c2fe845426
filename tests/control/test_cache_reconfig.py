"""Cache manager across split / merge: pending prefixes, reconciliation of only the missing blocks, ordinary
misses when no copy remains, merge union, reconciliation traffic of candidate operations."""

from __future__ import annotations

import pytest

from vertumnus.cache.manager import CacheManager
from vertumnus.config import CacheConfig
from vertumnus.profiling.cost_model import CostModel, CostProfile, DegreeProfile
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
        m.record_placement(P, m.match(P), 100, 10, 8)  # P: demand 3 per block
    m.record_placement(Q, m.match(Q), 30, 10, 8)  # Q: demand 1
    return m


def test_split_keeps_each_childs_rank_half_and_assigns_prefixes_by_demand() -> None:
    m = _manager()
    assert m.reconcile_traffic(SPLIT) == 4 * 3.0 + 3 * 1.0  # P's blocks 5-8 at LO, all of Q at HI
    m.on_reconfigure(SPLIT)
    assert m.worker_ids == [11, 12]
    # LO holds blocks b with b mod 8 < 4 (keys 1-4, 9, 10) and gets P (more demand); HI gets Q.
    assert m.match(P) == PrefixMatch(10, {11: 4}, {11: 10})
    assert m.match(Q) == PrefixMatch(3, {11: 3}, {11: 3, 12: 3})  # Q's 3 blocks all lie on LO's ranks
    assert m.cached_blocks(11) == 9 and m.cached_blocks(12) == 4  # physically: P 1-4, 9, 10 + Q | P 5-8
    assert m.free_blocks(11) == 40 - 9
    m.check_invariants()


def test_first_reuse_of_a_pending_prefix_copies_only_the_missing_blocks_from_the_sibling() -> None:
    m = _manager()
    m.on_reconfigure(SPLIT)
    match = m.match(P)
    op = m.plan_reconcile(P, 11, match)
    assert op is not None
    assert (op.kind.name, op.dst_worker, op.src_worker, op.keys, op.first_missing) == ("RECONCILE", 11, 12, P, 4)
    assert not op.inter_degree and not op.inter_node
    assert m.stats()["reconcile_blocks"] == 4  # keys 5-8; 9 and 10 are already on LO's ranks
    assert m.plan_reconcile(P, 11, match) is None  # already in flight: no second copy
    assert m.match(P).held_blocks == {11: 4}  # pending is not reusable until confirmed
    m.apply_report(CacheReport(11, CacheReportKind.STORED, P[4:], P[3], op.op_id))
    assert m.match(P) == PrefixMatch(10, {11: 10}, {11: 10})
    assert m.stats()["reconciliations_confirmed"] == 1
    m.check_invariants()


def test_a_valid_copy_is_preferred_as_reconciliation_source() -> None:
    m = _manager()
    m.on_reconfigure(SPLIT)
    op = m.plan_reconcile(Q, 12, m.match(Q))
    assert op is not None
    assert (op.src_worker, op.keys, op.first_missing) == (11, Q, 0)
    m.check_invariants()


def test_no_copy_left_makes_the_pending_part_an_ordinary_miss() -> None:
    m = _manager()
    m.on_reconfigure(SPLIT)
    m.apply_report(CacheReport(12, CacheReportKind.REMOVED, P[4:8]))  # HI evicts its stripe of P
    assert m.plan_reconcile(P, 11, m.match(P)) is None
    assert m.match(P) == PrefixMatch(4, {11: 4}, {11: 4})
    assert m.stats()["reconcile_misses"] == 1
    assert m.cached_blocks(11) == 9  # blocks 9, 10 stay physically cached
    m.check_invariants()


def test_merging_split_siblings_back_restores_valid_prefixes() -> None:
    m = _manager()
    m.on_reconfigure(SPLIT)
    merge = ReconfigPlan(ReconfigKind.MERGE, (LO, HI), (WorkerGroup(20, 0, 0, 8),), epoch=3)
    assert m.reconcile_traffic(merge) == 0.0
    m.on_reconfigure(merge)
    assert m.worker_ids == [20]
    assert m.match(P) == PrefixMatch(10, {20: 10}, {20: 10})
    assert m.match(Q) == PrefixMatch(3, {20: 3}, {20: 3})
    assert m.cached_blocks(20) == 13 and m.free_blocks(20) == 80 - 13
    m.check_invariants()


def test_merge_marks_blocks_no_source_has_as_pending() -> None:
    m = _manager()
    m.on_reconfigure(SPLIT)
    m.apply_report(CacheReport(12, CacheReportKind.REMOVED, P[4:8]))
    merge = ReconfigPlan(ReconfigKind.MERGE, (LO, HI), (WorkerGroup(20, 0, 0, 8),), epoch=3)
    assert m.reconcile_traffic(merge) == 4 * 3.0  # P's keys 5-8, demand 3 each
    m.on_reconfigure(merge)
    assert m.match(P) == PrefixMatch(10, {20: 4}, {20: 10})
    assert m.plan_reconcile(P, 20, m.match(P)) is None  # nobody has blocks 5-8
    assert m.match(P) == PrefixMatch(4, {20: 4}, {20: 4})
    m.check_invariants()


def test_a_prefix_too_large_for_either_child_is_not_retained() -> None:
    m = _manager(parent_capacity=16)  # children hold 8 blocks each: P (10) fits neither, Q goes to LO
    m.on_reconfigure(SPLIT)
    assert m.match(P) == PrefixMatch(4, {11: 4}, {11: 4})  # the physically complete head stays valid
    assert m.match(Q) == PrefixMatch(3, {11: 3}, {11: 3})
    m.check_invariants()


def test_malformed_plans_are_rejected_without_changes() -> None:
    m = _manager()
    bad_degree = ReconfigPlan(ReconfigKind.SPLIT, (PARENT,), (LO, WorkerGroup(12, 0, 4, 2)), epoch=2)
    with pytest.raises(ValueError, match="malformed SPLIT"):
        m.on_reconfigure(bad_degree)
    unknown = ReconfigPlan(ReconfigKind.MERGE, (LO, HI), (WorkerGroup(20, 0, 0, 8),), epoch=2)
    with pytest.raises(ValueError, match="not registered"):
        m.reconcile_traffic(unknown)
    assert m.worker_ids == [10]
    assert m.match(P).held_blocks == {10: 10}
    m.check_invariants()
