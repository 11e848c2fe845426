"""Cache manager statistics: access on the reused path, missed benefit Δ(z) at the preferred degree, decay and
pruning of the active set."""

from __future__ import annotations

import pytest

from tests.control.cache_commit import commit, record
from vertumnus.cache.invariants import check_cache
from vertumnus.cache.manager import CacheManager
from vertumnus.cache.stats import node_stats
from vertumnus.config import CacheConfig
from vertumnus.cost_model import CostModel, CostProfile, DegreeProfile
from vertumnus.types import CacheOpKind, CacheReport, CacheReportKind, ReconfigKind, ReconfigPlan, WorkerGroup

# E_4(R, P) = 0.1 + 0.001 R + 0.0005 P + 0.004 R / 4
# E_8(R, P) = 0.2 + 0.002 R + 0.0005 P + (0.004 R + 1e-4 (R P + R (R + 1) / 2)) / 8
PROFILE = CostProfile(
    degrees={
        4: DegreeProfile(d=0.1, a=0.001, b=0.0005, c=0.004, alpha=0.0),
        8: DegreeProfile(d=0.2, a=0.002, b=0.0005, c=0.004, alpha=1e-4),
    }
)


def _e8(r: float, p: float) -> float:
    return 0.2 + 0.002 * r + 0.0005 * p + (0.004 * r + 1e-4 * (r * p + r * (r + 1) / 2)) / 8


def _manager(**cfg: object) -> CacheManager:
    m = CacheManager(CacheConfig(block_tokens=10, **cfg), CostModel(PROFILE), [4, 8])  # type: ignore[arg-type]
    m.add_worker(1, 4, 0, 100)
    m.add_worker(2, 8, 0, 100)
    m.apply_report(CacheReport(1, CacheReportKind.STORED, (1, 2, 3, 4)))
    m.apply_report(CacheReport(2, CacheReportKind.STORED, (1, 2)))
    return m


def _place(m: CacheManager, keys: tuple[int, ...], input_len: int, wid: int, pref: int) -> None:
    record(m, keys, m.lookup(keys), input_len, wid, pref)


def test_access_on_reused_path_and_missed_where_the_preferred_degree_has_no_replica() -> None:
    m = _manager()
    keys = (1, 2, 3, 4, 5)
    _place(m, keys, 55, 1, 8)  # CP4 worker reuses 4 blocks; CP8 holds only blocks 1-2
    d3, d4 = 0.0231875, 0.0244375  # by hand from E_8 above
    assert _e8(35, 20) - _e8(25, 30) == pytest.approx(d3)
    assert _e8(25, 30) - _e8(15, 40) == pytest.approx(d4)
    assert node_stats(m.trie, m.degrees, 1) == ({4: 1.0, 8: 0.0}, {4: 0.0, 8: 0.0})
    assert node_stats(m.trie, m.degrees, 2) == ({4: 1.0, 8: 0.0}, {4: 0.0, 8: 0.0})
    acc3, mis3 = node_stats(m.trie, m.degrees, 3)
    acc4, mis4 = node_stats(m.trie, m.degrees, 4)
    assert acc3 == acc4 == {4: 1.0, 8: 0.0}
    assert mis3[4] == mis4[4] == 0.0
    assert mis3[8] == pytest.approx(d3)
    assert mis4[8] == pytest.approx(d4)

    _place(m, keys, 55, 2, 8)  # the CP8 worker reuses its 2 blocks; blocks 3-4 still missed at CP8
    assert node_stats(m.trie, m.degrees, 1)[0] == {4: 1.0, 8: 1.0}
    assert node_stats(m.trie, m.degrees, 3)[0] == {4: 1.0, 8: 0.0}
    assert node_stats(m.trie, m.degrees, 3)[1][8] == pytest.approx(2 * d3)
    _place(m, keys, 55, 2, 4)  # preferred CP4 holds all 4 matched blocks: nothing missed
    assert node_stats(m.trie, m.degrees, 4)[1][8] == pytest.approx(2 * d4)
    assert node_stats(m.trie, m.degrees, 4)[1][4] == 0.0
    assert m.stats()["active_nodes"] == 4
    check_cache(m)


def test_fully_cached_prompt_caps_the_prefix_so_one_token_is_computed() -> None:
    m = _manager()
    _place(m, (1, 2, 3, 4), 40, 1, 8)
    assert node_stats(m.trie, m.degrees, 3)[1][8] == pytest.approx(_e8(20, 20) - _e8(10, 30))
    assert node_stats(m.trie, m.degrees, 4)[1][8] == pytest.approx(_e8(10, 30) - _e8(1, 39))
    check_cache(m)


def test_a_prefix_that_costs_more_to_read_than_to_compute_counts_no_benefit() -> None:
    prof = CostProfile(degrees={4: DegreeProfile(d=0.1, a=0.0, b=0.01, c=0.004, alpha=0.0), 8: PROFILE.degrees[8]})
    m = CacheManager(CacheConfig(block_tokens=10), CostModel(prof), [4, 8])
    m.add_worker(2, 8, 0, 100)
    m.apply_report(CacheReport(2, CacheReportKind.STORED, (1, 2)))
    _place(m, (1, 2), 30, 2, 4)  # Δ = (0.001 − 0.01)·10 < 0 per block at CP4
    assert node_stats(m.trie, m.degrees, 1)[1] == {4: 0.0, 8: 0.0}
    assert node_stats(m.trie, m.degrees, 2)[1] == {4: 0.0, 8: 0.0}
    check_cache(m)


