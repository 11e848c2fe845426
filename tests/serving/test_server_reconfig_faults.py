"""Admin split / merge under load, reconciliation after a split, and a rank actor killed mid-prefill, on the
session's shared server (also used by test_server_e2e.py). Each test starts from the state the ``shared``
fixture establishes (conftest.py: initial layout CP2 on ranks 0-1, CP1 on 2 and on 3; nothing in flight) and
makes the queues and running prefills it needs with the test hooks (hold / release, fail a worker), so the
outcome does not depend on the machine's speed or on what ran before."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from typing import Any

import httpx
import openai
import pytest
from server_harness import Server, complete_greedy
from serving_reference import generate, tokenizer

from vertumnus.serving.tokenizer import EOS

pytestmark = pytest.mark.slow


@pytest.fixture
def server(shared: Server) -> Server:
    return shared


def _prompts(tag: str, n: int, base: int, step: int = 25) -> list[str]:
    """``n`` prompts of ``base + step·i`` words (~4 tokens each), no two sharing a block."""
    return [f"{tag} {i}: " + " ".join(f"w{(i * 7 + j) % 97}" for j in range(base + step * i)) for i in range(n)]


def _ids(answers: list[Any]) -> list[list[int]]:
    return [a.choices[0].token_ids for a in answers]


async def _until(server: Server, pred: Any, what: str) -> dict[str, Any]:
    """Poll /v1/pool from inside a running event loop (the traffic task keeps going meanwhile)."""
    deadline = time.monotonic() + 180
    async with httpx.AsyncClient(base_url=server.url, timeout=60) as h:
        while True:
            pool = (await h.get("/v1/pool")).json()
            if pred(pool):
                return dict(pool)
            assert time.monotonic() < deadline, f"not within 180 s: {what}; pool: {pool}"
            await asyncio.sleep(0.02)


def _worker(pool: dict[str, Any], wid: int) -> dict[str, Any]:
    return next(w for w in pool["workers"] if w["id"] == wid)


def test_split_and_merge_ordered_while_twenty_requests_are_in_flight(server: Server) -> None:
    """Every worker holds its first prefill at its start (running) and queues the others; the operation is
    ordered then, so its sources have one running prefill each (finishes under the old geometry) and queued
    ones (withdrawn, placed elsewhere) — whatever the machine's speed."""
    cfg = server.cfg.model
    tok = tokenizer(cfg)
    before = server.get("/v1/pool")
    counters = server.counters()
    cp1 = sorted(w["id"] for w in before["workers"] if w["degree"] == 1)
    (cp2,) = [w["id"] for w in before["workers"] if w["degree"] == 2]

    async def wave(tag: str, op: str, worker: int) -> tuple[dict[str, Any], list[Any], list[str]]:
        prompts = _prompts(tag, 20, 40, 10)  # 160-920 tokens
        server.hold(at="start")
        traffic = asyncio.create_task(complete_greedy(server, prompts, 8))
        # all placed, and every worker with work runs (holds) its first one
        busy = await _until(
            server,
            lambda p: p["placed"] == 20 and all(w["running"] for w in p["workers"] if w["queued"]),
            "all 20 requests placed, one running on every busy worker",
        )
        held = {w["id"]: w["running"] for w in busy["workers"] if w["running"]}
        assert {h["worker"]: h["request"] for h in server.holds()["waiting"]} == held
        plan = server.reconfigure(op, worker, wait=False)
        ordered = await _until(server, lambda p: p["reconfiguring"] is not None, "the operation is in flight")
        server.release()
        answers = await traffic
        await _until(server, lambda p: p["reconfiguring"] is None and p["placed"] == 0, "operation done")
        sources = {s["id"] for s in plan["sources"]}
        # the sources' running prefills stayed there; their queued requests went elsewhere at once
        assert {wid for wid in held} >= sources, f"every source had a running prefill: {held}"
        for wid in sources:
            w = _worker(ordered, wid)
            assert w["queued"] == 1 and w["running"] == held[wid], w
        assert ordered["inflight"] == 20 and ordered["placed"] == 20
        timings = {a.id: server.get(f"/v1/requests/{a.id}") for a in answers}
        for rid, t in timings.items():
            assert t["placements"] == 1 and t["outcome"] == "ok"
            assert (t["worker"] in sources) == (rid in {held[s] for s in sources}), t
        return plan, answers, prompts

    # merge the two CP1 siblings into one CP2
    plan, answers, prompts = asyncio.run(wave("merge", "merge", cp1[0]))
    assert plan["op"] == "merge" and [s["id"] for s in plan["sources"]] == cp1
    assert [t["degree"] for t in plan["targets"]] == [2] and plan["epoch"] > before["epoch"]
    for ids, p in zip(_ids(answers), prompts, strict=True):
        assert ids == generate(cfg, tok.encode(p), 8, [EOS])
    mid = server.get("/v1/pool")
    assert mid["composition"] == "2xCP2" and mid["epoch"] == plan["epoch"]
    merged = _worker(mid, plan["targets"][0]["id"])
    assert merged["state"] == "active" and merged["epoch"] == plan["epoch"] and merged["ranks"] == [2, 3]

    # split the original CP2 into two CP1 workers
    plan2, answers2, prompts2 = asyncio.run(wave("split", "split", cp2))
    assert plan2["op"] == "split" and [s["id"] for s in plan2["sources"]] == [cp2]
    assert sorted(t["ranks"][0] for t in plan2["targets"]) == [0, 1] and plan2["epoch"] > plan["epoch"]
    for ids, p in zip(_ids(answers2), prompts2, strict=True):
        assert ids == generate(cfg, tok.encode(p), 8, [EOS])
    after = server.get("/v1/pool")
    assert after["composition"] == "2xCP1+1xCP2" and after["epoch"] == plan2["epoch"]
    assert after["reconfigs_done"] == before["reconfigs_done"] + 2
    assert counters.delta("vertumnus_reconfigurations_total", 'op="merge"') == 1
    assert counters.delta("vertumnus_reconfigurations_total", 'op="split"') == 1
    assert counters.delta("vertumnus_reconfiguration_seconds_count", 'stage="drain"') == 2
    assert counters.delta("vertumnus_requests_total", 'outcome="ok"') == 40
    assert counters.delta("vertumnus_requests_total", 'outcome="error"') == 0


