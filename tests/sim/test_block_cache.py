"""The simulated engine's LRU block cache: eviction order, chain protection, split and merge."""

from __future__ import annotations

from vertumnus.engines.sim.cache import BlockCache


def test_store_reports_first_new_and_evicts_descendants_first() -> None:
    c = BlockCache(5)
    assert c.store([1, 2, 3], tick=1) == (0, [])
    # a sibling chain sharing block 1: only 4, 5 are new
    assert c.store([1, 4, 5], tick=2) == (1, [])
    assert len(c) == 5
    # LRU order: the old chain's tail (3, then 2) goes before shared ancestor 1
    assert c.keys() == [3, 2, 5, 4, 1]
    first_new, evicted = c.store([6, 7], tick=3)
    assert (first_new, evicted) == (0, [3, 2])
    assert c.leading([1, 2, 3]) == 1 and c.leading([1, 4, 5]) == 3


def test_store_never_evicts_its_own_chain_and_caps_at_capacity() -> None:
    c = BlockCache(3)
    c.store([10, 11], tick=1)
    first_new, evicted = c.store([10, 11, 12, 13, 14], tick=2)
    assert (first_new, evicted) == (2, [])
    assert c.keys() == [12, 11, 10]  # only the leading 3 blocks fit
    assert c.store([10, 11], tick=3) == (None, [])


def test_leading_respects_limit_and_missing_counts() -> None:
    c = BlockCache(10)
    c.store([1, 2, 3, 4], tick=1)
    assert c.leading([1, 2, 3, 4, 5]) == 4
    assert c.leading([1, 2, 3, 4, 5], limit=2) == 2
    assert c.missing([1, 2, 9, 4, 8], start=1) == 2


def test_remove_takes_descendants() -> None:
    c = BlockCache(10)
    c.store([1, 2, 3], tick=1)
    c.store([1, 2, 4], tick=2)
    c.store([7], tick=3)
    assert sorted(c.remove([2])) == [2, 3, 4]
    assert sorted(c.keys()) == [1, 7]
    assert c.remove([99]) == []


def test_split_by_rank_of_block_depth_and_merge_keeps_all() -> None:
    c = BlockCache(8, degree=4)
    c.store([10, 11, 12, 13, 14], tick=1)  # depths 0..4 on parent ranks 0,1,2,3,0 of a degree-4 worker
    lo, hi, ev_lo, ev_hi = c.split((4, 4))
    assert sorted(lo.keys()) == [10, 11, 14]  # parent ranks 0, 1
    assert sorted(hi.keys()) == [12, 13]  # parent ranks 2, 3
    assert ev_lo == ev_hi == []
    assert lo.leading([10, 11, 12, 13, 14]) == 2  # block 12 is missing: the rest is pending
    merged, ev = BlockCache.merge([(0, lo), (2, hi)], 8, 4)
    assert ev == [] and merged.leading([10, 11, 12, 13, 14]) == 5
    # a tight child capacity evicts LRU blocks (deepest first)
    lo2, _, ev2, _ = c.split((2, 4))
    assert ev2 == [14] and sorted(lo2.keys()) == [10, 11]


def test_merge_keeps_each_block_on_its_rank_and_split_returns_it_whole() -> None:
    lo, hi = BlockCache(8, degree=2), BlockCache(8, degree=2)
    lo.store([1, 2, 3, 4], tick=1)  # ranks 0 1 0 1
    hi.store([1, 2, 5], tick=2)  # ranks 0 1 0 -> 2 3 2 in the merged worker
    merged, ev = BlockCache.merge([(0, lo), (2, hi)], 16, 4)
    # 1 and 2 are held twice: the copies on their canonical CP4 ranks (0, 1) survive; 3, 4 stay on ranks 0, 1
    assert ev == [] and merged.layout() == {1: 0, 2: 1, 3: 0, 4: 1, 5: 2}
    merged.store([1, 2, 3, 4, 6], tick=3)  # a new block at depth 4 goes to its canonical rank 0
    a, b, _, _ = merged.split((8, 8))
    assert a.layout() == {1: 0, 2: 1, 3: 0, 4: 1, 6: 0} and b.layout() == {5: 0}
    assert a.leading([1, 2, 3, 4, 6]) == 5  # the lower child has the whole prefix it computed
