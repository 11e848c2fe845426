"""Cache manager against a reference model: random report / placement / scan / confirm sequences, after every
step each worker's valid prefix of every prompt and its cached-block count must equal the reference's, and
all trie invariants must hold."""

from __future__ import annotations

import random

import pytest

from tests.control.cache_commit import commit, record
from vertumnus.cache.block_keys import keys_from_hash_ids
from vertumnus.cache.invariants import check_cache
from vertumnus.cache.manager import CacheManager
from vertumnus.config import CacheConfig
from vertumnus.cost_model import CostModel, CostProfile, DegreeProfile
from vertumnus.types import CacheOpKind, CacheReport, CacheReportKind, ReconfigKind, ReconfigPlan, WorkerGroup

WORKERS = {1: 4, 2: 4, 3: 8, 4: 8, 5: 4}


class Reference:
    """Per worker, the set of blocks it physically caches as the reports describe them."""

    def __init__(self, prompts: list[tuple[int, ...]]) -> None:
        self.parent: dict[int, int | None] = {}
        for p in prompts:
            for i, k in enumerate(p):
                self.parent[k] = p[i - 1] if i else None
        self.blocks: dict[int, set[int]] = {w: set() for w in WORKERS}

    def known(self, key: int) -> bool:
        """The trie keeps a block while some worker has it or a block below it."""
        for have in self.blocks.values():
            for k in have:
                a: int | None = k
                while a is not None:
                    if a == key:
                        return True
                    a = self.parent[a]
        return False

    def stored(self, w: int, keys: tuple[int, ...], parent: int | None) -> None:
        if parent is not None and not self.known(parent):
            return  # unknown parent: ignored
        self.blocks[w].update(keys)

    def removed(self, w: int, keys: tuple[int, ...]) -> None:
        have = self.blocks[w]
        gone = {k for k in keys if k in have}
        changed = True
        while changed:  # descendants reachable through the worker's own blocks
            changed = False
            for k in list(have - gone):
                if self.parent[k] in gone:
                    gone.add(k)
                    changed = True
        have -= gone

    def held(self, w: int, keys: tuple[int, ...]) -> int:
        n = 0
        for k in keys:
            if k not in self.blocks[w]:
                break
            n += 1
        return n


def _assert_surplus_replicas_are_scanned(m: CacheManager) -> None:
    """A block with two or more valid copies where some holder keeps no valid / pending block below it could
    be reclaimed there (access 0 < r·θ_reclaim even without statistics): the scan must see it, i.e. it is
    active."""
    t = m.trie
    assert t.words == 1
    for row in t.index.values():
        if int(t.rc[:, row].sum()) < 2:
            continue
        below = 0
        for c in t.children(row):
            below |= int(t.holders[c, 0]) | int(t.pending[c, 0])
        if int(t.holders[row, 0]) & ~below:
            assert row in t.active, f"row {row}: a surplus replica the scan cannot see"