def test_the_children_of_a_split_take_over_the_backlog_queued_during_its_drain(server: Server) -> None:
    """``scheduler.rebalance_on_activate``: when the split commits, the requests queued meanwhile on the other
    workers are placed again (arrival order, J), so the idle children start on the backlog at once instead of
    waiting for later arrivals. The three original workers hold their first prefill at its start (named holds:
    the children are not held); the CP2 worker's queued requests go to the CP1 workers when the split drains it;
    releasing the CP2 worker alone lets its running prefill finish and the split commit while every other
    request still waits on a held CP1 worker — so exactly those are placed again, whatever the machine's speed."""
    cfg = server.cfg.model
    tok = tokenizer(cfg)
    before = server.get("/v1/pool")
    counters = server.counters()
    originals = [w["id"] for w in before["workers"]]
    (cp2,) = [w["id"] for w in before["workers"] if w["degree"] == 2]
    prompts = _prompts("backlog", 12, 40, 10)

    async def run() -> tuple[list[Any], dict[str, Any], dict[str, Any]]:
        server.hold(originals, at="start")
        traffic = asyncio.create_task(complete_greedy(server, prompts, 4))
        busy = await _until(
            server,
            lambda p: p["placed"] == 12 and all(w["running"] for w in p["workers"] if w["queued"]),
            "all 12 requests placed, one running on every busy worker",
        )
        assert _worker(busy, cp2)["running"], busy  # the CP2 worker runs one: the split must drain it
        plan = server.reconfigure("split", cp2, wait=False)
        drained = await _until(server, lambda p: _worker(p, cp2)["queued"] == 1, "the CP2 worker's queue withdrawn")
        server.release([cp2])
        done = await _until(server, lambda p: p["reconfiguring"] is None, "the split committed")
        server.release()
        return await traffic, plan, {"drained": drained, "done": done}

    answers, plan, seen = asyncio.run(run())
    for a, p in zip(answers, prompts, strict=True):
        assert a.choices[0].token_ids == generate(cfg, tok.encode(p), 4, [EOS])
    children = {t["id"] for t in plan["targets"]}
    # at the commit every request but the running ones (the CP2 worker's finished) waited on a held CP1 worker
    rows = seen["drained"]["workers"]
    running = sum(1 for w in rows if w["running"])
    waiting = sum(w["queued"] - (1 if w["running"] else 0) for w in rows if w["id"] != cp2)
    assert waiting == 12 - running > 0
    assert counters.delta("vertumnus_requests_rebalanced_total") == waiting
    timings = [server.get(f"/v1/requests/{a.id}") for a in answers]
    served = {t["worker"] for t in timings}
    assert children <= served, (children, timings)  # both children took part of the backlog
    assert all(t["placements"] == 1 and t["outcome"] == "ok" for t in timings)  # none ran twice
    assert counters.delta("vertumnus_requests_total", 'outcome="ok"') == 12


