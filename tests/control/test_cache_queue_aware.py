"""``cache.policy: queue_aware`` decisions on small scenarios, with exact expected ops (vertumnus/cache/hot_copy.py):
a hot prefix behind a queued holder is copied to an idle same-degree worker; no copy of a cold prefix, to a worker
with a prefill waiting, or one that would land after the holder's queue drains; a cold duplicate is reclaimed
only to make room for a copy on a full worker; the rules policy makes no copy at placement; retention (the
engines' eviction order) is the queue_aware manager's only."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from tests.control.cache_commit import commit, record
from vertumnus.cache.manager import CacheManager
from vertumnus.config import CacheConfig
from vertumnus.cost_model import CostModel, CostProfile, DegreeProfile
from vertumnus.types import CacheOp, CacheReport, CacheReportKind, FetchPlan, Placement

PROFILE = CostProfile(
    degrees={
        4: DegreeProfile(d=0.1, a=0.001, b=0.0005, c=0.004, alpha=0.0),
        8: DegreeProfile(d=0.2, a=0.002, b=0.0005, c=0.004, alpha=1e-4),
    }
)
HOT = (11, 12, 13, 14, 15, 16)  # a 6-block system prompt
BYTES = 1_000_000_000  # 1 GB a block: copy time = blocks / GB/s (easy to state)


def _manager(**cfg: object) -> CacheManager:
    base: dict[str, object] = dict(
        block_tokens=10, policy="queue_aware", hot_min_blocks=4, hot_min_access=2.0, copy_gain_s=0.05,
        bytes_per_block=BYTES, intra_node_gbps=100.0, inter_node_gbps=10.0, theta_intra=3.0, theta_reclaim=1.0,
        theta_inter=1e9, reclaim_pressure=0.9, max_ops_per_scan=4,
    )  # fmt: skip
    base.update(cfg)
    m = CacheManager(CacheConfig(**base), CostModel(PROFILE), [4, 8])  # type: ignore[arg-type]
    m.add_worker(1, 4, 0, 100)  # the holder
    m.add_worker(2, 4, 0, 100)  # idle, same node
    m.add_worker(3, 4, 1, 100)  # idle, other node
    m.add_worker(4, 8, 1, 100)  # another degree: never a same-degree destination
    m.apply_report(CacheReport(1, CacheReportKind.STORED, HOT, None))
    return m


def _reuse(m: CacheManager, wid: int, times: int) -> None:
    for _ in range(times):
        record(m, HOT, m.lookup(HOT), 10 * len(HOT) + 5, wid, 4)


def _decide(
    m: CacheManager, queue_before: float, queues: Mapping[int, float], waiting: Mapping[int, int] | None = None
) -> CacheOp | None:
    """The decision right after a request reusing HOT was placed at worker 1 (its Ê: 0.2 s)."""
    match = m.lookup(HOT)
    record(m, HOT, match, 65, 1, 4)
    placement = Placement("r", 1, 4, 0, 65, 0.2, queue_before, 0.0, 4, 0)
    return m.replicate_hot(HOT, match, placement, _Loads(queues, waiting or {}), 0.0)


class _Loads:
    """The scheduler's loads as the hot copy reads them: fixed queues and waiting prefills."""

    def __init__(self, queues: Mapping[int, float], waiting: Mapping[int, int]) -> None:
        self.queues, self.waiting = dict(queues), dict(waiting)

    def queue_map(self, now: float) -> dict[int, float]:
        return self.queues

    def waiting_at(self, worker_id: int) -> int:
        return self.waiting.get(worker_id, 0)


def _brief(op: CacheOp | None) -> tuple[object, ...] | None:
    if op is None:
        return None
    return (op.kind.name, op.src_worker, op.dst_worker, op.keys, op.first_missing, op.inter_degree, op.inter_node)


