"""`vertumnus bench cp`: measured prefill time per CP degree, speed-up, and split / merge durations of the torch
engine on this machine (one thread per rank). A benchmark, not a test: it prints figures, asserts nothing.

Procedure: one node of ``max(degrees)`` ranks starts as a single worker of the largest degree. Each of
``repeats`` rounds walks the degrees largest first: the first worker prefills ``tokens`` fresh tokens (no
reuse), then is split (park → activate) down to the next degree; at the end of the round the workers are merged
back up. Rounds interleave the degrees so that load from other processes hits them alike; the fastest prefill
per degree and the slowest park / switch per kind are reported:

- prefill_s / speedup: wall time, dispatch to completion (what the pool sees); compute_s: the slowest rank's
  step; rank_cpu_s / cpu_speedup: the largest per-rank CPU time of the step (all threads of the rank's
  process, gloo's included). On a shared machine the wall figures include waiting for a core; the CPU figures
  do not, and bound the wall speed-up on free cores from above (they miss time spent blocked in collectives);
- park_s: ``park()`` until ``worker_parked`` (an idle worker: the step-boundary round trip);
- switch_s: ``activate()`` until every participating rank acknowledged the new epoch (the switch stage).

``model_path`` (a HF checkpoint directory, e.g. a written :mod:`vertumnus.cp.qwen3` preset) replaces the
Llama-style shape arguments. For a Qwen3-MoE model :func:`moe_vs_dense` adds the per-token time of the MoE path
against a dense Qwen3 model of the same active size (MLP width top_k × expert width), in this process.
"""

from __future__ import annotations

import os
import platform
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from vertumnus.config import config_from_dict
from vertumnus.cp.model import KVCache, ReferenceModel
from vertumnus.cp.weights import ModelDims, dims_from_hf_config, random_weights
from vertumnus.engines.torch.data_plane import TorchDataPlane
from vertumnus.interfaces import PrefillJob
from vertumnus.types import CacheReport, Placement, PrefillResult, ReconfigKind, ReconfigPlan, Request, WorkerGroup


class _Events:
    """EngineEvents recording completion, parking and acks (with monotonic times)."""

    def __init__(self) -> None:
        self.cv = threading.Condition()
        self.done: dict[str, PrefillResult] = {}
        self.parked: dict[int, float] = {}
        self.acks: list[tuple[int, int, int, float]] = []
        self.failures: list[str] = []

    def _note(self, fn: Callable[[], None]) -> None:
        with self.cv:
            fn()
            self.cv.notify_all()

    def wait(self, pred: Callable[[], bool], timeout: float) -> None:
        with self.cv:
            if not self.cv.wait_for(lambda: pred() or bool(self.failures), timeout):
                raise RuntimeError(f"benchmark timed out after {timeout:.0f} s")
            if self.failures:
                raise RuntimeError(f"benchmark failed: {self.failures[0]}")

    def prefill_started(self, worker_id: int, request_id: str, now: float) -> None:
        pass

    def prefill_done(self, result: PrefillResult) -> None:
        self._note(lambda: self.done.__setitem__(result.request_id, result))

    def cache_report(self, report: CacheReport) -> None:
        pass

    def cache_op_failed(self, op_id: int, reason: str) -> None:
        self._note(lambda: self.failures.append(f"cache op {op_id}: {reason}"))

    def worker_parked(self, worker_id: int, now: float) -> None:
        self._note(lambda: self.parked.__setitem__(worker_id, time.monotonic()))

    def epoch_ack(self, worker_id: int, rank: int, epoch: int, now: float) -> None:
        self._note(lambda: self.acks.append((worker_id, rank, epoch, time.monotonic())))

    def worker_failed(self, worker_id: int, reason: str, now: float) -> None:
        self._note(lambda: self.failures.append(f"worker {worker_id}: {reason}"))


def _job(rid: str, n: int, vocab: int, seed: int, group: WorkerGroup) -> PrefillJob:
    toks = torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()
    req = Request(rid, 0.0, n, (), token_ids=toks)
    return PrefillJob(req, Placement(rid, group.worker_id, group.degree, 0, n, 0.0, 0.0, 0.0, group.degree, 0), None, 0)


