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


# -- retention (cache.retain_reused / retain_fraction; docs/design.md *Retention*) ----------------------------


def _reused(c: BlockCache, keys: list[int], times: int, tick: int) -> None:
    for i in range(times):
        c.touch(keys, tick + i, reuse=True)


def test_retention_keeps_a_reused_prefix_past_newer_one_off_prompts() -> None:
    for retain, evicted in (((2, 0.5), [4, 3]), (None, [2, 1])):
        c = BlockCache(6, retain=retain)
        c.store([1, 2], tick=1)
        _reused(c, [1, 2], 2, tick=2)  # reused by two prefills: retained (with retention)
        c.store([3, 4], tick=5)
        c.store([5, 6], tick=6)
        assert c.keys()[:2] == [2, 1]  # the reused prefix is the least recently used
        assert c.store([7, 8], tick=7) == (0, evicted)
    assert c.leading([1, 2]) == 0  # plain LRU (the last loop) lost it


def test_retention_falls_back_to_lru_beyond_its_budget() -> None:
    c = BlockCache(4, retain=(1, 0.5))  # at most 2 retained blocks are protected
    c.store([1, 2, 3], tick=1)
    _reused(c, [1, 2, 3], 1, tick=2)  # 3 retained > budget 2
    c.store([8], tick=3)
    assert c.store([9], tick=4) == (0, [3])  # over budget: plain LRU (the chain's tail first)
    assert c.store([10], tick=5) == (0, [8])  # within budget again: the LRU block not retained
    assert c.leading([1, 2, 3]) == 2


def test_retention_never_evicts_the_chain_being_stored() -> None:
    c = BlockCache(4, retain=(1, 1.0))
    c.store([1], tick=1)
    _reused(c, [1], 1, tick=2)  # everything but the chain below is retained
    c.store([5, 6], tick=3)
    # 5, 6 are held and not retained: the only non-chain block (retained 1) must go, not a chain block
    assert c.store([5, 6, 7, 8], tick=4) == (2, [1])
    assert c.leading([5, 6, 7, 8]) == 4


def test_split_and_merge_keep_reuse_counts() -> None:
    retain = (1, 1.0)
    c = BlockCache(4, degree=2, retain=retain)
    c.store([1, 2], tick=1)  # depth 0 -> rank 0, depth 1 -> rank 1
    _reused(c, [1, 2], 1, tick=2)
    c.store([3, 4], tick=4)
    lo, hi, _, _ = c.split((2, 2))
    assert lo.retain == retain and lo.keys() == [1, 3]  # 1 is the least recent, but reused
    assert lo.store([7], tick=5) == (0, [3])
    merged, evicted = BlockCache.merge([(0, lo), (1, hi)], 4, 2, retain)
    assert evicted == [] and sorted(merged.keys()) == [1, 2, 4, 7]
    merged.store([9, 10], tick=6)  # two slots: the LRU blocks not retained (4, then 7), not 1 or 2
    assert merged.leading([1, 2]) == 2 and 4 not in merged and 7 not in merged