def test_hot_prefix_behind_queued_holder_is_copied_to_idle_same_degree_worker() -> None:
    m = _manager()
    _reuse(m, 1, 10)  # reused 10 times recently: hot (≈ 1.1 requests/s)
    op = _decide(m, 1.5, {1: 1.5, 2: 0.0, 3: 0.0, 4: 0.0})
    # Worker 2 (idle, same node as the source: 0.06 s over NVLink) beats worker 3 (other node); never CP8 w4.
    assert _brief(op) == ("REPLICATE", 1, 2, HOT, 0, False, False)
    assert m.stats()["hot_ordered"] == 1
    # The copy is in flight: the next request behind the same holder orders no second copy of the prefix.
    assert _decide(m, 1.7, {1: 1.7, 2: 0.0, 3: 0.0, 4: 0.0}) is None
    # Confirmed by the destination's STORED report, worker 2 is a holder the scheduler can pick.
    assert op is not None
    m.apply_report(CacheReport(2, CacheReportKind.STORED, HOT, None, op.op_id))
    assert m.lookup(HOT).held_blocks == {1: 6, 2: 6}


def test_cold_prefix_is_not_copied() -> None:
    m = _manager()  # HOT stored, never reused before: this placement is its first reuse (access 1 < 2)
    assert _decide(m, 1.5, {1: 1.5, 2: 0.0, 3: 0.0}) is None


def test_no_copy_to_a_worker_with_a_prefill_waiting_or_a_queue_almost_as_long() -> None:
    m = _manager()
    _reuse(m, 1, 10)
    # Worker 2 has a prefill waiting: the copy goes to worker 3 (other node, 0.6 s over the 10 GB/s link).
    assert _brief(_decide(m, 1.5, {1: 1.5, 2: 0.0, 3: 0.0}, {2: 1})) == ("REPLICATE", 1, 3, HOT, 0, False, True)
    m2 = _manager()
    _reuse(m2, 1, 10)
    # Every same-degree worker is about as loaded as the holder: nothing for the next request to gain.
    assert _decide(m2, 1.5, {1: 1.5, 2: 1.48, 3: 1.47}) is None


def test_copy_that_would_land_after_the_queue_drains_is_not_made() -> None:
    m = _manager(intra_node_gbps=2.0, inter_node_gbps=2.0)  # 6 blocks of 1 GB: 3 s on the link
    _reuse(m, 1, 10)
    # The holder's queue (1.5 s) plus the request (0.2 s) drain before a 3-s copy could land.
    assert _decide(m, 1.5, {1: 1.5, 2: 0.0, 3: 0.0}) is None
    m_fast = _manager()  # the same queue with a fast link: the copy is made
    _reuse(m_fast, 1, 10)
    assert _decide(m_fast, 1.5, {1: 1.5, 2: 0.0, 3: 0.0}) is not None


def test_a_copy_needs_a_request_rate_that_outlives_the_copy() -> None:
    # access 2 (just hot) at the default decay 0.5 and a 5-s scan ≈ 0.2 requests/s: over a 0.45-s horizon
    # (queue 0.25 + Ê 0.2) fewer than one more request is expected, so the copy is not made.
    m = _manager()
    _reuse(m, 1, 1)
    assert _decide(m, 0.25, {1: 0.25, 2: 0.0, 3: 0.0}) is None


def test_cold_duplicate_is_reclaimed_only_to_make_room_for_a_copy() -> None:
    m = _manager()
    m.add_worker(5, 4, 0, 8)  # a small cache, full: a cold duplicate (7 blocks) plus one block
    cold = (21, 22, 23, 24, 25, 26, 27)
    m.apply_report(CacheReport(5, CacheReportKind.STORED, cold, None))
    m.apply_report(CacheReport(5, CacheReportKind.STORED, (31,), None))
    m.apply_report(CacheReport(2, CacheReportKind.STORED, cold, None))
    assert m.workers.by_id[5].pressure == 1.0
    assert m.scan(5.0, {}) == []  # full, but nothing incoming needs the room: LRU's business, no reclaim
    _reuse(m, 1, 10)
    # The hot prefix's copy goes to idle worker 5 (workers 2 and 3 have prefills waiting); 6 blocks, 0 free.
    copy = _decide(m, 1.5, {1: 1.5, 2: 0.0, 3: 0.0, 5: 0.0}, {2: 1, 3: 1})
    assert _brief(copy) == ("REPLICATE", 1, 5, HOT, 0, False, False)
    ops = m.scan(10.0, {})
    assert [(op.kind.name, op.dst_worker, op.keys, op.first_missing) for op in ops] == [
        ("RECLAIM", 5, cold, 6)  # the leaf of the cold duplicate, on the worker the copy needs room on
    ]


