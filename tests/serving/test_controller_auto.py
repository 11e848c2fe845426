"""The controller reshapes the pool by itself: an idle pool merges, a load step splits, the end of the load
merges again (1-s windows, persistence 2, rules policy, measured tiny-CPU profile: κ ≈ 0.74 s of predicted work
per window and worker). Its own server (no other test touches it, so its counters start at zero), with the admin
endpoint disabled (no admin token).

The load step does not depend on the machine's speed: the controller's demand D_k is the predicted work of the
requests first placed in window k, so each burst is sent right after a window closed (``last_window`` of
/v1/pool advanced) and is placed long before that window ends — two bursts, two consecutive windows over θ_up."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import openai
import pytest
from server_harness import Server

pytestmark = pytest.mark.slow

BURST = 8  # ~2000-token prompts: ≈ 1.4 s of predicted CP4 work per window, ρ ≈ 1.9 ≫ θ_up = 0.8


@pytest.fixture(scope="module")
def server(server_factory: Any) -> Server:
    overrides = {"serving": {"admin_token": None}, "controller": {"policy": "rules"}}
    return server_factory(overrides)  # type: ignore[no-any-return]


def test_admin_endpoint_is_disabled_without_a_token(server: Server) -> None:
    for path, body in (("/v1/pool/reconfigure", {"op": "split", "worker": 0}), ("/v1/test/hold", {})):
        r = httpx.post(server.url + path, json=body, headers={"Authorization": "Bearer anything"})
        assert r.status_code == 403
        assert r.json()["error"]["code"] == "admin_disabled"


def _next_window(server: Server, after: int) -> dict[str, Any]:
    """The report of the first window with index > ``after`` once it has closed."""
    pool = server.wait_pool(
        lambda p: p["last_window"] is not None and p["last_window"]["index"] > after, f"window {after + 1} closes"
    )
    return dict(pool["last_window"])


def test_idle_pool_merges_load_step_splits_then_merges_back(server: Server) -> None:
    # idle: ρ = 0 < θ_low for 2 windows → merge, twice, down to one CP4 worker
    pool = server.wait_pool(lambda p: p["composition"] == "1xCP4" and p["reconfiguring"] is None, "merged to CP4")
    assert server.metric("vertumnus_reconfigurations_total", 'op="merge"') == 2  # since this server started
    assert server.metric("vertumnus_reconfigurations_total", 'op="split"') == 0
    epoch_merged = pool["epoch"]
    counters = server.counters()
    prompts = [f"load {i} " + " ".join(f"t{(i + j) % 89}" for j in range(560)) for i in range(2 * BURST)]

    async def load() -> tuple[list[Any], list[dict[str, Any]]]:
        c = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=600)
        tasks: list[asyncio.Task[Any]] = []
        windows = [_next_window(server, server.get("/v1/pool")["last_window"]["index"])]
        for b in range(2):  # a window just closed: this burst is placed in the next one
            for p in prompts[b * BURST : (b + 1) * BURST]:
                tasks.append(
                    asyncio.create_task(
                        c.completions.create(model="vertumnus-tiny", prompt=p, max_tokens=2, temperature=0)
                    )
                )
            windows.append(await asyncio.to_thread(_next_window, server, windows[-1]["index"]))
        out = await asyncio.gather(*tasks)
        await c.close()
        return list(out), windows

    answers, windows = asyncio.run(load())
    assert all(a.choices[0].finish_reason in ("stop", "length") for a in answers)
    idle, first, second = windows
    assert (first["index"], second["index"]) == (idle["index"] + 1, idle["index"] + 2)
    assert first["requests"] == second["requests"] == BURST
    assert first["direction"] == second["direction"] == "SPLIT" and (first["streak"], second["streak"]) == (1, 2)
    assert first["rho"] > 0.8 and second["rho"] > 0.8

    # load gone: one merge brings the pool back to one CP4 worker under a newer epoch
    pool = server.wait_pool(
        lambda p: p["composition"] == "1xCP4" and p["reconfiguring"] is None and p["epoch"] > epoch_merged + 1,
        "split, then merged back to CP4",
    )
    assert counters.delta("vertumnus_reconfigurations_total", 'op="split"') == 1
    assert counters.delta("vertumnus_reconfigurations_total", 'op="merge"') == 1
    assert counters.delta("vertumnus_requests_total", 'outcome="ok"') == 2 * BURST
    assert counters.delta("vertumnus_requests_total", 'outcome="error"') == 0
    assert pool["inflight"] == 0
