"""End to end through the real server (subprocess, own Ray cluster, torch CP engine, decode actor), with the
controller off so the composition only changes when a test orders it. On the session's shared server (also
used by test_server_reconfig_faults.py): each test starts from the state the ``shared`` fixture establishes
(conftest.py) and asserts counters as deltas."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx
import openai
import pytest
from server_harness import CANONICAL, Server, layout
from serving_reference import generate, tokenizer

from vertumnus.serving.sampling import SamplingParams
from vertumnus.serving.tokenizer import END, EOS

pytestmark = pytest.mark.slow


@pytest.fixture
def server(shared: Server) -> Server:
    return shared


def client(server: Any) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=300)


def shared_prefixes(n: int) -> list[str]:
    return [f"System prompt {k}: " + " ".join(f"rule-{k}-{i}" for i in range(40)) for k in range(n)]


def test_models_health_and_pool(server: Any) -> None:
    assert server.get("/health") == {"status": "ok"}
    models = server.get("/v1/models")
    assert [m["id"] for m in models["data"]] == ["vertumnus-tiny"]
    pool = server.get("/v1/pool")
    assert pool["composition"] == "2xCP1+1xCP2" and pool["engine"] == "torch"
    assert layout(pool) == CANONICAL
    assert all(w["state"] == "active" and w["engine"] == "torch" for w in pool["workers"])
    assert len({w["id"] for w in pool["workers"]}) == 3
    assert server.ray_address


def test_fifty_concurrent_requests_with_shared_prefixes(server: Any) -> None:
    prefixes = shared_prefixes(5)
    before = server.counters()

    async def run() -> list[Any]:
        c = client(server)
        # one request per prefix first: a prefix becomes reusable once a worker reported storing it
        for p in prefixes:
            await c.completions.create(model="vertumnus-tiny", prompt=f"{p} warm-up", max_tokens=1)
        calls = []
        for i in range(50):
            p = prefixes[i % 5]
            if i % 3 == 0:
                calls.append(
                    c.chat.completions.create(
                        model="vertumnus-tiny",
                        messages=[{"role": "system", "content": p}, {"role": "user", "content": f"question {i}"}],
                        max_tokens=6,
                        temperature=0,
                    )
                )
            else:
                calls.append(
                    c.completions.create(
                        model="vertumnus-tiny",
                        prompt=f"{p} question {i}",
                        max_tokens=6,
                        temperature=0,
                        user=f"user-{i % 7}",
                    )
                )
        out = await asyncio.gather(*calls)
        await c.close()
        return out

    responses = asyncio.run(run())
    assert len(responses) == 50
    cached = 0
    for r in responses:
        assert len(r.choices) == 1 and r.choices[0].finish_reason in ("stop", "length")
        assert 1 <= r.usage.completion_tokens <= 6
        cached += r.usage.prompt_tokens_details.cached_tokens
        timing = server.get(f"/v1/requests/{r.id}")
        assert timing["outcome"] == "ok" and timing["placements"] == 1
        assert timing["user"] in {f"user-{k}" for k in range(7)} | {None}
        assert timing["cached_tokens"] == r.usage.prompt_tokens_details.cached_tokens
        t = timing["timing_s"]
        assert 0 <= t["queue"] <= t["ttft"] and t["prefill"] > 0 and t["handoff"] >= 0
    # prefix hits: the same tokens in the responses, the timelines and the counter; the trie holds blocks
    assert cached > 0 and cached % 32 == 0
    assert before.delta("vertumnus_prefix_cached_tokens_total") == cached
    assert sum(w["cached_blocks"] for w in server.get("/v1/pool")["workers"]) > 0
    assert before.delta("vertumnus_requests_total", 'outcome="ok"') == 5 + 50


def test_greedy_and_seeded_answers_equal_the_reference_model(server: Any) -> None:
    cfg = server.cfg.model
    tok = tokenizer(cfg)
    prompts = ["Hello, Vertumnus!", shared_prefixes(1)[0] + " question 3", "x" * 700]

    async def run() -> None:
        c = client(server)
        for p in prompts:
            r = await c.completions.create(
                model="vertumnus-tiny", prompt=p, max_tokens=12, temperature=0, extra_body={"return_token_ids": True}
            )
            want = generate(cfg, tok.encode(p), 12, [EOS])
            assert r.choices[0].token_ids == want
            assert r.choices[0].text == tok.decode(want)
            assert r.choices[0].finish_reason == ("stop" if want[-1] == EOS else "length")
        ids = [5, 17, 300, 42] * 20  # token-id prompt (no BOS)
        r = await c.completions.create(
            model="vertumnus-tiny",
            prompt=ids,
            max_tokens=10,
            temperature=0,
            extra_body={"return_token_ids": True, "ignore_eos": True},
        )
        assert r.choices[0].token_ids == generate(cfg, ids, 10, [])
        chat = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi there"}]
        r2 = await c.chat.completions.create(
            model="vertumnus-tiny", messages=chat, max_tokens=10, temperature=0, extra_body={"return_token_ids": True}
        )
        from vertumnus.serving.tokenizer import ChatTurn

        chat_ids = tok.apply_chat_template([ChatTurn(m["role"], m["content"]) for m in chat])
        assert r2.choices[0].token_ids == generate(cfg, chat_ids, 10, [EOS, END])
        params = SamplingParams(max_tokens=10, temperature=0.8, top_p=0.9, seed=1234)
        got = []
        for _ in range(2):
            r = await c.completions.create(
                model="vertumnus-tiny",
                prompt="sampled",
                max_tokens=10,
                temperature=0.8,
                top_p=0.9,
                seed=1234,
                extra_body={"return_token_ids": True, "ignore_eos": True},
            )
            got.append(r.choices[0].token_ids)
        assert got[0] == got[1] == generate(cfg, tok.encode("sampled"), 10, [], params)
        await c.close()

    asyncio.run(run())


def test_max_tokens_stop_strings_and_streaming(server: Any) -> None:
    cfg = server.cfg.model
    tok = tokenizer(cfg)
    prompt = "The quick brown fox"
    full = generate(cfg, tok.encode(prompt), 24, [])
    text = tok.decode(full)
    stop = next(text[i : i + 2] for i in range(2, len(text) - 2) if text[i : i + 2].isprintable())

    async def run() -> None:
        c = client(server)
        r = await c.completions.create(
            model="vertumnus-tiny", prompt=prompt, max_tokens=5, temperature=0, extra_body={"ignore_eos": True}
        )
        assert r.usage.completion_tokens == 5 and r.choices[0].finish_reason == "length"
        r = await c.completions.create(
            model="vertumnus-tiny",
            prompt=prompt,
            max_tokens=24,
            temperature=0,
            stop=[stop],
            extra_body={"ignore_eos": True},
        )
        assert r.choices[0].text == text[: text.find(stop)] and r.choices[0].finish_reason == "stop"
        stream = await c.completions.create(
            model="vertumnus-tiny",
            prompt=prompt,
            max_tokens=24,
            temperature=0,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        pieces = [ch.choices[0].text async for ch in stream if ch.choices]
        assert "".join(pieces) == text
        chat = await c.chat.completions.create(
            model="vertumnus-tiny",
            messages=[{"role": "user", "content": "yo"}],
            max_tokens=4,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [ch async for ch in chat]
        assert chunks[0].choices[0].delta.role == "assistant"
        assert chunks[-1].usage is not None and 1 <= chunks[-1].usage.completion_tokens <= 4
        assert chunks[-2].choices[0].finish_reason in ("stop", "length")
        await c.close()

    asyncio.run(run())


def _post(server: Any, path: str, body: Any, headers: dict[str, str] | None = None) -> httpx.Response:
    data = body if isinstance(body, (bytes, str)) else json.dumps(body)
    return httpx.post(
        server.url + path, content=data, timeout=60, headers={"Content-Type": "application/json", **(headers or {})}
    )


def _err(r: httpx.Response, status: int, code: str | None = None) -> dict[str, Any]:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    if code is not None:
        assert err["code"] == code
    return err


def test_bad_inputs_get_openai_errors_and_the_server_keeps_serving(server: Any) -> None:
    before = server.counters()
    _err(_post(server, "/v1/completions", b"{not json"), 400, "invalid_json")
    e = _err(_post(server, "/v1/completions", {"model": "vertumnus-tiny"}), 422)
    assert e["param"] == "prompt"
    e = _err(_post(server, "/v1/completions", {"model": "vertumnus-tiny", "prompt": "x", "max_tokens": "many"}), 422)
    assert e["param"] == "max_tokens"
    _err(_post(server, "/v1/completions", {"model": "vertumnus-tiny", "prompt": "x", "n": 2}), 422)
    _err(_post(server, "/v1/chat/completions", {"model": "vertumnus-tiny", "messages": []}), 422)
    e = _err(_post(server, "/v1/completions", {"model": "gpt-4", "prompt": "x"}), 404, "model_not_found")
    assert e["param"] == "model"
    e = _err(_post(server, "/v1/completions", {"model": "vertumnus-tiny", "prompt": [1, 2, 512]}), 400)
    assert e["code"] == "invalid_token_ids"
    too_long = "a" * 8192  # + BOS = 8193 tokens > max_model_len 8192
    e = _err(
        _post(server, "/v1/completions", {"model": "vertumnus-tiny", "prompt": too_long}),
        400,
        "context_length_exceeded",
    )
    assert "8193 tokens" in e["message"] and "8192" in e["message"]
    _err(
        _post(server, "/v1/completions", {"model": "vertumnus-tiny", "prompt": "a" * 8000, "max_tokens": 500}),
        400,
        "context_length_exceeded",
    )
    assert before.delta("vertumnus_requests_total", 'outcome="invalid"') == 7
    # the official client maps them to its typed errors
    c = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.NotFoundError):
        c.completions.create(model="nope", prompt="x")
    with pytest.raises(openai.BadRequestError, match="8192"):
        c.completions.create(model="vertumnus-tiny", prompt=too_long)
    # admin and introspection errors
    _err(_post(server, "/v1/pool/reconfigure", {"op": "split", "worker": 0}), 401, "invalid_admin_token")
    _err(_post(server, "/v1/pool/reconfigure", {"op": "split", "worker": 0}, {"Authorization": "Bearer wrong"}), 401)
    _err(_post(server, "/v1/pool/reconfigure", {"op": "grow", "worker": 0}, server.admin), 422)
    _err(
        _post(server, "/v1/pool/reconfigure", {"op": "split", "worker": 99}, server.admin),
        409,
        "reconfiguration_refused",
    )
    _err(httpx.get(server.url + "/v1/requests/cmpl-unknown"), 404, "not_found")
    # nothing crashed: normal traffic still works
    r = c.completions.create(model="vertumnus-tiny", prompt="still alive?", max_tokens=3)
    assert r.choices[0].finish_reason in ("stop", "length")
    assert server.get("/health") == {"status": "ok"}


def test_over_the_admission_limit_gets_429_with_retry_after(server: Server) -> None:
    limit = server.cfg.serving.max_inflight
    body = {"model": "vertumnus-tiny", "prompt": "flood " * 40, "max_tokens": 48, "ignore_eos": True}
    before = server.counters()
    server.hold()  # no prefill finishes: exactly `limit` requests are admitted, the other 40 are refused

    async def run() -> tuple[list[httpx.Response], int]:
        async with httpx.AsyncClient(
            base_url=server.url, timeout=600, limits=httpx.Limits(max_connections=limit + 40)
        ) as c:
            tasks = [asyncio.create_task(c.post("/v1/completions", json=body)) for _ in range(limit + 40)]
            deadline = time.monotonic() + 120
            while sum(t.done() for t in tasks) < 40 and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            inflight = (await c.get("/v1/pool")).json()["inflight"]
            server.release()
            return list(await asyncio.gather(*tasks)), inflight

    out, inflight = asyncio.run(run())
    assert inflight == limit
    limited = [r for r in out if r.status_code == 429]
    ok = [r for r in out if r.status_code == 200]
    assert len(limited) == 40 and len(ok) == limit
    for r in limited:
        assert r.headers["Retry-After"] == "1"
        assert r.json()["error"]["type"] == "rate_limit_error"
    for r in ok:
        assert r.json()["usage"]["completion_tokens"] == 48
    assert before.delta("vertumnus_requests_total", 'outcome="rate_limited"') == 40
    assert before.delta("vertumnus_requests_total", 'outcome="ok"') == limit
    assert server.get("/v1/pool")["inflight"] == 0


def test_client_disconnect_mid_stream_frees_its_resources(server: Any) -> None:
    body = {"model": "vertumnus-tiny", "prompt": "stream me", "max_tokens": 4000, "ignore_eos": True, "stream": True}
    before = server.counters()
    with httpx.Client(base_url=server.url, timeout=60) as c, c.stream("POST", "/v1/completions", json=body) as resp:
        assert resp.status_code == 200
        lines = resp.iter_lines()
        first = next(ln for ln in lines if ln.startswith("data: "))
        rid = json.loads(first[6:])["id"]
        for _ in range(3):
            next(lines)
    # the client is gone: decode must stop and free the sequence, the admission slot must come back
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        pool = server.get("/v1/pool")
        timing = server.get(f"/v1/requests/{rid}")
        if pool["decode"]["active"] == 0 and pool["inflight"] == 0 and timing["outcome"] == "cancelled":
            break
        time.sleep(0.2)
    assert timing["outcome"] == "cancelled"
    assert pool["decode"]["active"] == 0 and pool["inflight"] == 0
    assert 0 < timing["completion_tokens"] < 4000
    assert before.delta("vertumnus_requests_total", 'outcome="cancelled"') == 1


def test_ttft_slo_extension_drives_token_weighted_attainment(server: Any) -> None:
    tok = tokenizer(server.cfg.model)
    prompt = "slo accounting " * 10
    n = len(tok.encode(prompt))
    attained0 = server.metric("vertumnus_slo_attained_tokens_total")
    total0 = server.metric("vertumnus_slo_tokens_total")
    c = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    missed = c.completions.create(
        model="vertumnus-tiny", prompt=prompt, max_tokens=1, extra_body={"ttft_slo_ms": 0.001}
    )
    assert server.get(f"/v1/requests/{missed.id}")["slo_s"] == 1e-6
    assert server.metric("vertumnus_slo_tokens_total") - total0 == n
    assert server.metric("vertumnus_slo_attained_tokens_total") == attained0
    c.completions.create(model="vertumnus-tiny", prompt=prompt, max_tokens=1, extra_body={"ttft_slo_ms": 600000})
    assert server.metric("vertumnus_slo_tokens_total") - total0 == 2 * n
    assert server.metric("vertumnus_slo_attained_tokens_total") - attained0 == n


def test_external_decode_backend_against_an_openai_endpoint(server: Any) -> None:
    """serving.decode_url's backend, pointed at this server as the external decode endpoint."""
    from vertumnus.serving.external_decode import ExternalDecode
    from vertumnus.serving.handoff import DecodeRequest, Handoff

    cfg = server.cfg.model
    ids = tokenizer(cfg).encode("decode me elsewhere")

    async def run() -> tuple[list[int], str | None, dict[str, Any]]:
        backend = ExternalDecode(server.url, "vertumnus-tiny")
        await backend.start()
        got: list[int] = []
        reason = None
        req = DecodeRequest(Handoff("ext-1", ids), SamplingParams(max_tokens=9, temperature=0.0), frozenset({EOS}))
        async for chunk in backend.stream(req):
            got.extend(chunk.token_ids)
            reason = chunk.finish_reason or reason
        stats = await backend.stats()
        await backend.close()
        return got, reason, stats

    got, reason, stats = asyncio.run(run())
    want = generate(cfg, ids, 9, [EOS])
    assert got == want
    assert reason == ("stop" if want[-1] == EOS else "length")
    assert stats == {"backend": "external", "url": server.url, "active": 0}

    async def with_logprobs() -> tuple[list[int], list[Any]]:
        # logprobs pass through (vLLM's request shape: logprobs + return_tokens_as_token_ids)
        backend = ExternalDecode(server.url, "vertumnus-tiny")
        await backend.start()
        got, lps = [], []
        params = SamplingParams(max_tokens=5, temperature=0.0, logprobs=2)
        async for chunk in backend.stream(DecodeRequest(Handoff("ext-2", ids), params, frozenset())):
            got.extend(chunk.token_ids)
            lps.extend(chunk.logprobs or [])
        await backend.close()
        return got, lps

    got, lps = asyncio.run(with_logprobs())
    assert got == generate(cfg, ids, 5, []) and len(lps) == 5
    for t, lp in zip(got, lps, strict=True):
        assert lp.top[0][0] == t and lp.top[0][1] == pytest.approx(lp.logprob)  # greedy: the best alternative
        assert len(lp.top) == 2 and lp.top[1][1] <= lp.logprob <= 0.0