def _run(seed: int, steps: int) -> None:
    rng = random.Random(seed)
    prompts = [keys_from_hash_ids([rng.randrange(3) for _ in range(rng.randint(1, 6))]) for _ in range(40)]
    prof = CostProfile(degrees={c: DegreeProfile(d=0.1, a=1e-3, b=1e-4, c=4e-3, alpha=1e-6) for c in (4, 8)})
    cfg = CacheConfig(block_tokens=16, theta_inter=0.001, theta_intra=1.0, theta_reclaim=0.5, max_ops_per_scan=3)
    m = CacheManager(cfg, CostModel(prof), [4, 8])
    for w, c in WORKERS.items():
        m.add_worker(w, c, w % 2, 12)
    ref = Reference(prompts)
    for _ in range(steps):
        w = rng.choice(list(WORKERS))
        p = rng.choice(prompts)
        roll = rng.random()
        if roll < 0.35:
            i = rng.randrange(len(p))
            j = rng.randint(i + 1, len(p))
            parent = p[i - 1] if i else None
            m.apply_report(CacheReport(w, CacheReportKind.STORED, p[i:j], parent))
            ref.stored(w, p[i:j], parent)
        elif roll < 0.5:
            keys = tuple(k for k in p if rng.random() < 0.4)
            m.apply_report(CacheReport(w, CacheReportKind.REMOVED, keys))
            ref.removed(w, keys)
        elif roll < 0.52:
            m.apply_report(CacheReport(w, CacheReportKind.CLEARED))
            ref.blocks[w].clear()
        elif roll < 0.8:
            match = m.lookup(p)
            record(m, p, match, 16 * len(p) + 5, w, rng.choice((4, 8)))
        elif roll < 0.88:
            m.scan(0.0, {x: rng.random() for x in WORKERS})
        else:
            ops = m.book.outstanding()
            if ops:
                op = rng.choice(ops)
                if rng.random() < 0.3:
                    m.op_failed(op.op_id, "random failure")
                elif op.kind == CacheOpKind.RECLAIM:
                    gone = op.keys[op.first_missing :]
                    m.apply_report(CacheReport(op.dst_worker, CacheReportKind.REMOVED, gone, op_id=op.op_id))
                    ref.removed(op.dst_worker, gone)
                else:
                    m.apply_report(CacheReport(op.dst_worker, CacheReportKind.STORED, op.keys, None, op.op_id))
                    ref.stored(op.dst_worker, op.keys, None)
        for q in [*prompts[:10], p]:
            got = m.lookup(q)
            want = {x: ref.held(x, q) for x in WORKERS if ref.held(x, q)}
            assert got.held_blocks == want
            assert got.pending_blocks == want
        for x in WORKERS:
            assert m.cached_blocks(x) == len(ref.blocks[x])
        check_cache(m)
        _assert_surplus_replicas_are_scanned(m)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_manager_matches_reference_model(seed: int) -> None:
    _run(seed, 150)


def test_random_traffic_across_splits_and_merges_keeps_invariants() -> None:
    rng = random.Random(7)
    prompts = [keys_from_hash_ids([rng.randrange(2) for _ in range(rng.randint(1, 9))]) for _ in range(30)]
    prof = CostProfile(degrees={c: DegreeProfile(d=0.1, a=1e-3, b=1e-4, c=4e-3, alpha=1e-6) for c in (4, 8)})
    m = CacheManager(CacheConfig(block_tokens=16, theta_intra=1.0, theta_reclaim=0.5), CostModel(prof), [4, 8])
    groups = [WorkerGroup(1, 0, 0, 8)]
    m.add_worker(1, 8, 0, 16)
    next_id = 2
    for step in range(240):
        if step % 40 == 39:  # split the CP8 worker, or merge the two CP4 workers back
            targets: tuple[WorkerGroup, ...]
            if len(groups) == 1:
                targets = (WorkerGroup(next_id, 0, 0, 4), WorkerGroup(next_id + 1, 0, 4, 4))
                plan = ReconfigPlan(ReconfigKind.SPLIT, tuple(groups), targets, epoch=step)
            else:
                targets = (WorkerGroup(next_id, 0, 0, 8),)
                plan = ReconfigPlan(ReconfigKind.MERGE, tuple(groups), targets, epoch=step)
            assert m.reconcile_traffic(plan) >= 0.0
            m.on_reconfigure(plan)
            groups, next_id = list(targets), next_id + 2
            check_cache(m)
            continue
        g = rng.choice(groups)
        p = rng.choice(prompts)
        if rng.random() < 0.4:
            i = rng.randrange(len(p))
            m.apply_report(CacheReport(g.worker_id, CacheReportKind.STORED, p[i:], p[i - 1] if i else None))
        elif rng.random() < 0.2:
            m.apply_report(CacheReport(g.worker_id, CacheReportKind.REMOVED, (rng.choice(p),)))
        else:
            match = m.lookup(p)
            c = commit(m, p, g.worker_id, g.degree, 16 * len(p), match)
            if c.pin is not None:
                m.release(c.pin)
            op = c.op
            if op is not None and rng.random() < 0.8:
                m.apply_report(CacheReport(g.worker_id, CacheReportKind.STORED, op.keys, None, op.op_id))
                assert m.lookup(p).held_blocks[g.worker_id] >= len(op.keys)
            elif op is not None:
                m.op_failed(op.op_id, "dropped")
        got = m.lookup(p)
        assert all(got.held_blocks.get(w, 0) <= n for w, n in got.pending_blocks.items())
        assert set(got.held_blocks) <= set(got.pending_blocks)
        check_cache(m)
        _assert_surplus_replicas_are_scanned(m)
