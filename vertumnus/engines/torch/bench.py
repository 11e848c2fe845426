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
) -> dict[str, Any]:
    """Run the benchmark (see module docstring) and return its figures as a JSON-ready dict."""
    degs = sorted(set(degrees), reverse=True)
    if not degs or any(d < 1 or d & (d - 1) for d in degs):
        raise ValueError(f"degrees must be powers of two, got {list(degrees)}")
    if tokens < 2 * degs[0]:
        raise ValueError(f"--tokens must be at least 2 × the largest degree ({2 * degs[0]})")
    say = progress or (lambda _msg: None)
    top = degs[0]
    cfg = config_from_dict(
        {
            "pool": {
                "nodes": 1,
                "gpus_per_node": top,
                "degrees": sorted(degs),
                "engine": "torch",
                "max_model_len": max(tokens, 1),
            },
            "model": {
                "hidden_size": hidden,
                "num_heads": heads,
                "num_kv_heads": kv_heads,
                "intermediate_size": intermediate,
                "num_layers": layers,
                "vocab_size": 512,
            },
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
                dp.submit(cur.worker_id, _job(rid, tokens, 512, 1000 * rnd + deg, cur))
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
        "model": {
            "layers": layers,
            "hidden": hidden,
            "heads": heads,
            "kv_heads": kv_heads,
            "head_dim": hidden // heads,
            "intermediate": intermediate,
            "dtype": "float32",
        },
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
