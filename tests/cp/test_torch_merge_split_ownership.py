"""Merge → split block ownership on the real torch engine (gloo rank processes) behind the real pool and cache
manager: CP2 + CP2 → CP4 → CP2 + CP2 → CP4 → CP2 + CP2.

Prefix A is computed on the lower CP2 and C on the upper one before the merge, B on the CP4. A merge copies
nothing, so after the split the lower child holds all of A, the upper child all of C, and each child one
stripe of B. After every reconfiguration the engine's per-rank layout must equal the cache manager's, every
reconcile must succeed and copy exactly the blocks the child lacks, every reuse must reuse exactly the
promised prefix, and every output must equal the single-rank reference.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from cp_helpers import TOL, tiny_config, tokens

from vertumnus.cache import reconfigure
from vertumnus.cache.block_keys import keys_from_tokens
from vertumnus.cache.invariants import check_cache
from vertumnus.cost_model import CostModel, CostProfile, DegreeProfile
from vertumnus.cp.model import ReferenceModel
from vertumnus.engines.torch.data_plane import TorchDataPlane
from vertumnus.interfaces import EngineEvents
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
    WorkerGroup,
)

BT = 8  # tokens per block
PROFILE = CostProfile(
    degrees={c: DegreeProfile(d=0.1, a=0.001, b=0.0001, c=0.004, alpha=0.0, kappa=5.0) for c in (2, 4)}
)
PA, PB, PC = tokens(32, 1), tokens(32, 2), tokens(32, 3)  # 4 full blocks each
A, B, C = (tuple(keys_from_tokens(p, BT)) for p in (PA, PB, PC))


class Serialised:
    """The pool does no locking: every engine callback runs under the test's condition (its lock), and wakes
    the test thread waiting on it."""

    def __init__(self, events: EngineEvents, cv: threading.Condition) -> None:
        self._events = events
        self._cv = cv

    def __getattr__(self, name: str) -> Callable[..., None]:
        fn = getattr(self._events, name)

        def call(*args: Any) -> None:
            with self._cv:
                fn(*args)
                self._cv.notify_all()

        return call


class LockedPlane:
    """The torch data plane, handing the pool's callbacks to :class:`Serialised`."""

    def __init__(self, inner: TorchDataPlane, cv: threading.Condition) -> None:
        self.inner = inner
        self._cv = cv

    def start(self, groups: Sequence[WorkerGroup], epoch: int, events: EngineEvents) -> None:
        self.inner.start(groups, epoch, Serialised(events, self._cv))  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class Directed:
    """Routing policy of the test: the worker named for each request id (it must be eligible)."""

    def __init__(self) -> None:
        self.to: dict[str, int] = {}

    def choose(self, request: Request, match: PrefixMatch, candidates: Sequence[WorkerView], now: float) -> int:
        wid = self.to[request.request_id]
        assert wid in {v.worker_id for v in candidates}, (request.request_id, wid)
        return wid


class Log:
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
    def __init__(self, dp: TorchDataPlane) -> None:
        cfg = dp.cfg
        self.dp = dp
        self.cv = threading.Condition(threading.RLock())
        self.router = Directed()
        self.log = Log()
        self.pool = PrefillPool(cfg, CostModel(PROFILE), LockedPlane(dp, self.cv), dp.clock, router=self.router)  # type: ignore[arg-type]
        self.pool.add_listener(self.log)
        self.ref = ReferenceModel.from_config(cfg.model)
        self.pool.start()  # not under the lock: the ranks' acks arrive while the data plane starts
        self.wait(lambda: all(w.state == "ACTIVE" for w in self.pool.snapshot().workers))
        self.n = 0

    def wait(self, pred: Callable[[], bool], timeout: float = 180.0) -> None:
        with self.cv:
            assert self.cv.wait_for(pred, timeout), "timed out"

    def run(self, prefix: list[int], wid: int) -> int:
        """One request (``prefix`` + a fresh 3-token tail) at ``wid``; checks its logits; returns reused tokens."""
        self.n += 1
        rid = f"r{self.n}"
        toks = prefix + tokens(3, 100 + self.n)
        keys = tuple(keys_from_tokens(toks, BT))
        with self.cv:
            self.router.to[rid] = wid
            self.pool.submit(Request(rid, self.dp.clock(), len(toks), keys, token_ids=toks))
        self.wait(lambda: rid in self.log.results)
        res = self.log.results[rid]
        assert res.ok and res.worker_id == wid
        out = self.dp.take_output(rid)
        assert out is not None
        assert (out.logits - self.ref.prefill(toks)[0]).abs().max().item() <= TOL, rid
        return res.cached_tokens

    def reconfigure(self, kind: ReconfigKind, wid: int) -> tuple[int, ...]:
        n = len(self.log.plans)
        with self.cv:
            self.pool.reconfigure(kind, wid)
        self.wait(lambda: len(self.log.plans) > n)
        return tuple(t.worker_id for t in sorted(self.log.plans[-1].targets, key=lambda g: g.first_rank))

    def layout(self, wid: int) -> dict[int, int]:
        """The engine's key -> rank inside the worker, checked against the cache manager's belief."""
        engine = self.dp.block_layout(wid)
        with self.cv:
            cm = self.pool.cache
            assert reconfigure.block_layout(cm.trie, cm.workers.by_id[wid]) == engine, wid
        return engine

    def match(self, keys: tuple[int, ...]) -> PrefixMatch:
        with self.cv:
            return self.pool.cache.lookup(keys)

    def stats(self) -> dict[str, float]:
        with self.cv:
            return self.pool.cache.stats()


