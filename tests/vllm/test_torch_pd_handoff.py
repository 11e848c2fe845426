"""Prefill in the torch CP engine, decode in vLLM: a real ``vertumnus serve`` (torch engine, one CP2 worker, a
tiny Qwen3 checkpoint directory, ``serving.decode_url`` + ``serving.kv_export_path``) in front of a real
``vllm serve`` (the same checkpoint, ``kv_consumer`` with the disk-based ``ExampleConnector`` reading that
directory).

The decode instance reports an external prefix-cache hit for the prompt's whole blocks and its greedy tokens
equal its own single-engine answer for the same prompt (computed by it before the hand-off, its local prefix cache
reset in between). A control shows the hit is not cosmetic: files of the right shape but wrong content change
the answer."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "serving"))
from server_harness import Server, start_server, stop_server

from vertumnus.config import ConfigError, config_from_dict
from vertumnus.cp.qwen3 import write_preset
from vertumnus.engines.torch.kv_export import ExampleConnectorExporter
from vertumnus.ports import free_port

pytestmark = pytest.mark.vllm
MODEL = "vertumnus-tiny"  # configs/test-serve.yaml's model.name: ExternalDecode asks the endpoint for it
BLOCK = 32  # vllm serve --block-size = serving.kv_export_block_size
HITS = "vllm:external_prefix_cache_hits_total"


@dataclass
class Env:
    vllm_url: str
    server: Server
    storage: Path


def metric(url: str, name: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=30).text
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + "{"))


def _start_vllm(ckpt: Path, storage: Path, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port("127.0.0.1")
    consumer = {
        "kv_connector": "ExampleConnector", "kv_role": "kv_consumer",
        "kv_connector_extra_config": {"shared_storage_path": str(storage)},
    }  # fmt: skip
    cmd = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(ckpt), "--skip-tokenizer-init",
        "--enforce-eager", "--dtype", "float32", "--block-size", str(BLOCK), "--max-model-len", "2048",
        "--served-model-name", MODEL, "--host", "127.0.0.1", "--port", str(port), "--enable-prefix-caching",
        "--kv-transfer-config", json.dumps(consumer),
    ]  # fmt: skip
    env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1",
           "VLLM_CPU_OMP_THREADS_BIND": "nobind"}  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 1200
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"vllm serve exited ({proc.returncode}); see {log}")
        try:
            if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"vllm serve did not become healthy; see {log}")
        time.sleep(1)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(30)


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    tmp = tmp_path_factory.mktemp("torch-pd")
    ckpt = write_preset("tiny-qwen3", tmp / "tiny-qwen3", seed=0)
    storage = tmp / "kv"
    storage.mkdir()
    proc, url = _start_vllm(ckpt, storage, tmp / "vllm-serve.log")  # one vLLM process at a time, first
    try:
        overrides = {
            "pool": {"gpus_per_node": 2, "degrees": [1, 2], "initial_composition": "1xCP2"},
            "controller": {"enabled": False}, "cache": {"replication": False}, "model": {"path": str(ckpt)},
            "serving": {"cpu_slots": 2, "decode_actors": 0, "decode_url": url, "kv_export_path": str(storage),
                        "kv_export_block_size": BLOCK},
        }  # fmt: skip
        server = start_server(tmp, overrides)
        try:
            yield Env(url, server, storage)
        finally:
            stop_server(server.proc)
    finally:
        _stop(proc)


def _body(prompt: list[int]) -> dict[str, Any]:
    return {"model": MODEL, "prompt": prompt, "max_tokens": 8, "temperature": 0, "return_token_ids": True,
            "ignore_eos": True}  # fmt: skip


def _single_engine(url: str, storage: Path, prompt: list[int]) -> list[int]:
    """vLLM's own answer (no connector files for this prompt: it computes it), then its prefix cache emptied and
    the files its ExampleConnector stored for the prompt deleted (the connector saves every prompt it computed,
    also as kv_consumer), so only the torch engine's export can serve the next lookup."""
    ids: list[int] = httpx.post(f"{url}/v1/completions", json=_body(prompt), timeout=300).json()["choices"][0][
        "token_ids"
    ]
    assert len(ids) == 8
    assert httpx.post(f"{url}/reset_prefix_cache", timeout=60).status_code == 200
    for folder in storage.iterdir():
        shutil.rmtree(folder)
    return ids