def test_a_prefix_cached_before_a_split_is_reconciled_from_the_sibling(server: Server) -> None:
    """DESIGN §2/§4: a split leaves each child the parent's blocks on its own ranks (block b on rank b mod 2:
    the lower child b0 b2 b4 ..., the upper b1 b3 ...) and assigns each retained prefix to one child, where the
    blocks it lacks are pending; on first reuse there the missing half is copied from the sibling (RECONCILE:
    export on the sibling's ranks, import here). Placement prices the pending prefix (``cache.price_pending``),
    so requests for it go to that child, and those queued behind the reconciling one reuse what it brings.

    Exact expectations need a parent whose only retained prefix is this one: which child a prefix is assigned
    to depends on the demand of every other prefix the parent retains (reuses by earlier tests, decaying with
    the scans). The parent is therefore failed first (test hook) and restarts with an empty cache. Its one
    prefix (no reuse yet, demand 0) then goes to the lower child (tie → lower). Four identical arrivals placed
    before any prefill starts all go to the lower child (its pending prefix plus the copy of the missing half
    is far cheaper than a cold prefill, even behind three queued ones); the first reconciles once, and the
    three behind it in the FCFS queue reuse the reconciled prefix (the copy lands before the first prefill)."""
    cfg = server.cfg.model
    tok = tokenizer(cfg)
    pool = server.get("/v1/pool")
    (cp2,) = [w for w in pool["workers"] if w["degree"] == 2]
    server.post_admin("/v1/test/fail", {"worker": cp2["id"]})
    fresh = server.wait_pool(
        lambda p: _worker(p, cp2["id"])["state"] == "active" and _worker(p, cp2["id"])["epoch"] > cp2["epoch"],
        "the failed CP2 worker is back (empty cache)",
    )
    assert _worker(fresh, cp2["id"])["cached_blocks"] == 0
    prompt = _prompts("reconcile", 1, 560)[0]  # ~2000 tokens: the CP2 worker is the cheapest by the cost model
    ids = tok.encode(prompt)
    n = len(ids)
    want = generate(cfg, ids, 4, [EOS])
    c = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=600)
    first = c.completions.create(model="vertumnus-tiny", prompt=prompt, max_tokens=4, temperature=0)
    assert server.get(f"/v1/requests/{first.id}")["worker"] == cp2["id"]
    assert _worker(server.get("/v1/pool"), cp2["id"])["cached_blocks"] == n // 32
    plan = server.reconfigure("split", cp2["id"])
    lower, upper = (t["id"] for t in sorted(plan["targets"], key=lambda t: t["ranks"][0]))
    assert server.get("/v1/pool")["composition"] == "4xCP1"
    counters = server.counters()

    # four identical arrivals, all placed before any prefill starts
    server.hold()

    async def four() -> list[Any]:
        traffic = asyncio.create_task(complete_greedy(server, [prompt] * 4, 4))
        await _until(server, lambda p: p["placed"] == 4, "the four requests placed")
        server.release()
        return await traffic

    out = asyncio.run(four())
    assert all(o.choices[0].token_ids == want for o in out)
    timings = [server.get(f"/v1/requests/{o.id}") for o in out]
    assert [(t["worker"], t["placements"]) for t in timings] == [(lower, 1)] * 4, (lower, upper, timings)
    assert counters.delta("vertumnus_cache_ops_total", 'kind="reconcile"') == 1
    assert counters.delta("vertumnus_cache_op_failures_total", 'kind="reconcile"') == 0
    reused = 32 * ((n - 1) // 32)  # all of it but the last token's block
    assert [t["cached_tokens"] for t in timings] == [reused] * 4, timings
    assert counters.delta("vertumnus_prefix_cached_tokens_total") == 4 * reused


KILLER = """
import sys
import ray
ray.init(address=sys.argv[1], namespace="vertumnus", log_to_driver=False)
print("ready", flush=True)
for line in sys.stdin:
    ray.kill(ray.get_actor(line.strip(), namespace="vertumnus"), no_restart=True)
    print("killed", flush=True)
"""


class RayKiller:
    """A process connected to the server's Ray cluster ahead of time, so a kill lands within milliseconds.
    (The driver reads RAY_AUTH_MODE at import: the server's local cluster uses the token in ~/.ray/auth_token.)"""

    def __init__(self, address: str) -> None:
        env = {**os.environ, "RAY_AUTH_MODE": "token"}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", KILLER, address], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True
        )
        assert self.proc.stdout is not None and self.proc.stdout.readline().strip() == "ready"

    def kill(self, actor_name: str) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(actor_name + "\n")
        self.proc.stdin.flush()
        assert self.proc.stdout.readline().strip() == "killed"

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=60)


