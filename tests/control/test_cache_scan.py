"""Cache manager scan: inter / intra / reclaim candidates, ranking and bounds, destination / source / victim
choice, footprints, the confirm protocol, outstanding-op bookkeeping and pins."""

from __future__ import annotations

import pytest

from tests.control.cache_commit import commit, record
from vertumnus.cache.invariants import check_cache
from vertumnus.cache.manager import CacheManager
from vertumnus.cache.stats import node_stats
from vertumnus.config import CacheConfig
from vertumnus.cost_model import CostModel, CostProfile, DegreeProfile
from vertumnus.types import CacheOp, CacheOpKind, CacheReport, CacheReportKind, PrefixMatch

PROFILE = CostProfile(
    degrees={
        4: DegreeProfile(d=0.1, a=0.001, b=0.0005, c=0.004, alpha=0.0),
        8: DegreeProfile(d=0.2, a=0.002, b=0.0005, c=0.004, alpha=1e-4),
    }
)


def _e8(r: float, p: float) -> float:
    return 0.2 + 0.002 * r + 0.0005 * p + (0.004 * r + 1e-4 * (r * p + r * (r + 1) / 2)) / 8


def _manager(max_ops: int, **cfg: object) -> CacheManager:
    # The paper's threshold scan (cache.policy: rules; the default queue_aware skips the intra list and reclaims
    # only under pressure: tests/control/test_cache_queue_aware.py).
    c = CacheConfig(
        block_tokens=10,
        policy="rules",
        theta_inter=0.01,
        theta_intra=3.0,
        theta_reclaim=1.0,
        max_ops_per_scan=max_ops,
        **cfg,  # type: ignore[arg-type]
    )
    return CacheManager(c, CostModel(PROFILE), [4, 8])


def _stored(m: CacheManager, wid: int, keys: tuple[int, ...], parent: int | None = None, op: int | None = None):  # type: ignore[no-untyped-def]
    m.apply_report(CacheReport(wid, CacheReportKind.STORED, keys, parent, op))


def _place(m: CacheManager, keys: tuple[int, ...], wid: int, pref: int, times: int = 1) -> None:
    for _ in range(times):
        record(m, keys, m.lookup(keys), 10 * len(keys), wid, pref)


def _brief(ops: list[CacheOp]) -> list[tuple[object, ...]]:
    return [
        (op.op_id, op.kind.name, op.dst_worker, op.src_worker, op.keys, op.first_missing, op.inter_degree,
         op.inter_node)
        for op in ops
    ]  # fmt: skip


# -- intra ------------------------------------------------------------------------------------------------------
def _intra_pool(max_ops: int) -> CacheManager:
    """Four hot CP4 prefixes: A (11,12) at w1, B (21) at w2, C (31,32,33) at w1+w2, D (41) at w3 (capacity 2)."""
    m = _manager(max_ops)
    m.add_worker(1, 4, 0, 100)
    m.add_worker(2, 4, 0, 100)
    m.add_worker(3, 4, 1, 2)
    m.add_worker(4, 8, 1, 100)
    _stored(m, 1, (11, 12))
    _stored(m, 2, (21,))
    _stored(m, 1, (31, 32, 33))
    _stored(m, 2, (31, 32, 33))
    _stored(m, 3, (41,))
    _place(m, (11, 12), 1, 4, times=8)  # access/r = 8
    _place(m, (21,), 2, 4, times=6)  # 6
    _place(m, (31, 32, 33), 1, 4, times=4)
    _place(m, (31, 32, 33), 2, 4, times=4)  # 8 / 2 replicas = 4
    _place(m, (41,), 3, 4, times=4)  # 4: near-tie with C, smaller footprint
    return m


QUEUE = {1: 0.2, 2: 1.0, 3: 0.5, 4: 0.0}


