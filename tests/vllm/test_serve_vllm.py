"""`vertumnus serve --config configs/local-vllm.yaml` as a user runs it (subprocess, own Ray cluster), shrunk to
one prefill worker to keep the engine count at two (prefill worker + embedded decode engine): the OpenAI API
answers from vLLM engines, the prefill's KV reaches the decode engine through the ExampleConnector, greedy
generation is deterministic, and a repeated prompt is served from the worker's prefix cache."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from vertumnus.ports import free_port

pytestmark = pytest.mark.vllm
REPO = Path(__file__).resolve().parents[2]


def metric(url: str, name: str) -> float:
    for line in httpx.get(f"{url}/metrics", timeout=30).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return 0.0


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("serve-vllm")
    data: dict[str, Any] = yaml.safe_load((REPO / "configs" / "local-vllm.yaml").read_text())
    data["pool"].update(gpus_per_node=1, initial_composition="1xCP1")
    data["serving"]["cpu_slots"] = 1
    data["vllm"]["kv_connector_extra_config"] = {"shared_storage_path": str(tmp / "kv")}
    data["vllm"]["start_timeout_s"] = 1500
    cfg = tmp / "serve.yaml"
    cfg.write_text(yaml.safe_dump(data))
    port = free_port("127.0.0.1")
    log = tmp / "serve.log"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("RAY_ADDRESS", None)
    cmd = [sys.executable, "-m", "vertumnus.cli.main", "serve", "--config", str(cfg), "--port", str(port)]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 1800
        while True:
            assert proc.poll() is None, f"server exited:\n{log.read_text(errors='replace')[-4000:]}"
            try:
                if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, f"server not healthy:\n{log.read_text(errors='replace')[-4000:]}"
            time.sleep(1)
        yield url
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)


def test_openai_completions_from_vllm_workers(server: str) -> None:
    pool = httpx.get(f"{server}/v1/pool", timeout=30).json()
    assert pool["engine"] == "vllm" and [w["state"] for w in pool["workers"]] == ["active"]
    prompt = "Vertumnus routes prefills to vLLM workers. " * 12  # 516 bytes + BOS = 517 ids: 4 trie blocks
    body = {"model": "vertumnus-tiny", "prompt": prompt, "max_tokens": 8, "temperature": 0, "ignore_eos": True,
            "return_token_ids": True}  # fmt: skip
    first = httpx.post(f"{server}/v1/completions", json=body, timeout=600).json()
    assert first["usage"]["completion_tokens"] == 8 and len(first["choices"][0]["token_ids"]) == 8
    decode = httpx.get(f"{server}/v1/pool", timeout=30).json()["decode"]
    assert decode["backend"] == "vllm" and decode["cached_prompt_tokens"] == 512  # (517 - 2) // 32 * 32 loaded
    cached0 = metric(server, "vertumnus_prefix_cached_tokens_total")
    second = httpx.post(f"{server}/v1/completions", json=body, timeout=600).json()
    assert second["choices"][0]["token_ids"] == first["choices"][0]["token_ids"]  # greedy, same engines
    assert metric(server, "vertumnus_prefix_cached_tokens_total") - cached0 == 512  # the worker's prefix cache
    assert httpx.get(f"{server}/v1/pool", timeout=30).json()["workers"][0]["cached_blocks"] == 4
    # the backend's own counters are on the server's /metrics and in /v1/pool, and agree
    stats = httpx.get(f"{server}/v1/pool", timeout=30).json()["engine_stats"]
    stored = metric(server, 'vertumnus_vllm_kv_events_total{kind="stored"}')
    assert stored == stats["kv_events"]["stored"] >= 1  # BlockStored events (each may carry several blocks)
    assert metric(server, 'vertumnus_vllm_kv_events_total{kind="malformed"}') == 0
    assert metric(server, "vertumnus_vllm_engine_start_seconds_count") == len(stats["engine_start_s"]) >= 1
