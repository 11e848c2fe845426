"""The engine-block → trie-block mirror (:mod:`vertumnus.engines.vllm.blockmap`) as scenarios with exact reports.

Synthetic engine hashes: cache block ``k`` of a prompt covers engine blocks ``(10k+1, 10k+2)`` (2 per block)."""

from __future__ import annotations

from vertumnus.engines.vllm.blockmap import KeyIndex, WorkerBlocks
from vertumnus.engines.vllm.events import Cleared, Removed, Stored
from vertumnus.types import CacheReport, CacheReportKind

S, R, C = CacheReportKind.STORED, CacheReportKind.REMOVED, CacheReportKind.CLEARED


def setup(capacity: int = 100) -> tuple[KeyIndex, WorkerBlocks, list[CacheReport]]:
    index = KeyIndex(block_tokens=4, per_block=2, capacity=capacity)
    out: list[CacheReport] = []
    return index, WorkerBlocks(3, index, out.append), out


def eh(*blocks: int) -> list[int]:
    """Engine hashes of cache blocks ``blocks`` (prompt positions)."""
    return [h for b in blocks for h in (10 * b + 1, 10 * b + 2)]


def rep(
    kind: CacheReportKind, keys: tuple[int, ...] = (), parent: int | None = None, op: int | None = None
) -> CacheReport:
    return CacheReport(3, kind, keys, parent, op)


def test_blocks_become_visible_once_complete_in_chain_order() -> None:
    index, w, out = setup()
    index.register([100, 101, 102], eh(0, 1, 2), list(range(12)))
    w.apply([Stored(tuple(eh(0)[:1]), None, 2)])
    assert out == []  # half of block 100
    w.apply([Stored((eh(0)[1], *eh(1)[:1]), None, 2)])
    assert out == [rep(S, (100,))]
    w.apply([Stored((eh(1)[1], *eh(2)), None, 2)])
    assert out[1:] == [rep(S, (101, 102), 100)]
    assert w.visible == {100, 101, 102}


def test_removed_block_drops_its_subtree_and_comes_back_with_it() -> None:
    index, w, out = setup()
    index.register([100, 101, 102], eh(0, 1, 2))
    w.apply([Stored(tuple(eh(0, 1, 2)), None, 2)])
    w.apply([Removed((eh(1)[0],))])
    assert out[1:] == [rep(R, (101,))]
    assert w.visible == {100}
    w.apply([Removed((eh(2)[0],))])
    assert out[2:] == []  # 102 was already invisible (its parent is gone): nothing more to tell
    w.apply([Stored((eh(1)[0],), None, 2)])
    assert out[2:] == [rep(S, (101,), 100)]  # 102 is still incomplete
    w.apply([Stored((eh(2)[0],), None, 2)])
    assert out[3:] == [rep(S, (102,), 101)]


def test_cleared_and_branching_prefixes() -> None:
    index, w, out = setup()
    index.register([100, 101], eh(0, 1))
    index.register([100, 201], [*eh(0), 51, 52])  # same first block, different second block
    w.apply([Stored(tuple(eh(0, 1)), None, 2), Stored((51, 52), eh(0)[1], 2)])
    assert out == [rep(S, (100, 101)), rep(S, (201,), 100)]
    w.apply([Cleared()])
    assert out[2:] == [rep(C)] and not w.visible and not w.have


def test_orphans_are_adopted_when_their_block_is_registered() -> None:
    index, w, out = setup()
    index.register([100], eh(0))
    w.apply([Stored(tuple(eh(0, 1)), None, 2)])  # block 1 stored before any request named it
    assert out == [rep(S, (100,))]
    index.register([100, 101], eh(0, 1))
    assert out[1:] == [rep(S, (101,), 100)]


def test_logical_reclaim_and_replication_confirmation() -> None:
    index, w, out = setup()
    index.register([100, 101, 102], eh(0, 1, 2))
    w.apply([Stored(tuple(eh(0, 1, 2)), None, 2)])
    w.reclaim(7, (101, 102))
    assert out[1:] == [rep(R, (101, 102), None, 7)]
    assert w.visible == {100} and w.have.issuperset(eh(1, 2))  # still in the engine, no longer reported
    w.expect_path(9, (100, 101))  # a replication order lifts the logical reclaim of its path; confirmed at once
    assert out[2:] == [rep(S, (101,), 100), rep(S, (100, 101), None, 9)]
    assert w.suppressed == {102}
    w.expect_path(11, (100, 101, 102, 103))
    assert out[4:] == [rep(S, (102,), 101)] and 11 in w.expect  # 103 is unknown: waits for events
    index.register([100, 101, 102, 103], eh(0, 1, 2, 3))
    w.apply([Stored(tuple(eh(3)), eh(2)[1], 2)])
    assert out[5:] == [rep(S, (103,), 102), rep(S, (100, 101, 102, 103), None, 11)]
    assert not w.forget(11)


def test_lru_eviction_keeps_shared_ancestors_and_stops_reporting_evicted_blocks() -> None:
    index, w, out = setup(capacity=3)
    index.register([100, 101], eh(0, 1))
    w.apply([Stored(tuple(eh(0, 1)), None, 2)])
    index.register([100, 301], [*eh(0), 61, 62])  # 101 is now the least recently used block
    index.register([100, 401], [*eh(0), 71, 72])  # capacity 3: 101 goes, 100 (an ancestor) stays
    assert list(index.members) == [301, 401, 100]  # LRU → MRU: a request touches its blocks leaf-first
    assert out[1:] == [rep(R, (101,))]
    assert set(eh(1)) <= w.orphans  # re-registering block 101 later maps the held engine blocks again