def test_intra_ranking_destinations_and_sources() -> None:
    m = _intra_pool(max_ops=4)
    ops = m.scan(5.0, QUEUE)
    assert _brief(ops) == [
        # A: w3 has the lower queue but only 1 free block for 2 → w2. Chain (11, 12) is one op.
        (1, "REPLICATE", 2, 1, (11, 12), 0, False, False),
        # B: w1 (q 0.2) beats w3 (q 0.5); both fit.
        (2, "REPLICATE", 1, 2, (21,), 0, False, False),
        # D before C: same access/r (4.0), footprint 1 < 3.
        (3, "REPLICATE", 1, 3, (41,), 0, False, True),
        # C: only w3 lacks it (too small, still the only candidate); source: the less loaded holder w1.
        (4, "REPLICATE", 3, 1, (31, 32, 33), 0, False, True),
    ]
    assert m.stats()["intra_ordered"] == 4
    assert m.stats()["inter_ordered"] == 0 and m.stats()["reclamations_ordered"] == 0
    check_cache(m)


def test_scan_orders_at_most_max_ops_per_list() -> None:
    m = _intra_pool(max_ops=2)
    assert [op.keys for op in m.scan(5.0, QUEUE)] == [(11, 12), (21,)]
    check_cache(m)


def test_in_flight_copies_are_not_ordered_twice_until_they_fail() -> None:
    m = _intra_pool(max_ops=2)
    first = m.scan(5.0, QUEUE)
    # Decayed by half: A 4 > 3 still hot, but its copy is in flight; B 3 is not > 3.
    assert m.scan(10.0, QUEUE) == []
    assert m.op_failed(first[0].op_id, "copy failed") is first[0]
    assert m.op_failed(first[0].op_id, "again") is None
    _place(m, (11, 12), 1, 4, times=6)  # A: 2 + 6 = 8
    again = m.scan(15.0, QUEUE)
    assert [(op.op_id, op.keys, op.dst_worker) for op in again] == [(3, (11, 12), 2)]
    assert m.stats()["ops_failed"] == 1
    check_cache(m)


def test_replica_is_visible_only_after_the_confirming_report() -> None:
    m = _intra_pool(max_ops=1)
    (op,) = m.scan(5.0, QUEUE)
    assert m.lookup((11, 12)).held_blocks == {1: 2}
    _stored(m, 3, (11, 12), op=op.op_id)  # wrong worker: applies as its own store, confirms nothing
    assert m.book.outstanding() == [op]
    m.apply_report(CacheReport(3, CacheReportKind.REMOVED, (11,)))
    _stored(m, 2, (11, 12), op=op.op_id)
    assert m.lookup((11, 12)) == PrefixMatch(2, {1: 2, 2: 2}, {1: 2, 2: 2})
    assert m.book.outstanding() == []
    assert m.stats()["replications_confirmed"] == 1
    assert m.workers.by_id[2].reserved == 0
    check_cache(m)


def test_removing_a_worker_forgets_its_ops() -> None:
    m = _intra_pool(max_ops=4)
    m.scan(5.0, QUEUE)
    m.remove_worker(3)  # source of op 3, destination of op 4
    assert [op.op_id for op in m.book.outstanding()] == [1, 2]
    check_cache(m)


# -- inter ------------------------------------------------------------------------------------------------------


def test_inter_ranking_by_missed_per_copied_block_and_choices() -> None:
    m = _manager(max_ops=2)
    m.add_worker(1, 4, 0, 100)
    m.add_worker(2, 4, 0, 100)
    m.add_worker(3, 4, 1, 100)
    m.add_worker(4, 8, 1, 100)
    m.add_worker(5, 8, 0, 100)
    _stored(m, 1, (51, 52, 53))  # E
    _stored(m, 4, (51,))  # the CP8 worker 4 already retains E's first block
    _stored(m, 2, (61,))  # F, at w2 (node 0) and w3 (node 1)
    _stored(m, 3, (61,))
    _stored(m, 3, (71, 72))  # G
    _place(m, (51, 52, 53), 1, 8, times=2)
    _place(m, (51, 52, 53), 4, 8)
    _place(m, (61,), 2, 8, times=2)
    _place(m, (61,), 3, 8)
    _place(m, (71, 72), 3, 8, times=3)
    d53 = 3 * (_e8(10, 20) - _e8(1, 29))  # E's chain 52-53 collapses into 53; footprint 2 at worker 4
    d61 = 3 * (_e8(10, 0) - _e8(1, 9))
    d72 = 3 * (_e8(10, 10) - _e8(1, 19))
    assert node_stats(m.trie, m.degrees, 53)[1][8] == pytest.approx(d53)
    assert d61 / 1 > d53 / 2 > d72 / 2  # the ranking the scan must produce
    ops = m.scan(5.0, {1: 0.0, 2: 1.0, 3: 0.0, 4: 0.3, 5: 0.1})
    assert _brief(ops) == [
        # F: both CP8 workers lack it entirely → lower queue (w5, node 0); source on the same node (w2).
        (1, "REPLICATE", 5, 2, (61,), 0, True, False),
        # E: w4 retains block 51 → copy only 52-53 there, despite its higher queue.
        (2, "REPLICATE", 4, 1, (51, 52, 53), 1, True, True),
    ]
    assert m.stats()["inter_ordered"] == 2