def stripes(*keys: tuple[int, ...], degree: int, first: int = 0, count: int = 4, offset: int = 0) -> dict[int, int]:
    """key -> rank for blocks placed canonically (depth mod degree, plus ``offset``) from depth ``first``."""
    return {k: offset + d % degree for ks in keys for d, k in enumerate(ks) if first <= d < first + count}


def test_merge_then_split_keeps_blocks_with_the_ranks_that_computed_them() -> None:
    cfg = tiny_config(4, [2, 4], composition="2xCP2")
    with TorchDataPlane(cfg) as dp:
        s = Scenario(dp)
        groups = s.pool.lattice.groups
        lo, hi = sorted(groups, key=lambda w: groups[w].first_rank)
        assert s.run(PA, lo) == 0 and s.run(PC, hi) == 0

        (m,) = s.reconfigure(ReconfigKind.MERGE, lo)
        assert s.run(PB, m) == 0
        for prefix, n in ((PC, 3), (PA, 2), (PB, 1)):  # demand that orders the split: C → lower, A, B → upper
            assert [s.run(prefix, m) for _ in range(n)] == [32] * n  # a merge needs no copying
        # r0: A0 A2 B0   r1: A1 A3 B1   r2: C0 C2 B2   r3: C1 C3 B3
        assert s.layout(m) == stripes(A, degree=2) | stripes(C, degree=2, offset=2) | stripes(B, degree=4)

        l2, u2 = s.reconfigure(ReconfigKind.SPLIT, m)
        assert s.layout(l2) == stripes(A, degree=2) | stripes(B, degree=2, count=2)
        assert s.layout(u2) == stripes(C, degree=2) | stripes(B, degree=2, first=2)
        assert s.match(A) == PrefixMatch(4, {l2: 4}, {l2: 4, u2: 4})
        assert s.match(C) == PrefixMatch(4, {u2: 4}, {l2: 4, u2: 4})
        assert s.match(B) == PrefixMatch(4, {l2: 2}, {l2: 2, u2: 4})

        st0 = s.stats()
        assert [s.run(PC, l2), s.run(PA, u2), s.run(PB, u2), s.run(PA, l2), s.run(PC, u2)] == [32] * 5
        st = s.stats()
        done = [(op.dst_worker, op.src_worker, op.keys, op.first_missing, ok) for op, ok in s.log.ops]
        assert done == [(l2, u2, C, 0, True), (u2, l2, A, 0, True), (u2, l2, B, 0, True)]
        assert st["reconciliations_confirmed"] - st0["reconciliations_confirmed"] == 3
        assert st["reconcile_blocks"] - st0["reconcile_blocks"] == 4 + 4 + 2
        assert st["ops_failed"] == st0["ops_failed"]
        # imported blocks land on their canonical ranks; blocks a child had keep theirs
        assert s.layout(l2) == stripes(A, C, degree=2) | stripes(B, degree=2, count=2)
        assert s.layout(u2) == stripes(C, A, B, degree=2)

        # merge again: each key both children hold keeps its canonical CP4 copy; split again: the halves
        (m2,) = s.reconfigure(ReconfigKind.MERGE, l2)
        assert s.layout(m2) == stripes(A, B, C, degree=4)
        l3, u3 = s.reconfigure(ReconfigKind.SPLIT, m2)
        assert s.layout(l3) == stripes(A, B, C, degree=2, count=2)
        assert s.layout(u3) == stripes(A, B, C, degree=2, first=2)
        for prefix, keys in ((PA, A), (PB, B), (PC, C)):
            got = s.match(keys)
            assert got.held_blocks == {l3: 2}
            for w in (l3, u3):
                want = BT * max(got.pending_blocks.get(w, 0), got.held_blocks.get(w, 0))
                assert s.run(prefix, w) == want, (keys, w)
        assert all(ok for _, ok in s.log.ops)
        assert s.stats()["ops_failed"] == st0["ops_failed"]
        with s.cv:
            check_cache(s.pool.cache)