def test_rank_actor_killed_mid_prefill_is_recovered_without_losing_requests(server: Server) -> None:
    """Every worker holds its first prefill at its start (running, not yet on the ranks) and queues the rest;
    a rank of the CP2 worker is then killed. Its running and queued requests are re-placed on the (still held)
    CP1 workers and the worker stays FAILED (its restart's regroup waits behind the held prefills) until the
    release; then everything completes, once and correctly, and the worker is back under a new epoch."""
    cfg = server.cfg.model
    tok = tokenizer(cfg)
    prompts = _prompts("fault", 8, 500)  # ~2000-2700 tokens: the CP2 worker (cheapest) gets about every third
    expected = [generate(cfg, tok.encode(p), 4, [EOS]) for p in prompts]
    counters = server.counters()
    killer = RayKiller(server.ray_address)
    try:

        async def run() -> tuple[list[Any], dict[str, Any], dict[str, Any], dict[str, Any]]:
            server.hold(at="start")
            traffic = asyncio.create_task(complete_greedy(server, prompts, 4))
            placed = await _until(
                server,
                lambda p: p["placed"] == len(prompts) and all(w["running"] for w in p["workers"] if w["queued"]),
                "every request placed, one running on every busy worker",
            )
            # every worker busy (so the restart's regroup waits for the release and FAILED stays visible); the
            # victim with a running prefill and queued ones: all of them are unfinished when the rank dies
            assert all(w["running"] for w in placed["workers"]), placed["workers"]
            (victim,) = [w for w in placed["workers"] if w["degree"] == 2]
            assert victim["queued"] >= 2, victim
            killer.kill(f"vertumnus-{server.proc.pid}-rank-{victim['ranks'][-1]}")
            failed = await _until(
                server,
                lambda p: _worker(p, victim["id"])["state"] == "failed" and p["placed"] == len(prompts),
                "the worker FAILED, its requests re-placed",
            )
            server.release()
            answers = await traffic

            def restarted(p: dict[str, Any]) -> bool:
                w = _worker(p, victim["id"])
                return bool(w["state"] == "active" and w["epoch"] > victim["epoch"])

            back = await _until(server, restarted, "the worker back ACTIVE under a new epoch")
            return answers, victim, _worker(failed, victim["id"]), _worker(back, victim["id"])

        answers, victim, failed, back = asyncio.run(run())
    finally:
        killer.close()
    assert _ids(answers) == expected  # every request answered, correctly, once (one HTTP response each)
    assert counters.delta("vertumnus_requests_total", 'outcome="ok"') == len(prompts)
    assert counters.delta("vertumnus_requests_total", 'outcome="error"') == 0
    assert counters.delta("vertumnus_worker_failures_total") == 1
    assert failed["queued"] == 0 and failed["cached_blocks"] == 0  # re-placed; the trie dropped its holdings
    assert back["ranks"] == victim["ranks"] and back["cached_blocks"] == 0
    # the running prefill started twice (on the victim, then elsewhere); the queued ones never started there
    timings = {a.id: server.get(f"/v1/requests/{a.id}") for a in answers}
    moved = {rid: t for rid, t in timings.items() if victim["id"] in t["workers"]}
    assert list(moved) == [victim["running"]]
    assert moved[victim["running"]]["placements"] == 2 and moved[victim["running"]]["workers"][0] == victim["id"]
    assert all(t["placements"] == 1 for rid, t in timings.items() if rid != victim["running"])
    assert counters.delta("vertumnus_request_replacements_total") == 1
    # the restarted worker serves correctly again (alone, a new ~2000-token prompt goes to the CP2 worker)
    fresh = _prompts("again", 1, 500)
    (again,) = asyncio.run(complete_greedy(server, fresh, 4))
    assert again.choices[0].token_ids == generate(cfg, tok.encode(fresh[0]), 4, [EOS])
    assert server.get(f"/v1/requests/{again.id}")["worker"] == victim["id"]