# -- reclaim ----------------------------------------------------------------------------------------------------
def _reclaim_pool() -> CacheManager:
    m = _manager(max_ops=3)
    for wid, deg in ((1, 4), (2, 4), (3, 4), (4, 8)):
        m.add_worker(wid, deg, 0, 100)
    for wid in (1, 2, 3):
        _stored(m, wid, (81, 82))  # H at three CP4 workers
    _stored(m, 1, (101, 102, 103, 104))  # pressure: w2 10/100 > w1 6/100 > w3 2/100
    _stored(m, 2, tuple(range(201, 209)))
    _stored(m, 3, (91,))  # I at w3 (CP4) and w4 (CP8)
    _stored(m, 4, (91,))
    _place(m, (81, 82), 1, 4)  # access 1 < 3 replicas × 1
    _place(m, (91,), 3, 4)  # access at CP8 stays 0 < 1 × 1
    return m


def test_reclaim_ranking_and_victims() -> None:
    m = _reclaim_pool()
    commit(m, (81, 82, 83), 2, first=False)  # w2 uses H for a queued request (pinned)
    ops = m.scan(5.0, {})
    assert _brief(ops) == [
        (1, "RECLAIM", 4, None, (91,), 0, False, False),  # score 0 first; the only CP8 holder
        (2, "RECLAIM", 1, None, (81, 82), 1, False, False),  # w2 pinned → next highest pressure: w1
    ]  # block 81: every holder keeps 82 below it → no victim
    assert m.stats()["reclamations_ordered"] == 2
    check_cache(m)


def test_unpinned_highest_pressure_holder_is_the_victim() -> None:
    m = _reclaim_pool()
    pin = commit(m, (81, 82), 2, first=False).pin
    assert pin is not None
    m.release(pin)
    ops = m.scan(5.0, {})
    assert [(op.dst_worker, op.keys) for op in ops] == [(4, (91,)), (2, (81, 82))]
    check_cache(m)


def test_reclaimed_replica_leaves_holders_only_when_deletion_is_confirmed() -> None:
    m = _reclaim_pool()
    ops = m.scan(5.0, {})
    rec = ops[0]
    assert m.lookup((91,)).held_blocks == {3: 1, 4: 1}
    m.apply_report(CacheReport(4, CacheReportKind.REMOVED, (91,), op_id=rec.op_id))
    assert m.lookup((91,)).held_blocks == {3: 1}
    assert m.stats()["reclamations_confirmed"] == 1
    assert m.cached_blocks(4) == 0
    # A second scan does not order a reclaim already in flight (81, 82 at w2) again.
    assert all(op.keys != (81, 82) or op.dst_worker != 2 for op in m.scan(10.0, {}))
    check_cache(m)