def test_rules_policy_makes_no_copy_at_placement() -> None:
    m = _manager(policy="rules")
    _reuse(m, 1, 10)
    assert _decide(m, 1.5, {1: 1.5, 2: 0.0, 3: 0.0}) is None


# -- fetch at placement: the scheduler prices a copied-in prefix, the pool attaches the copy to the job ----------
def _sched():  # type: ignore[no-untyped-def]
    from vertumnus.config import DEFAULT_PROFILE, REPO_ROOT, config_from_dict
    from vertumnus.scheduler import Scheduler
    from vertumnus.types import WorkerState

    cfg = config_from_dict({"pool": {"nodes": 2, "gpus_per_node": 8, "degrees": [4, 8],
                                     "kv_capacity_blocks_per_rank": 2048}})  # fmt: skip
    cost = CostModel.from_file(REPO_ROOT / DEFAULT_PROFILE)
    s = Scheduler(cfg, cost)
    s.add_worker(0, 8, 0, WorkerState.ACTIVE, 1)
    s.add_worker(1, 4, 1, WorkerState.ACTIVE, 1)
    s.add_worker(2, 4, 1, WorkerState.ACTIVE, 1)
    return s, cost


def test_scheduler_prices_a_fetched_prefix_and_leaves_a_queued_holder() -> None:
    from vertumnus.types import FetchOffer, PrefixMatch, Request, WorkerState

    keys = tuple(range(100, 132))  # 32 blocks = 16K tokens of a shared prompt, then 1K of the request's own
    s, cost = _sched()
    # Worker 1 (CP4) holds the prompt and has one uncached 8K prefill queued (the others drain meanwhile).
    s.set_state(0, WorkerState.DRAINING)
    s.set_state(2, WorkerState.DRAINING)
    s.place(Request("f", 0.0, 8192, ()), PrefixMatch(0, {}), 0.0)
    s.set_state(0, WorkerState.ACTIVE)
    s.set_state(2, WorkerState.ACTIVE)
    assert s.queue_s(1, 0.0) == pytest.approx(cost.predict(4, 8192, 0)) and s.queue_s(2, 0.0) == 0.0
    match = PrefixMatch(32, {1: 32})
    req = Request("r", 0.0, 16384 + 1024, (*keys, 999, 998))
    without = s.place(req, match, 0.0)
    assert without is not None and without.worker_id == 1  # waits behind the holder: cheaper than recomputing
    s.release("r")
    spb = 0.001  # 1 ms a block
    assert without.fetch is None
    offer = FetchOffer(32, spb, 1.0, (1,))
    with_fetch = s.place(req, PrefixMatch(32, {1: 32}, fetch=offer), 0.0)
    # Idle worker 2 copies the 32 blocks in (32 ms) from the holder and computes only the 1K suffix.
    assert with_fetch is not None and with_fetch.worker_id == 2
    assert with_fetch.cached_tokens == 16384 and with_fetch.queue_s == 0.0
    assert with_fetch.predicted_s == pytest.approx(cost.predict(4, 1024, 16384) + 32 * spb)
    assert with_fetch.fetch == FetchPlan(1, 32)
    s.release("r")
    # A fetch is offered only to workers whose queue is short enough for the source to keep the blocks.
    capped = s.place(req, PrefixMatch(32, {1: 32}, fetch=FetchOffer(32, spb, -1.0, (1,))), 0.0)
    assert capped is not None and capped.worker_id == 1 and capped.fetch is None


