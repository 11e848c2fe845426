"""Each baseline's choice on hand-made scenarios (exact worker ids)."""

from __future__ import annotations

from vertumnus.scheduler.policy import WorkerView
from vertumnus.sim.baselines import (
    DynamoKVPolicy,
    LeastWorkPolicy,
    LengthThresholdPolicy,
    RoundRobinPolicy,
    SGLangCacheAwarePolicy,
)
from vertumnus.types import Placement, PrefillResult, PrefixMatch, Request, WorkerState

B = 512


def view(wid: int, degree: int = 4, queue_s: float = 0.0, held: int = 0, outstanding: int = 0) -> WorkerView:
    return WorkerView(
        worker_id=wid,
        degree=degree,
        node=0,
        state=WorkerState.ACTIVE,
        queue_s=queue_s,
        outstanding_blocks=outstanding,
        free_blocks=1000,
        held_blocks=held,
        cached_tokens=held * B,
        predicted_s=0.1,
    )


def req(rid: str, tokens: int) -> Request:
    return Request(rid, 0.0, tokens, tuple(range(tokens // B)))


NO_MATCH = PrefixMatch(0, {})


def test_round_robin_cycles_in_id_order() -> None:
    p = RoundRobinPolicy()
    cands = [view(3), view(1), view(2)]
    assert [p.choose(req(f"r{i}", 100), NO_MATCH, cands, 0.0) for i in range(4)] == [1, 2, 3, 1]


def test_least_work_picks_smallest_queue_then_lower_id() -> None:
    p = LeastWorkPolicy()
    cands = [view(1, queue_s=2.0), view(5, queue_s=0.5), view(4, queue_s=0.5, held=9)]
    assert p.choose(req("r", 4096), NO_MATCH, cands, 0.0) == 4


def test_length_threshold_sends_long_to_largest_degree() -> None:
    p = LengthThresholdPolicy(32768)
    cands = [view(0, 4, 0.0), view(1, 4, 0.3), view(2, 8, 5.0), view(3, 8, 1.0)]
    assert p.choose(req("long", 40000), NO_MATCH, cands, 0.0) == 3  # least-loaded CP8
    assert p.choose(req("short", 8000), NO_MATCH, cands, 0.0) == 0  # least-loaded CP4
    assert p.choose(req("exact", 32768), NO_MATCH, cands, 0.0) == 0  # "long" means strictly more
    only_big = [view(2, 8, 5.0), view(3, 8, 1.0)]
    assert p.choose(req("short", 8000), NO_MATCH, only_big, 0.0) == 3  # no small degree: fall back to all


def _done(p: SGLangCacheAwarePolicy, rid: str, wid: int) -> None:
    pl = Placement(rid, wid, 4, 0, 1, 0.1, 0.0, 0.1, 4, 0)
    p.request_done(req(rid, 100), pl, PrefillResult(rid, wid, 0, 0.0, 0.1))


def test_sglang_best_match_above_threshold_else_least_loaded() -> None:
    p = SGLangCacheAwarePolicy(B)
    # preload: worker 1 has 3 requests in flight, worker 2 has 1
    for i in range(3):
        p.choose(req(f"a{i}", 100), NO_MATCH, [view(1)], 0.0)
    p.choose(req("b0", 100), NO_MATCH, [view(2)], 0.0)
    assert (p.load(1), p.load(2)) == (3, 1)
    cands = [view(1, held=6), view(2, held=0), view(3, held=2)]
    # 10 blocks: worker 1 matches 6/10 = 0.6 ≥ 0.5 -> best match even though loaded
    assert p.choose(req("hit", 10 * B), NO_MATCH, cands, 0.0) == 1
    # 16 blocks: best match 6/16 < 0.5 -> least loaded (worker 3: 0 requests)
    assert p.choose(req("miss", 16 * B), NO_MATCH, cands, 0.0) == 3
    assert (p.load(1), p.load(3)) == (4, 1)
    _done(p, "hit", 1)
    assert p.load(1) == 3


def test_sglang_imbalance_overrides_cache() -> None:
    p = SGLangCacheAwarePolicy(B)
    for i in range(40):
        p.choose(req(f"x{i}", 100), NO_MATCH, [view(1)], 0.0)
    for i in range(5):
        p.choose(req(f"y{i}", 100), NO_MATCH, [view(2)], 0.0)
    cands = [view(1, held=10), view(2), view(3)]
    # max − min = 40 − 0 > 32 and 40 > 1.0001 × 0 -> shortest queue (worker 3), despite a full match at 1
    assert p.choose(req("z", 10 * B), NO_MATCH, cands, 0.0) == 3
    # only workers 1 and 2: 40 − 5 = 35 > 32 -> worker 2
    assert p.choose(req("w", 10 * B), NO_MATCH, [view(1, held=10), view(2)], 0.0) == 2
    # drop worker 1's load below the absolute threshold: balanced again -> best match
    for i in range(10):
        _done(p, f"x{i}", 1)
    assert p.choose(req("v", 10 * B), NO_MATCH, [view(1, held=10), view(2)], 0.0) == 1


def test_sglang_replacement_moves_the_count() -> None:
    p = SGLangCacheAwarePolicy(B)
    p.choose(req("r", 100), NO_MATCH, [view(1)], 0.0)
    p.choose(req("r", 100), NO_MATCH, [view(2)], 0.0)  # re-placed after a drain
    assert (p.load(1), p.load(2)) == (0, 1)


def test_dynamo_uncached_plus_outstanding_blocks() -> None:
    p = DynamoKVPolicy(B)
    r = req("r", 10 * B + 1)  # 11 prompt blocks (partial last block counts)
    cands = [
        view(1, held=8, outstanding=20),  # 3 + 20 = 23
        view(2, held=0, outstanding=10),  # 11 + 10 = 21
        view(3, held=4, outstanding=14),  # 7 + 14 = 21 -> tie with 2, lower id wins
    ]
    assert p.choose(r, NO_MATCH, cands, 0.0) == 2
    assert p.choose(r, NO_MATCH, [view(1, held=8, outstanding=20), view(3, held=4, outstanding=14)], 0.0) == 3