def test_the_last_valid_copy_is_left_to_the_engines_lru() -> None:
    m = _manager(max_ops=3)
    m.add_worker(1, 4, 0, 100)
    m.add_worker(2, 4, 0, 100)
    _stored(m, 1, (7,))
    _place(m, (7,), 1, 4)
    assert m.scan(5.0, {}) == []  # access 1: not < 1
    assert m.scan(10.0, {}) == []  # access 0.5 < 1, but w1 has the only copy
    _stored(m, 2, (7,))
    _place(m, (7,), 1, 4)  # access 1.5 < 2 replicas × 1
    assert [(op.kind, op.dst_worker) for op in m.scan(15.0, {})] == [(CacheOpKind.RECLAIM, 1)]
    check_cache(m)


# -- replicas without statistics ----------------------------------------------------------------------------------
def test_a_prefix_computed_twice_and_never_reused_is_reclaimed_block_by_block() -> None:
    """Two workers computed (7, 8) independently; nobody reused it since, so it has no statistics: access 0 <
    2 replicas × θ_reclaim at CP4. Reclamation takes the deepest block first (the victim keeps nothing below
    it), then its parent once the deletion is confirmed, and stops at the last copy."""
    m = _manager(max_ops=3)
    m.add_worker(1, 4, 0, 100)
    m.add_worker(2, 4, 0, 100)
    _stored(m, 1, (51,))  # pressure: w1 3/100 > w2 2/100
    _stored(m, 1, (7, 8))
    _stored(m, 2, (7, 8))
    assert node_stats(m.trie, m.degrees, 8) == ({4: 0.0, 8: 0.0}, {4: 0.0, 8: 0.0})
    ops = m.scan(5.0, {})
    assert _brief(ops) == [(1, "RECLAIM", 1, None, (7, 8), 1, False, False)]  # block 7: both keep 8 below
    m.apply_report(CacheReport(1, CacheReportKind.REMOVED, (8,), op_id=ops[0].op_id))
    ops = m.scan(10.0, {})
    assert _brief(ops) == [(2, "RECLAIM", 1, None, (7,), 0, False, False)]  # w2 keeps 8 below 7
    m.apply_report(CacheReport(1, CacheReportKind.REMOVED, (7,), op_id=ops[0].op_id))
    assert m.lookup((7, 8)).held_blocks == {2: 2}
    assert m.scan(15.0, {}) == []  # one copy left: the engines' LRU decides
    assert m.stats()["active_nodes"] == 0 and m.stats()["reclamations_confirmed"] == 2
    check_cache(m)


def test_a_replica_loses_its_last_block_below_and_becomes_a_candidate_again() -> None:
    m = _manager(max_ops=3)
    m.add_worker(1, 4, 0, 100)
    m.add_worker(2, 4, 0, 100)
    _stored(m, 1, (1, 2, 3))
    _stored(m, 2, (1, 2, 4))
    assert m.scan(5.0, {}) == []  # 1 and 2 have two copies, but each holder keeps a block below them
    assert m.stats()["active_nodes"] == 0  # nothing to look at until that changes
    m.apply_report(CacheReport(2, CacheReportKind.REMOVED, (4,)))  # w2's LRU evicts block 4
    assert m.stats()["active_nodes"] == 1
    assert _brief(m.scan(10.0, {})) == [(1, "RECLAIM", 2, None, (1, 2), 1, False, False)]
    check_cache(m)


def test_replicas_no_victim_can_give_up_do_not_crowd_out_one_that_can() -> None:
    """Twenty shared blocks (a system prompt) held by two workers that each keep their own continuation below
    it rank first (access 0, deeper) but can never yield a victim; the cut to ATTEMPTS_PER_OP × max_ops (16)
    candidates must not lose the reclaimable duplicate (7,) behind them."""
    m = _manager(max_ops=1)
    m.add_worker(1, 4, 0, 100)
    m.add_worker(2, 4, 0, 100)
    trunk = tuple(range(101, 121))
    _stored(m, 1, (*trunk, 121))
    _stored(m, 2, (*trunk, 131))
    _stored(m, 1, (7,))
    _stored(m, 2, (7,))
    assert m.stats()["active_nodes"] == 21
    assert _brief(m.scan(5.0, {})) == [(1, "RECLAIM", 1, None, (7,), 0, False, False)]
    assert m.stats()["active_nodes"] == 1  # the trunk leaves the active set until a holder loses its block below
    check_cache(m)