@pytest.mark.parametrize(
    ("seed", "length", "hits", "folders"),
    [
        (3, 300, 288, 1),  # lookup (300 - 2) // 32 * 32 = load (300 - 1) // 32 * 32 = 288 tokens: one folder
        (5, 289, 256, 2),  # 288 = 9 blocks: the lookup covers 256 tokens, the load 288; both folders written
    ],
)
def test_vllm_decodes_from_the_torch_engines_prefill_kv(
    env: Env, seed: int, length: int, hits: int, folders: int
) -> None:
    prompt = np.random.default_rng(seed).integers(0, 512, length).tolist()
    single = _single_engine(env.vllm_url, env.storage, prompt)
    hits0 = metric(env.vllm_url, HITS)

    r = httpx.post(f"{env.server.url}/v1/completions", json=_body(prompt), timeout=600)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["token_ids"] == single
    assert metric(env.vllm_url, HITS) - hits0 == hits
    assert len(list(env.storage.iterdir())) == folders  # the torch engine's export only (see _single_engine)
    pool = env.server.get("/v1/pool")
    assert [w["degree"] for w in pool["workers"]] == [2]  # the KV came from both CP ranks, in sequence order


def test_wrong_kv_in_the_files_changes_the_answer(env: Env) -> None:
    """Control: the decode engine really continues from the loaded KV (it does not recompute the prompt)."""
    import torch

    prompt = np.random.default_rng(4).integers(0, 512, 300).tolist()
    single = _single_engine(env.vllm_url, env.storage, prompt)
    hits0 = metric(env.vllm_url, HITS)
    kv = torch.randn(2, 2, 2, 300, 64, generator=torch.Generator().manual_seed(0))  # tiny-qwen3: 2 layers, 2 Hkv
    ExampleConnectorExporter(env.storage, BLOCK).export(prompt, kv)
    wrong = httpx.post(f"{env.vllm_url}/v1/completions", json=_body(prompt), timeout=300).json()
    assert metric(env.vllm_url, HITS) - hits0 == 288
    assert wrong["choices"][0]["token_ids"] != single


@pytest.mark.parametrize(
    "overrides",
    [
        {"pool": {"engine": "torch"}, "serving": {"kv_export_path": "/tmp/kv"}},  # no decode_url
        {"pool": {"engine": "vllm"}, "serving": {"kv_export_path": "/tmp/kv", "decode_url": "http://x"}},
    ],
)
def test_kv_export_needs_the_torch_engine_and_a_decode_url(overrides: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match=r"serving\.kv_export_path: exports the torch engine's prefill KV"):
        config_from_dict(overrides)


@pytest.mark.parametrize("length", [2, 33, 34, 289, 300])
def test_export_folders_are_the_ones_the_connector_looks_up_and_loads(tmp_path: Path, length: int) -> None:
    """Against the ExampleConnector's own naming: its lookup (``_found_match_for_prompt``) finds the export and
    the folder its load reads (``ReqMeta.make_meta`` over the prompt) holds every layer's file of that many slots."""
    from types import SimpleNamespace

    import torch
    from safetensors.torch import load_file
    from vllm.distributed.kv_transfer.kv_connector.v1.example_connector import ExampleConnector, ReqMeta

    prompt = np.random.default_rng(length).integers(0, 512, length).tolist()
    kv = torch.randn(2, 2, 2, length, 64)
    out = ExampleConnectorExporter(tmp_path, BLOCK).export(prompt, kv)
    conn: Any = SimpleNamespace(_storage_path=str(tmp_path), _block_size=BLOCK)
    conn._generate_foldername_debug = lambda ids, mm, create_folder=False: ExampleConnector._generate_foldername_debug(
        conn, ids, mm, create_folder
    )
    if length <= BLOCK + 1:  # the lookup covers no whole block: vLLM computes the prompt, nothing is written
        assert out.tokens == 0 and not list(tmp_path.iterdir())
        assert not ExampleConnector._found_match_for_prompt(conn, prompt, [])
        return
    meta = ReqMeta.make_meta(prompt, list(range(length // BLOCK + 1)), BLOCK, False, [])
    assert out.tokens == len(meta.token_ids) == len(meta.slot_mapping)
    assert ExampleConnector._found_match_for_prompt(conn, prompt, [])
    folder = Path(conn._generate_foldername_debug(meta.token_ids, []))
    assert folder in out.folders
    for layer in range(2):
        t = load_file(str(folder / f"model.layers.{layer}.self_attn.attn.safetensors"))["kv_cache"]
        assert t.shape == (out.tokens, 2, 2 * 64) and t.dtype == torch.float32