def run_cp_bench(
    tokens: int = 16384,
    degrees: tuple[int, ...] = (1, 2),
    *,
    layers: int = 2,
    hidden: int = 512,
    heads: int = 8,
    kv_heads: int = 2,
    intermediate: int = 1024,
    repeats: int = 2,
    attn_impl: str = "auto",
    timeout_s: float = 1800.0,
    progress: Callable[[str], None] | None = None,
    model_path: str | None = None,
) -> dict[str, Any]:
    """Run the benchmark (see module docstring) and return its figures as a JSON-ready dict."""
    degs = sorted(set(degrees), reverse=True)
    if not degs or any(d < 1 or d & (d - 1) for d in degs):
        raise ValueError(f"degrees must be powers of two, got {list(degrees)}")
    if tokens < 2 * degs[0]:
        raise ValueError(f"--tokens must be at least 2 × the largest degree ({2 * degs[0]})")
    say = progress or (lambda _msg: None)
    top = degs[0]
    model: dict[str, Any] = {
        "hidden_size": hidden,
        "num_heads": heads,
        "num_kv_heads": kv_heads,
        "intermediate_size": intermediate,
        "num_layers": layers,
        "vocab_size": 512,
    }
    if model_path is not None:
        import json
        from pathlib import Path

        hf = json.loads((Path(model_path) / "config.json").read_text())
        model = {"path": str(model_path), "vocab_size": int(hf["vocab_size"]), "name": Path(model_path).name}
        dims = dims_from_hf_config(hf)
    else:
        dims = ModelDims(512, hidden, intermediate, layers, heads, kv_heads, hidden // heads)
    vocab = int(model["vocab_size"])
    cfg = config_from_dict(
        {
            "pool": {
                "nodes": 1,
                "gpus_per_node": top,
                "degrees": sorted(degs),
                "engine": "torch",
                "max_model_len": max(tokens, 1),
            },
            "model": model,
        }
    )
    ev = _Events()
    park_s: dict[str, list[float]] = {"split": [], "merge": []}
    switch_s: dict[str, list[float]] = {"split": [], "merge": []}
    load_before = os.getloadavg()
    next_id = [0, 1]  # [request counter, epoch]
    with TorchDataPlane(cfg, attn_impl=attn_impl, timeout_s=timeout_s) as dp:
        cur = WorkerGroup(0, 0, 0, top)
        dp.start([cur], 0, ev)
        others: list[WorkerGroup] = []  # sibling workers created by splits (right halves), deepest last

        def reconfigure(kind: ReconfigKind, sources: tuple[WorkerGroup, ...], targets: tuple[WorkerGroup, ...]) -> None:
            epoch = next_id[1]
            next_id[1] += 1
            t0 = time.monotonic()
            dp.park([g.worker_id for g in sources])
            ev.wait(lambda: all(g.worker_id in ev.parked for g in sources), timeout_s)
            name = "split" if kind == ReconfigKind.SPLIT else "merge"
            park_s[name].append(max(ev.parked[g.worker_id] for g in sources) - t0)
            t1 = time.monotonic()
            dp.activate(ReconfigPlan(kind, sources, targets, epoch))
            want = sum(g.degree for g in targets)
            ev.wait(lambda: sum(1 for a in ev.acks if a[2] == epoch) == want, timeout_s)
            switch_s[name].append(max(a[3] for a in ev.acks if a[2] == epoch) - t1)

        wid = 1
        times: dict[int, list[float]] = {d: [] for d in degs}
        comp: dict[int, list[float]] = {d: [] for d in degs}
        cpu: dict[int, list[float]] = {d: [] for d in degs}
        for rnd in range(repeats):  # rounds interleave the degrees, so load drift hits them alike
            for deg in degs:
                while cur.degree > deg:  # split down to this degree, keep the left half
                    half = cur.degree // 2
                    left = WorkerGroup(wid, 0, cur.first_rank, half)
                    right = WorkerGroup(wid + 1, 0, cur.first_rank + half, half)
                    wid += 2
                    say(f"split CP{cur.degree} -> 2 x CP{half}")
                    reconfigure(ReconfigKind.SPLIT, (cur,), (left, right))
                    others.append(right)
                    cur = left
                rid = f"bench-{next_id[0]}"
                next_id[0] += 1
                dp.submit(cur.worker_id, _job(rid, tokens, vocab, 1000 * rnd + deg, cur))
                ev.wait(lambda rid=rid: rid in ev.done, timeout_s)  # type: ignore[misc]
                res = ev.done[rid]
                out = dp.take_output(rid)
                times[deg].append(res.finished_s - res.started_s)
                comp[deg].append(out.compute_s if out is not None else float("nan"))
                cpu[deg].append(out.cpu_s if out is not None else float("nan"))
                say(f"CP{deg}: prefill of {tokens} tokens in {times[deg][-1]:.2f} s")
            while others:  # merge back up
                right = others.pop()
                parent = WorkerGroup(wid, 0, cur.first_rank, cur.degree * 2)
                wid += 1
                say(f"merge 2 x CP{cur.degree} -> CP{parent.degree}")
                reconfigure(ReconfigKind.MERGE, (cur, right), (parent,))
                cur = parent
        prefill_s = {str(d): min(v) for d, v in times.items()}
        compute_s = {str(d): min(v) for d, v in comp.items()}
        cpu_s = {str(d): min(v) for d, v in cpu.items()}
    base = prefill_s.get("1")
    return {
        "tokens": tokens,
        "degrees": sorted(degs),
        "prefill_s": prefill_s,
        "speedup": {d: (base / s if base else None) for d, s in prefill_s.items()},
        "compute_s": compute_s,
        "rank_cpu_s": cpu_s,
        "cpu_speedup": {d: (cpu_s["1"] / s if "1" in cpu_s else None) for d, s in cpu_s.items()},
        "switch_s": {k: max(v) for k, v in switch_s.items() if v},
        "park_s": {k: max(v) for k, v in park_s.items() if v},
        "model": {**dims.describe(), "path": model_path},
        "attention": attn_impl,
        "repeats": repeats,
        "machine": {
            "cpus": os.cpu_count(),
            "processor": platform.processor() or platform.machine(),
            "threads_per_rank": 1,
            "torch": torch.__version__,
        },
        "load_avg_before": [round(x, 2) for x in load_before],
        "load_avg_after": [round(x, 2) for x in os.getloadavg()],
    }


def moe_vs_dense(config: dict[str, Any], tokens: int, repeats: int = 2, seed: int = 0) -> dict[str, Any]:
    """Per-token prefill time of a Qwen3-MoE ``config`` against the dense Qwen3 of the same active size.

    In this process on one thread, random weights, ``tokens`` fresh tokens, the two models interleaved, the
    fastest of ``repeats`` (at least 5 for the MLP): the whole single-process forward (``model_*``) and the MLP
    block alone on the same [tokens, hidden] input (``mlp_*``: the MoE router, grouping and experts against one
    SwiGLU of width top_k × expert width).
    """
    from vertumnus.cp.moe import dense_swiglu, moe_forward
    from vertumnus.cp.qwen3 import dense_equivalent

    dims_moe = dims_from_hf_config(config)
    if not dims_moe.sparse_layers:
        raise ValueError("moe_vs_dense needs a Qwen3-MoE config with sparse layers")
    dense = dense_equivalent(config)
    models = {
        "moe": ReferenceModel(random_weights(dims_moe, seed)),
        "dense": ReferenceModel(random_weights(dims_from_hf_config(dense), seed)),
    }
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as a rank runs
    try:
        ids = torch.randint(0, dims_moe.vocab_size, (tokens,), generator=torch.Generator().manual_seed(seed))
        x = torch.randn(tokens, dims_moe.hidden_size, generator=torch.Generator().manual_seed(seed + 1))
        model_s = {name: float("inf") for name in models}
        mlp_s = dict(model_s)

        def mlp(m: ReferenceModel) -> None:
            layer = m.w.layers[dims_moe.sparse_layers[0]]
            if layer.moe is not None:
                moe_forward(x, layer.moe, dims_moe.top_k, dims_moe.norm_topk_prob)
            else:
                assert layer.w_gate is not None and layer.w_up is not None and layer.w_down is not None
                dense_swiglu(x, layer.w_gate, layer.w_up, layer.w_down)

        with torch.inference_mode():
            for rnd in range(max(repeats, 5)):  # rounds interleave the two models, so load drift hits both alike
                for name, m in models.items():
                    if rnd < repeats:
                        t0 = time.perf_counter()
                        m.forward(ids, KVCache(m.dims, capacity=tokens), last_only=True)
                        model_s[name] = min(model_s[name], time.perf_counter() - t0)
                    t0 = time.perf_counter()
                    mlp(m)  # cheap: at least 5 rounds
                    mlp_s[name] = min(mlp_s[name], time.perf_counter() - t0)
    finally:
        torch.set_num_threads(threads)
    return {
        "tokens": tokens,
        "dense_intermediate": int(dense["intermediate_size"]),
        "model_us_per_token": {k: 1e6 * v / tokens for k, v in model_s.items()},
        "mlp_us_per_token": {k: 1e6 * v / tokens for k, v in mlp_s.items()},
        "model_ratio": model_s["moe"] / model_s["dense"],
        "mlp_ratio": mlp_s["moe"] / mlp_s["dense"],
    }
