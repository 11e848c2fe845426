"""The replicated block index: reuse, canonical placement, LRU eviction under per-rank capacity, split, merge."""

from __future__ import annotations

from vertumnus.cp.block_index import BlockIndex

A = [101, 102, 103, 104, 105, 106]  # one prefix path (keys are opaque ints)
B = [201, 202, 203, 204]


def test_new_blocks_go_to_rank_depth_mod_c_and_match_stops_at_a_hole() -> None:
    idx = BlockIndex(degree=4, capacity=8)
    added, evicted = idx.add_path(A, 0)
    assert added == A and evicted == []
    assert [idx.owner(k) for k in A] == [0, 1, 2, 3, 0, 1]
    assert [idx.used(r) for r in range(4)] == [2, 2, 1, 1]
    assert idx.match(A) == 6 and idx.match(A, limit=3) == 3
    assert idx.match([101, 102, 999, 104]) == 2


def test_lru_eviction_takes_the_least_recent_leaf_and_its_subtree_first() -> None:
    idx = BlockIndex(degree=1, capacity=6)
    idx.add_path(A[:4], 0)  # 101..104
    idx.add_path(B[:2], 0)  # 201, 202
    idx.touch(A[:4])  # A is now more recent than B; within A the root is most recent
    added, evicted = idx.add_path([201, 202, 203], 2)  # needs one slot: B's own path is pinned
    assert added == [203]
    assert evicted == [104]  # the LRU leaf of A (A touched leaf → root)
    # LRU order now: 201, 202 (untouched), 103, 102, 101, 203 (just added)
    added, evicted = idx.add_path([*A[:2], 301, 302], 2)  # needs one more slot
    assert added == [301, 302]
    assert evicted == [201, 202, 203]  # the least recent block goes with its whole subtree


def test_evicting_an_inner_block_removes_its_descendants() -> None:
    idx = BlockIndex(degree=2, capacity=3)
    idx.add_path(A[:5], 0)  # rank 0: 101, 103, 105; rank 1: 102, 104
    idx.touch([101])
    # a new path whose first block goes to rank 0 (full): LRU there is 103 (101 was touched), so 103..105 go.
    added, evicted = idx.add_path([401], 0)
    assert added == [401]
    assert sorted(evicted) == [103, 104, 105]
    assert idx.match(A) == 2 and idx.used(0) == 2 and idx.used(1) == 1


def test_add_path_stops_when_only_pinned_blocks_remain() -> None:
    idx = BlockIndex(degree=1, capacity=3)
    added, evicted = idx.add_path(A, 0)
    assert added == A[:3] and evicted == []  # the rest of the path cannot evict the path itself


def test_remove_reports_the_subtree() -> None:
    idx = BlockIndex(degree=2, capacity=8)
    idx.add_path(A, 0)
    idx.add_path([*A[:3], 501, 502], 3)
    removed = idx.remove([A[2]])
    assert set(removed) == {103, 104, 105, 106, 501, 502} and removed[0] == 103
    assert idx.match(A) == 2 and len(idx) == 2


def test_split_keeps_each_childs_ranks_and_renumbers() -> None:
    idx = BlockIndex(degree=4, capacity=8)
    idx.add_path(A, 0)
    lo, hi = idx.split(0, 2), idx.split(2, 2)
    assert sorted(k for k, *_ in lo.rows()) == [101, 102, 105, 106]
    assert sorted(k for k, *_ in hi.rows()) == [103, 104]
    assert [hi.owner(103), hi.owner(104)] == [0, 1]
    assert lo.match(A) == 2 and hi.match(A) == 0  # the pending blocks sit at the sibling


def test_merge_needs_no_copy_and_keeps_one_copy_of_duplicates() -> None:
    lo = BlockIndex(degree=2, capacity=8)
    hi = BlockIndex(degree=2, capacity=8)
    lo.add_path(A[:4], 0)  # lo rank 0: 101, 103; rank 1: 102, 104
    hi.add_path(A[:4], 0)  # same blocks on hi (ranks 2, 3 after the merge)
    hi.add_path(B, 0)
    merged, drop = BlockIndex.merge([(0, lo.rows()), (2, hi.rows())], degree=4, capacity=8)
    assert merged.match(A) == 4 and merged.match(B) == 4
    # canonical owners (depth mod 4) win: 101→0, 102→1 from lo; 103→2, 104→3 from hi
    assert [merged.owner(k) for k in A[:4]] == [0, 1, 2, 3]
    assert drop == {0: [103], 1: [104], 2: [101], 3: [102]}
    # B was computed at degree 2 on hi: its blocks stay where they are (ranks 2, 3)
    assert [merged.owner(k) for k in B] == [2, 3, 2, 3]


def test_rows_round_trip_preserves_lru_order() -> None:
    idx = BlockIndex(degree=2, capacity=4)
    idx.add_path(A[:2], 0)
    idx.add_path(B[:2], 0)
    idx.touch(A[:2])
    again = BlockIndex.from_rows(idx.rows(), 2, 4)
    assert [r[0] for r in again.rows()] == [r[0] for r in idx.rows()] == [201, 202, 102, 101]


def test_retention_evicts_the_lru_block_not_reused_and_merge_keeps_the_most_reuse() -> None:
    for retain, evicted in (((2, 0.5), [201, 202]), (None, [102, 101])):
        idx = BlockIndex(degree=1, capacity=4, retain=retain)
        idx.add_path(A[:2], 0)
        idx.touch(A[:2], reuse=True)
        idx.touch(A[:2], reuse=True)  # reused by two prefills: retained (with retention)
        idx.add_path(B[:2], 0)  # LRU order: 102, 101, 201, 202
        assert idx.add_path([301, 302], 0) == ([301, 302], evicted)
    a = BlockIndex(degree=1, capacity=4, retain=(1, 1.0))
    a.add_path(A[:2], 0)
    a.touch(A[:2], reuse=True)
    rows = a.rows()
    assert [r[5] for r in rows] == [1, 1]  # hits travel in the rows
    b = BlockIndex(degree=1, capacity=4, retain=(1, 1.0))
    b.add_path(A[:2], 0)  # the same blocks, never reused here
    merged, drop = BlockIndex.merge([(0, b.rows()), (1, rows)], degree=2, capacity=4, retain=(1, 1.0))
    assert merged.retain == (1, 1.0) and drop == {1: [101], 0: [102]}  # one copy each, on its canonical rank
    assert {r[0]: r[5] for r in merged.rows()} == {101: 1, 102: 1}  # as reused as its most reused copy