def test_decay_halves_stats_and_pruning_empties_the_active_set() -> None:
    m = _manager(decay=0.5, epsilon=0.3, replication=False, theta_intra=0.4, theta_reclaim=0.1)
    m.add_worker(3, 4, 0, 100)  # a CP4 destination exists, but replication is off
    _place(m, (1, 2, 3, 4, 5), 55, 1, 8)
    assert m.stats()["active_nodes"] == 4
    assert m.scan(5.0, {}) == []
    assert node_stats(m.trie, m.degrees, 3) == ({4: 0.5, 8: 0.0}, {4: 0.0, 8: 0.0})  # missed ≈ 0.012 < ε: dropped
    assert m.stats()["active_nodes"] == 4
    assert m.scan(10.0, {}) == []
    assert m.stats()["active_nodes"] == 0
    assert m.stats()["stats_dropped"] == 4
    assert node_stats(m.trie, m.degrees, 1) == ({4: 0.0, 8: 0.0}, {4: 0.0, 8: 0.0})
    assert m.stats()["nodes"] == 4  # pruning drops statistics, not cached blocks
    assert m.stats()["scans"] == 2
    check_cache(m)


def test_same_stats_with_replication_on_give_ops() -> None:
    # The paper's scan (cache.policy: rules): its intra list and its reclaim-without-pressure are what this pins.
    m = _manager(decay=0.5, epsilon=0.3, replication=True, policy="rules", theta_intra=0.4, theta_reclaim=0.1)
    m.add_worker(3, 4, 0, 100)
    _place(m, (1, 2, 3, 4, 5), 55, 1, 8)
    ops = m.scan(5.0, {})
    # intra: access 1 > 1·0.4 at CP4 → copy to the other CP4 worker; reclaim: the CP8 copy of blocks 1-2 was
    # not reused at CP8 (access 0 < 1·0.1) and worker 1 keeps another copy → delete block 2 there.
    assert [(op.kind.name, op.dst_worker, op.src_worker, op.keys, op.first_missing) for op in ops] == [
        ("REPLICATE", 3, 1, (1, 2, 3, 4), 0),
        ("RECLAIM", 2, None, (1, 2), 1),
    ]
    check_cache(m)


def test_record_placement_rejects_unknown_worker_and_degree() -> None:
    m = _manager()
    keys = (1, 2)
    with pytest.raises(ValueError, match="not registered"):
        record(m, keys, m.lookup(keys), 20, 9, 4)
    with pytest.raises(ValueError, match="preferred degree 2"):
        record(m, keys, m.lookup(keys), 20, 1, 2)
    check_cache(m)


def test_blocks_only_a_pending_copy_has_collect_no_statistics() -> None:
    """After a split, a child holds the leading part of its prefix validly and the rest only pending: nobody
    can serve the pending blocks as a replica (no valid holder), so they could never become inter-degree
    candidates and must not accumulate missed benefit (nor access)."""
    m = CacheManager(CacheConfig(block_tokens=10), CostModel(PROFILE), [4, 8])
    m.add_worker(10, 8, 0, 100)
    keys = tuple(range(1, 9))
    m.apply_report(CacheReport(10, CacheReportKind.STORED, keys))
    parent, lo, hi = WorkerGroup(10, 0, 0, 8), WorkerGroup(11, 0, 0, 4), WorkerGroup(12, 0, 4, 4)
    m.on_reconfigure(ReconfigPlan(ReconfigKind.SPLIT, (parent,), (lo, hi), epoch=2))
    match = m.lookup(keys)
    held, pending = match.held_blocks.get(11, 0), match.pending_blocks.get(11, 0)
    assert 0 < held < pending == 8 and match.matched_blocks == 8  # the child reconciles the rest on reuse
    assert max(match.held_blocks.values()) == held  # no worker holds the blocks past `held` validly
    c = commit(m, keys, 11, 8, 85, match)  # no CP8 worker is left: every valid block is missed at CP8
    assert c.op is not None and c.op.kind == CacheOpKind.RECONCILE  # the pending rest comes from the sibling
    for k in range(1, held + 1):
        acc, mis = node_stats(m.trie, m.degrees, keys[k - 1])
        assert acc == {4: 1.0, 8: 0.0}
        assert mis[4] == 0.0 and mis[8] == pytest.approx(
            _e8(85 - 10 * (k - 1), 10 * (k - 1)) - _e8(85 - 10 * k, 10 * k)
        )
    for k in range(held + 1, pending + 1):
        assert node_stats(m.trie, m.degrees, keys[k - 1]) == ({4: 0.0, 8: 0.0}, {4: 0.0, 8: 0.0})
    assert m.stats()["active_nodes"] == held
    check_cache(m)