def test_the_fetch_source_is_on_the_destinations_node_then_of_its_degree_then_least_loaded() -> None:
    from vertumnus.types import FetchOffer, PrefixMatch, Request, WorkerState

    s, _ = _sched()
    s.add_worker(3, 4, 0, WorkerState.ACTIVE, 1)  # CP4 on node 0 (with CP8 worker 0)
    s.add_worker(4, 4, 1, WorkerState.ACTIVE, 1)  # CP4 on node 1 (with CP4 workers 1 and 2)
    keys = tuple(range(100, 132))
    for wid in (0, 2, 3, 4):
        s.set_state(wid, WorkerState.DRAINING)
    s.place(Request("busy", 0.0, 8192, ()), PrefixMatch(0, {}), 0.0)  # queued at worker 1
    for wid in (0, 1, 2, 3, 4):  # only worker 2 (node 1, holding nothing) is a candidate
        s.set_state(wid, WorkerState.ACTIVE if wid == 2 else WorkerState.DRAINING)
    held = {0: 32, 1: 32, 3: 32, 4: 32}
    offer = FetchOffer(32, 1e-6, 10.0, (0, 1, 3, 4))
    p = s.place(Request("r", 0.0, 16384 + 1024, (*keys, 9)), PrefixMatch(32, held, fetch=offer), 0.0)
    assert p is not None and p.worker_id == 2
    # Node 1 holders: 1 (CP4, queued) and 4 (CP4, idle): the idle one; node-0 holders come after.
    assert p.fetch == FetchPlan(4, 32)
    s.release("r")
    offer = FetchOffer(32, 1e-6, 10.0, (0, 1, 3))
    p = s.place(Request("r", 0.0, 16384 + 1024, (*keys, 9)), PrefixMatch(32, held, fetch=offer), 0.0)
    assert p is not None and p.fetch == FetchPlan(1, 32)  # same node beats an idle holder elsewhere


def test_plan_fetch_copies_from_a_same_node_holder_and_confirms_like_a_replica() -> None:
    m = _manager()
    m.apply_report(CacheReport(3, CacheReportKind.STORED, HOT, None))  # worker 3 (node 1) holds it too
    _reuse(m, 1, 2)
    match = m.lookup(HOT)
    assert match.fetch is not None
    assert match.fetch.blocks == 6 and match.fetch.block_s == BYTES / 10e9  # over the slower (10 GB/s) link
    assert match.fetch.max_queue_s == 1.0 and sorted(match.fetch.sources) == [1, 3]
    commit_ = commit(m, HOT, 2, match=match, cached_tokens=60, fetch=FetchPlan(1, 6))
    op = commit_.op
    # Worker 2 (node 0) copies from the holder the scheduler chose (1, on its node: see test_scheduler_policy).
    assert _brief(op) == ("REPLICATE", 1, 2, HOT, 0, False, False)
    assert op is not None and commit_.reuse_blocks == 6 and m.stats()["fetch_ordered"] == 1
    m.apply_report(CacheReport(2, CacheReportKind.STORED, HOT, None, op.op_id))
    assert m.lookup(HOT).held_blocks == {1: 6, 2: 6, 3: 6}
    assert m.lookup((77, 78)).fetch is None  # nothing held: nothing to fetch
    rules = _manager(policy="rules")
    assert rules.lookup(HOT).fetch is None


def test_retention_is_the_queue_aware_managers_and_off_for_norepl_and_rules() -> None:
    assert CacheConfig().retention() == (1, 0.7)  # the defaults, chosen on the cache tuning set
    assert CacheConfig(retain_reused=3, retain_fraction=0.25).retention() == (3, 0.25)
    assert CacheConfig(replication=False).retention() is None  # norepl: the engines' plain LRU
    assert CacheConfig(policy="rules").retention() is None  # the paper's rules: no retention
    assert CacheConfig(retain_reused=0).retention() is None
    with pytest.raises(ValueError):
        CacheConfig(retain_fraction=0.0)
