"""The controller reshapes the pool by itself: an idle pool merges, a load step splits, the end of the load
merges again (1-s windows, persistence 2, measured tiny-CPU profile: κ ≈ 0.7 s of predicted work per window
and worker). Its own server, with the admin endpoint disabled (no admin token)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import openai
import pytest

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(server_factory: Any) -> Any:
    return server_factory({"serving": {"admin_token": None}})


def wait_for(server: Any, pred: Any, timeout_s: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        pool = server.get("/v1/pool")
        if pred(pool) or time.monotonic() > deadline:
            return pool
        time.sleep(0.2)


def test_admin_endpoint_is_disabled_without_a_token(server: Any) -> None:
    r = httpx.post(
        server.url + "/v1/pool/reconfigure",
        json={"op": "split", "worker": 0},
        headers={"Authorization": "Bearer anything"},
    )
    assert r.status_code == 403
    assert r.json()["error"]["code"] == "admin_disabled"


def test_idle_pool_merges_load_step_splits_then_merges_back(server: Any) -> None:
    # idle: ρ = 0 < θ_low for 2 windows → merge, twice, down to one CP4 worker
    pool = wait_for(server, lambda p: p["composition"] == "1xCP4" and p["reconfiguring"] is None, 120)
    assert pool["composition"] == "1xCP4"
    assert server.metric("vertumnus_reconfigurations_total", 'op="merge"') == 2
    assert server.metric("vertumnus_reconfigurations_total", 'op="split"') == 0
    epoch_merged = pool["epoch"]

    # load step: ~8 requests/s of ~2000 tokens ≈ 1.4 s of predicted CP4 work per 1-s window ≫ θ_up·κ_4 ≈ 0.59 s
    async def load() -> list[Any]:
        c = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=600)
        tasks = []
        for i in range(40):
            prompt = f"load {i} " + " ".join(f"t{(i + j) % 89}" for j in range(560))
            tasks.append(
                asyncio.create_task(
                    c.completions.create(model="vertumnus-tiny", prompt=prompt, max_tokens=2, temperature=0)
                )
            )
            await asyncio.sleep(0.125)
        out = await asyncio.gather(*tasks)
        await c.close()
        return out

    answers = asyncio.run(load())
    assert all(a.choices[0].finish_reason in ("stop", "length") for a in answers)
    assert server.metric("vertumnus_reconfigurations_total", 'op="split"') >= 1
    windows = server.get("/v1/pool")["last_window"]
    assert windows is not None

    # load gone: merges bring the pool back to one CP4 worker under a newer epoch
    pool = wait_for(server, lambda p: p["composition"] == "1xCP4" and p["reconfiguring"] is None, 180)
    assert pool["composition"] == "1xCP4" and pool["epoch"] > epoch_merged
    assert server.metric("vertumnus_reconfigurations_total", 'op="merge"') >= 3
    assert server.metric("vertumnus_requests_total", 'outcome="ok"') == 40
    assert server.metric("vertumnus_requests_total", 'outcome="error"') == 0
