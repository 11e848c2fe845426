"""`vertumnus serve` with ``model.path`` at a tiny Qwen3-MoE checkpoint directory (torch engine, real server
subprocess, own Ray cluster, embedded decode actor): greedy answers equal the single-process reference of the
same checkpoint — on a fresh prefix, reusing it on the CP2 worker, after that worker is split into two CP1
workers (the prefix's missing half reconciled from the sibling) and after they are merged back."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "serving"))
from server_harness import Server, start_server, stop_server
from serving_reference import generate, tokenizer

from vertumnus.cp.qwen3 import write_preset
from vertumnus.serving.tokenizer import EOS

pytestmark = pytest.mark.slow
BLOCK = 32  # cache.block_tokens of configs/test-serve.yaml


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("qwen3-serve")
    ckpt = write_preset("tiny-qwen3-moe", tmp / "tiny-qwen3-moe", seed=0)
    overrides = {"controller": {"enabled": False}, "cache": {"replication": False}, "model": {"path": str(ckpt)}}
    s = start_server(tmp, overrides)
    yield s
    stop_server(s.proc)


def _worker(pool: dict[str, Any], wid: int) -> dict[str, Any]:
    return next(w for w in pool["workers"] if w["id"] == wid)


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def test_qwen3_moe_serves_with_prefix_reuse_split_and_merge(server: Server) -> None:
    cfg = server.cfg.model
    tok = tokenizer(cfg)
    c = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=600)
    assert server.get("/v1/models")["data"][0]["root"] == str(Path(cfg.path or "").resolve())
    base = "qwen3 moe: " + " ".join(f"w{j % 97}" for j in range(500))  # ~2000 tokens: the CP2 worker is cheapest
    n = len(tok.encode(base))
    seen: list[list[int]] = []  # prompts served so far (all on the one worker, or its children / parent)

    def reusable(ids: list[int]) -> int:
        """Tokens of ``ids`` in full blocks an earlier prompt stored (the last token is always computed)."""
        common = max((_common_prefix(ids, p) for p in seen), default=0)
        return BLOCK * min(common // BLOCK, (len(ids) - 1) // BLOCK)

    def ask(suffix: str) -> tuple[dict[str, Any], int]:
        prompt = base + suffix
        ids = tok.encode(prompt)
        r: Any = c.completions.create(
            model="vertumnus-tiny", prompt=prompt, max_tokens=6, temperature=0, extra_body={"return_token_ids": True}
        )
        assert r.choices[0].token_ids == generate(cfg, ids, 6, [EOS]), suffix
        cached = r.usage.prompt_tokens_details.cached_tokens
        assert cached == reusable(ids), suffix
        seen.append(ids)
        return server.get(f"/v1/requests/{r.id}"), cached

    (cp2,) = [w for w in server.get("/v1/pool")["workers"] if w["degree"] == 2]
    first, cached = ask("")
    assert first["worker"] == cp2["id"] and cached == 0
    assert _worker(server.get("/v1/pool"), cp2["id"])["cached_blocks"] == n // BLOCK

    again, cached = ask(" and a follow-up question")  # the prefix is reused on the worker holding it
    assert again["worker"] == cp2["id"] and cached >= BLOCK * (n // BLOCK)

    plan = server.reconfigure("split", cp2["id"])
    lower = min(plan["targets"], key=lambda t: t["ranks"][0])["id"]
    assert server.get("/v1/pool")["composition"] == "4xCP1"
    after_split, cached = ask(" after the split")  # the lower child reconciles the upper half's blocks
    assert after_split["worker"] == lower and cached >= BLOCK * (n // BLOCK)

    plan = server.reconfigure("merge", lower)
    assert server.get("/v1/pool")["composition"] == "2xCP1+1xCP2"
    merged = plan["targets"][0]["id"]
    after_merge, cached = ask(" after the merge")
    assert after_merge["worker"] == merged and cached >= BLOCK * (n // BLOCK)
