"""Cache manager, trie side: matching, reports (stored / removed / cleared), worker slots, invariants."""

from __future__ import annotations

import pytest

from vertumnus.cache.invariants import check_cache
from vertumnus.cache.manager import CacheManager
from vertumnus.config import CacheConfig
from vertumnus.cost_model import CostModel, CostProfile, DegreeProfile
from vertumnus.types import CacheReport, CacheReportKind, PrefixMatch


def _manager() -> CacheManager:
    prof = CostProfile(
        degrees={
            4: DegreeProfile(d=0.1, a=0.001, b=0.0005, c=0.004, alpha=0.0),
            8: DegreeProfile(d=0.2, a=0.002, b=0.0005, c=0.004, alpha=1e-4),
        }
    )
    return CacheManager(CacheConfig(block_tokens=10), CostModel(prof), [4, 8])


def _stored(m: CacheManager, wid: int, keys: tuple[int, ...], parent: int | None = None) -> None:
    m.apply_report(CacheReport(wid, CacheReportKind.STORED, keys, parent))


def _removed(m: CacheManager, wid: int, keys: tuple[int, ...]) -> None:
    m.apply_report(CacheReport(wid, CacheReportKind.REMOVED, keys))


def _check_invariants(m: CacheManager) -> None:
    check_cache(m)


def test_match_counts_each_workers_leading_valid_blocks() -> None:
    m = _manager()
    m.add_worker(1, 4, 0, 100)
    m.add_worker(2, 4, 0, 100)
    m.add_worker(3, 8, 1, 100)
    _stored(m, 1, (1, 2, 3, 4))
    _stored(m, 2, (1, 2))
    _stored(m, 2, (25,), parent=2)
    _stored(m, 3, (1, 2, 3))
    assert m.lookup((1, 2, 3, 4, 9)) == PrefixMatch(4, {1: 4, 2: 2, 3: 3}, {1: 4, 2: 2, 3: 3})
    assert m.lookup((1, 2, 25)) == PrefixMatch(3, {1: 2, 2: 3, 3: 2}, {1: 2, 2: 3, 3: 2})
    assert m.lookup((7, 1, 2)) == PrefixMatch(0, {}, {})
    assert m.lookup(()) == PrefixMatch(0, {}, {})
    assert m.stats()["nodes"] == 5
    assert [m.cached_blocks(w) for w in (1, 2, 3)] == [4, 3, 3]
    assert m.workers.by_id[1].free == 96
    _check_invariants(m)


def test_chain_under_an_unheld_parent_is_only_present_until_the_parent_arrives() -> None:
    m = _manager()
    m.add_worker(1, 4, 0, 100)
    m.add_worker(2, 4, 0, 100)
    _stored(m, 2, (1, 2))
    _stored(m, 1, (3, 4), parent=2)  # worker 1 lacks blocks 1, 2: not a complete prefix
    assert m.lookup((1, 2, 3, 4)) == PrefixMatch(2, {2: 2}, {2: 2})
    assert m.cached_blocks(1) == 2  # physically cached all the same
    _stored(m, 1, (1, 2))
    assert m.lookup((1, 2, 3, 4)) == PrefixMatch(4, {1: 4, 2: 2}, {1: 4, 2: 2})
    assert m.cached_blocks(1) == 4
    _check_invariants(m)


def test_chain_under_an_unknown_parent_is_ignored_and_counted() -> None:
    m = _manager()
    m.add_worker(1, 4, 0, 100)
    _stored(m, 1, (3, 4), parent=999)
    assert m.stats()["nodes"] == 0
    assert m.stats()["unknown_parent_reports"] == 1


def test_removing_a_middle_block_drops_the_workers_descendants_only() -> None:
    m = _manager()
    m.add_worker(1, 4, 0, 100)
    m.add_worker(2, 4, 0, 100)
    _stored(m, 1, (1, 2, 3, 4, 5))
    _stored(m, 1, (36,), parent=3)
    _stored(m, 2, (1, 2, 3, 4, 5))
    assert m.stats()["nodes"] == 6
    _removed(m, 1, (3,))
    assert m.lookup((1, 2, 3, 4, 5)) == PrefixMatch(5, {1: 2, 2: 5}, {1: 2, 2: 5})
    assert m.lookup((1, 2, 3, 36)) == PrefixMatch(3, {1: 2, 2: 3}, {1: 2, 2: 3})
    assert m.stats()["nodes"] == 5  # block 36 had no other holder: freed
    assert m.cached_blocks(1) == 2
    _check_invariants(m)
    _removed(m, 1, (77, 3))  # unknown and already-dropped blocks are no-ops
    assert m.cached_blocks(1) == 2


def test_cleared_and_remove_worker_drop_all_holdings() -> None:
    m = _manager()
    m.add_worker(1, 4, 0, 100)
    m.add_worker(2, 8, 0, 100)
    _stored(m, 1, (1, 2, 3))
    _stored(m, 2, (1, 2))
    m.apply_report(CacheReport(1, CacheReportKind.CLEARED))
    assert m.lookup((1, 2, 3)) == PrefixMatch(2, {2: 2}, {2: 2})
    assert m.stats()["nodes"] == 2
    assert m.cached_blocks(1) == 0
    m.remove_worker(2)
    assert sorted(m.workers.by_id) == [1]
    assert m.stats()["nodes"] == 0
    assert m.lookup((1, 2)) == PrefixMatch(0, {}, {})
    with pytest.raises(ValueError, match="not registered"):
        m.remove_worker(2)
    _stored(m, 1, (1,))
    assert m.lookup((1, 2)) == PrefixMatch(1, {1: 1}, {1: 1})
    _check_invariants(m)


def test_reports_about_unknown_workers_are_ignored_and_counted() -> None:
    m = _manager()
    m.add_worker(1, 4, 0, 100)
    for kind in CacheReportKind:
        m.apply_report(CacheReport(99, kind, (1, 2)))
    assert m.stats()["ignored_reports"] == 3
    assert m.stats()["nodes"] == 0


def test_seventy_workers_use_two_mask_words_and_slots_are_reused() -> None:
    m = _manager()
    keys = tuple(range(1, 7))
    for wid in range(70):
        m.add_worker(wid, 4 if wid % 2 else 8, wid // 8, 50)
        _stored(m, wid, keys[: wid % 5 + 1])
    assert m.trie.words == 2
    got = m.lookup(keys)
    assert got.matched_blocks == 5
    assert got.held_blocks == {wid: wid % 5 + 1 for wid in range(70)}
    m.remove_worker(3)
    m.add_worker(100, 4, 0, 50)  # takes the lowest free slot (worker 3's), empty
    assert m.workers.by_id[100].slot == 3
    got = m.lookup(keys)
    assert 100 not in got.held_blocks and 3 not in got.held_blocks
    _check_invariants(m)


def test_bad_workers_and_degrees_are_rejected() -> None:
    m = _manager()
    m.add_worker(1, 4, 0, 100)
    with pytest.raises(ValueError, match="already registered"):
        m.add_worker(1, 4, 0, 100)
    with pytest.raises(ValueError, match="degree 2"):
        m.add_worker(2, 2, 0, 100)
    with pytest.raises(ValueError, match="capacity_blocks"):
        m.add_worker(3, 4, 0, 0)
    with pytest.raises(ValueError, match="missing from the cost profile"):
        CacheManager(CacheConfig(), m.cost, [4, 16])
