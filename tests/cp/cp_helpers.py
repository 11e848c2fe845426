"""Shared helpers of the CP tests: a recording EngineEvents, job construction, reference logits."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch

from vertumnus.cache.block_keys import keys_from_tokens
from vertumnus.config import VertumnusConfig, config_from_dict
from vertumnus.cp.model import ReferenceModel
from vertumnus.interfaces import PrefillJob
from vertumnus.types import CacheOp, CacheReport, Placement, PrefillResult, Request

TOL = 1e-4


def tiny_config(
    gpus_per_node: int,
    degrees: Sequence[int],
    block_tokens: int = 8,
    capacity: int = 64,
    composition: str | None = None,
    **model: Any,
) -> VertumnusConfig:
    """A CPU pool of one node with a tiny fp32 model (2 layers, GQA 4/2 heads)."""
    return config_from_dict(
        {
            "pool": {
                "nodes": 1,
                "gpus_per_node": gpus_per_node,
                "degrees": list(degrees),
                "engine": "torch",
                "kv_capacity_blocks_per_rank": capacity,
                "initial_composition": composition,
            },
            "cache": {"block_tokens": block_tokens},
            "model": {
                "hidden_size": 64,
                "intermediate_size": 128,
                "num_heads": 4,
                "num_kv_heads": 2,
                "vocab_size": 256,
                **model,
            },
        }
    )


def tokens(n: int, seed: int, vocab: int = 256) -> list[int]:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def job(
    rid: str,
    toks: list[int],
    worker_id: int,
    degree: int,
    block_tokens: int,
    max_reuse_blocks: int = 10**6,
    reconcile: CacheOp | None = None,
) -> PrefillJob:
    keys = keys_from_tokens(toks, block_tokens)
    req = Request(rid, 0.0, len(toks), keys, token_ids=toks)
    pl = Placement(rid, worker_id, degree, 0, len(toks), 0.0, 0.0, 0.0, degree, 0)
    return PrefillJob(req, pl, reconcile, max_reuse_blocks)


def reference_logits(model: ReferenceModel, toks: list[int]) -> torch.Tensor:
    return model.prefill(toks)[0]


class Recorder:
    """EngineEvents that records every callback; tests wait on conditions over the record."""

    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []
        self._cv = threading.Condition()
        self.on_done: Callable[[PrefillResult], None] | None = None
        # Runs on the data plane's driver thread, which handles no rank reply meanwhile: a test can hold a worker's
        # next dispatch (its running job cannot complete) while it sets up a queue.
        self.on_started: Callable[[int, str], None] | None = None

    def _add(self, kind: str, payload: Any) -> None:
        with self._cv:
            self.events.append((kind, payload))
            self._cv.notify_all()

    def wait(self, pred: Callable[[], bool], timeout: float = 120.0) -> None:
        with self._cv:
            if not self._cv.wait_for(pred, timeout):
                raise AssertionError(f"timed out; events so far: {[(k, p) for k, p in self.events][-20:]}")

    def of(self, kind: str) -> list[Any]:
        with self._cv:
            return [p for k, p in self.events if k == kind]

    def done(self, rid: str) -> PrefillResult:
        self.wait(lambda: any(r.request_id == rid for r in self.of("done")))
        return next(r for r in self.of("done") if r.request_id == rid)

    def reports(self, worker_id: int) -> list[CacheReport]:
        return [r for r in self.of("report") if r.worker_id == worker_id]

    # EngineEvents
    def prefill_started(self, worker_id: int, request_id: str, now: float) -> None:
        self._add("started", (worker_id, request_id))
        if self.on_started is not None:
            self.on_started(worker_id, request_id)

    def prefill_done(self, result: PrefillResult) -> None:
        self._add("done", result)
        if self.on_done is not None:
            self.on_done(result)

    def cache_report(self, report: CacheReport) -> None:
        self._add("report", report)

    def cache_op_failed(self, op_id: int, reason: str) -> None:
        self._add("op_failed", (op_id, reason))

    def worker_parked(self, worker_id: int, now: float) -> None:
        self._add("parked", worker_id)

    def epoch_ack(self, worker_id: int, rank: int, epoch: int, now: float) -> None:
        self._add("ack", (worker_id, rank, epoch))

    def worker_failed(self, worker_id: int, reason: str, now: float) -> None:
        self._add("failed", (worker_id, reason))
