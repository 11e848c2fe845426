"""Merge → split block ownership on the simulated engine, driven through the real pool and cache manager.

CP2 + CP2 → merge → CP4 → split → CP2 + CP2 → merge → split. Prefix A is computed on the lower CP2 and C on the
upper one before the merge, B on the CP4. A merge copies nothing, so the CP4 keeps A on ranks 0-1 and C on
ranks 2-3; the split then hands each child the blocks on its ranks — all of A to the lower child, all of C to
the upper one, B's stripes to both. The engine and the manager must agree on that layout block by block, and
reconciliation must copy exactly what each child lacks.
"""

from __future__ import annotations

from collections.abc import Sequence

from vertumnus.cache import reconfigure
from vertumnus.cache.invariants import check_cache
from vertumnus.cache.manager import CacheManager
from vertumnus.config import config_from_dict
from vertumnus.cost_model import CostModel, CostProfile, DegreeProfile
from vertumnus.engines.sim import SimDataPlane
from vertumnus.engines.sim.events import EventLoop
from vertumnus.pool import PrefillPool
from vertumnus.scheduler.policy import WorkerView
from vertumnus.types import (
    CacheOp,
    Placement,
    PrefillResult,
    PrefixMatch,
    ReconfigKind,
    ReconfigPlan,
    Request,
)

BT = 10  # tokens per cache block
LEN = 45  # 4 full blocks + 5 tokens: a fully cached prompt reuses 40 tokens
A, BK, C = (1, 2, 3, 4), (11, 12, 13, 14), (21, 22, 23, 24)
PROFILE = CostProfile(
    degrees={c: DegreeProfile(d=0.1, a=0.001, b=0.0001, c=0.004, alpha=0.0, kappa=5.0) for c in (2, 4)}
)


class Directed:
    """Routing policy of the test: the worker named for each request id (it must be eligible)."""

    def __init__(self) -> None:
        self.to: dict[str, int] = {}

    def choose(self, request: Request, match: PrefixMatch, candidates: Sequence[WorkerView], now: float) -> int:
        wid = self.to[request.request_id]
        assert wid in {v.worker_id for v in candidates}, (request.request_id, wid)
        return wid


class Log:
    """Pool listener: results, cache-op outcomes, committed plans."""

    def __init__(self) -> None:
        self.results: dict[str, PrefillResult] = {}
        self.ops: list[tuple[CacheOp, bool]] = []
        self.plans: list[ReconfigPlan] = []

    def request_done(self, request: Request, placement: Placement | None, result: PrefillResult | None) -> None:
        assert result is not None
        self.results[request.request_id] = result

    def reconfig_done(self, plan: ReconfigPlan, drain_s: float, switch_s: float) -> None:
        self.plans.append(plan)

    def cache_op_done(self, op: CacheOp, ok: bool) -> None:
        self.ops.append((op, ok))


class Scenario:
    def __init__(self) -> None:
        cfg = config_from_dict(
            {
                "pool": {
                    "nodes": 1,
                    "gpus_per_node": 4,
                    "degrees": [2, 4],
                    "initial_composition": "2xCP2",
                    "kv_capacity_blocks_per_rank": 40,
                },
                "cache": {"block_tokens": BT, "replication": False},
            }
        )
        self.loop = EventLoop()
        self.dp = SimDataPlane(cfg, CostModel(PROFILE), self.loop)
        self.router = Directed()
        self.pool = PrefillPool(cfg, CostModel(PROFILE), self.dp, self.loop.clock, router=self.router)
        self.log = Log()
        self.pool.add_listener(self.log)
        self.pool.start()
        self.loop.run()
        self.n = 0

    @property
    def cache(self) -> CacheManager:
        return self.pool.cache

    def run(self, keys: tuple[int, ...], wid: int) -> int:
        """One request with prefix ``keys`` at worker ``wid``; returns the tokens it reused."""
        self.n += 1
        rid = f"r{self.n}"
        self.router.to[rid] = wid
        self.pool.submit(Request(rid, self.loop.now, LEN, keys))
        self.loop.run()
        res = self.log.results[rid]
        assert res.ok and res.worker_id == wid
        return res.cached_tokens

    def reconfigure(self, kind: ReconfigKind, wid: int) -> tuple[int, ...]:
        self.pool.reconfigure(kind, wid)
        self.loop.run()
        plan = self.log.plans[-1]
        return tuple(t.worker_id for t in sorted(plan.targets, key=lambda g: g.first_rank))

    def layout(self, wid: int) -> dict[int, int]:
        """The engine's key -> rank, checked against the manager's belief."""
        engine = self.dp.workers[wid].cache.layout()
        assert reconfigure.block_layout(self.cache.trie, self.cache.workers.by_id[wid]) == engine, wid
        return engine


def stripes(*keys: tuple[int, ...], degree: int, first: int = 0, count: int = 4, offset: int = 0) -> dict[int, int]:
    """key -> rank for blocks placed canonically (depth mod degree, plus ``offset``) from depth ``first``."""
    return {k: offset + d % degree for ks in keys for d, k in enumerate(ks) if first <= d < first + count}


def test_merge_then_split_keeps_blocks_with_the_ranks_that_computed_them() -> None:
    s = Scenario()
    lo, hi = sorted(s.pool.lattice.groups, key=lambda w: s.pool.lattice.groups[w].first_rank)
    assert s.run(A, lo) == 0 and s.run(C, hi) == 0

    (m,) = s.reconfigure(ReconfigKind.MERGE, lo)
    assert s.run(BK, m) == 0
    for keys, n in ((C, 3), (A, 2), (BK, 1)):  # demand that orders the split: C → lower child, A, B → upper
        assert [s.run(keys, m) for _ in range(n)] == [40] * n  # a merge needs no copying
    # r0: A0 A2 B0   r1: A1 A3 B1   r2: C0 C2 B2   r3: C1 C3 B3
    assert s.layout(m) == stripes(A, degree=2) | stripes(C, degree=2, offset=2) | stripes(BK, degree=4)

    l2, u2 = s.reconfigure(ReconfigKind.SPLIT, m)
    assert s.layout(l2) == stripes(A, degree=2) | stripes(BK, degree=2, count=2)
    assert s.layout(u2) == stripes(C, degree=2) | stripes(BK, degree=2, first=2)
    assert s.cache.lookup(A) == PrefixMatch(4, {l2: 4}, {l2: 4, u2: 4})
    assert s.cache.lookup(C) == PrefixMatch(4, {u2: 4}, {l2: 4, u2: 4})
    assert s.cache.lookup(BK) == PrefixMatch(4, {l2: 2}, {l2: 2, u2: 4})

    st0, copied0 = s.cache.stats(), s.dp.stats.copied_blocks
    reuse = [s.run(C, l2), s.run(A, u2), s.run(BK, u2), s.run(A, l2), s.run(C, u2)]
    assert reuse == [40] * 5
    st = s.cache.stats()
    done = [(op.dst_worker, op.src_worker, op.keys, op.first_missing, ok) for op, ok in s.log.ops]
    assert done == [(l2, u2, C, 0, True), (u2, l2, A, 0, True), (u2, l2, BK, 0, True)]
    assert st["reconciliations_confirmed"] - st0["reconciliations_confirmed"] == 3
    assert st["reconcile_blocks"] - st0["reconcile_blocks"] == 4 + 4 + 2
    assert s.dp.stats.copied_blocks - copied0 == 10 and s.dp.stats.failed_ops == 0
    # imported blocks land on their canonical ranks; blocks a child had keep theirs
    assert s.layout(l2) == stripes(A, C, degree=2) | stripes(BK, degree=2, count=2)
    assert s.layout(u2) == stripes(C, A, BK, degree=2)

    # merge again: each key both children hold keeps its copy on the canonical CP4 rank; split again: halves
    (m2,) = s.reconfigure(ReconfigKind.MERGE, l2)
    assert s.layout(m2) == stripes(A, BK, C, degree=4)
    l3, u3 = s.reconfigure(ReconfigKind.SPLIT, m2)
    assert s.layout(l3) == stripes(A, BK, C, degree=2, count=2)
    assert s.layout(u3) == stripes(A, BK, C, degree=2, first=2)
    for keys in (A, BK, C):
        got = s.cache.lookup(keys)
        assert got.held_blocks == {l3: 2}
        for w in (l3, u3):
            assert s.run(keys, w) == BT * max(got.pending_blocks.get(w, 0), got.held_blocks.get(w, 0))
    assert all(ok for _, ok in s.log.ops) and s.dp.stats.failed_ops == 0
    check_cache(s.cache)
