"""Profiling target for the project's own PyTorch CP engine.

Per degree C, ``setup`` starts a :class:`~vertumnus.engines.torch.TorchDataPlane` holding exactly one worker of
degree C — C rank processes joined over gloo (NCCL on GPU), each running the same
:class:`~vertumnus.engines.torch.rank_worker.RankWorker` step code the server's rank actors run, one torch
thread per rank as the server sets them up. Measuring ``(r, p)``:

1. fresh random prompt of L = r + p tokens (never seen before, so nothing else is reused);
2. if p > 0: prefill the first p tokens untimed, so the worker caches those p / block_tokens blocks;
3. prefill the whole prompt with ``max_reuse_blocks = p / block_tokens`` and return its time. The engine must
   report exactly p cached tokens, or the measurement is an error (an evicted prefix would time the wrong point).

Two clocks (``timing``):

- ``wall`` (default): the worker's service time as the pool sees it, ``finished_s − started_s`` of the
  :class:`~vertumnus.types.PrefillResult` (dispatch to the ranks → last rank's reply), on ``time.perf_counter``;
- ``cpu``: the CPU time the slowest rank process spent on the prefill (all its threads, nanosecond
  ``sum_exec_runtime`` from ``/proc/<pid>/task/*/schedstat``, Linux). Time spent waiting for a core is not
  counted, so on a machine shared with other busy processes this estimates the wall time the worker would take
  with its cores to itself. It leaves out pure waiting (a balanced zigzag split keeps ranks in step; loopback
  latency is microseconds), so prefer ``wall`` on a quiet machine.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from typing import TYPE_CHECKING

import numpy as np

from vertumnus.cache.block_keys import keys_from_tokens
from vertumnus.config import VertumnusConfig, config_from_dict
from vertumnus.interfaces import PrefillJob
from vertumnus.profiling.targets import cpu_description
from vertumnus.types import CacheReport, Placement, PrefillResult, Request, WorkerGroup

if TYPE_CHECKING:  # the engine (torch) is imported only when a torch target is set up
    from vertumnus.engines.torch.data_plane import TorchDataPlane

TIMINGS = ("wall", "cpu")
_WAIT_S = 600.0  # one prefill on a tiny model never takes this long; beyond it the ranks are stuck


class _Recorder:
    """EngineEvents that keeps the results of finished prefills and the first failure."""

    def __init__(self) -> None:
        self.cv = threading.Condition()
        self.done: dict[str, PrefillResult] = {}
        self.failure: str | None = None

    def prefill_started(self, worker_id: int, request_id: str, now: float) -> None:
        """Not needed: the result carries its own start time."""

    def prefill_done(self, result: PrefillResult) -> None:
        with self.cv:
            self.done[result.request_id] = result
            self.cv.notify_all()

    def cache_report(self, report: CacheReport) -> None:
        """The worker's own block index decides reuse; the profiler keeps no trie."""

    def cache_op_failed(self, op_id: int, reason: str) -> None:
        """The profiler issues no cache ops."""

    def worker_parked(self, worker_id: int, now: float) -> None:
        """The profiler never parks."""

    def epoch_ack(self, worker_id: int, rank: int, epoch: int, now: float) -> None:
        """Ranks ack the start epoch; nothing waits on it (start() already waited for every rank)."""

    def worker_failed(self, worker_id: int, reason: str, now: float) -> None:
        with self.cv:
            self.failure = reason
            self.cv.notify_all()

    def wait(self, request_id: str) -> PrefillResult:
        with self.cv:
            ok = self.cv.wait_for(lambda: request_id in self.done or self.failure is not None, _WAIT_S)
            if self.failure is not None:
                raise RuntimeError(f"torch worker failed while profiling: {self.failure}")
            if not ok:
                raise RuntimeError(f"prefill {request_id} did not finish within {_WAIT_S:.0f} s")
            return self.done.pop(request_id)


def single_worker_config(cfg: VertumnusConfig, degree: int) -> VertumnusConfig:
    """``cfg`` with a pool of exactly one node of ``degree`` ranks and that one degree."""
    data = cfg.model_dump(mode="json")
    data["pool"].update(nodes=1, gpus_per_node=degree, degrees=[degree], initial_composition=None, history_trace=None)
    return config_from_dict(data, f"<profiling config, degree {degree}>")


class TorchTarget:
    """Queue-free timing of one torch CP worker per degree (see module docstring)."""

    engine = "torch"

    def __init__(self, cfg: VertumnusConfig, seed: int = 0, timing: str = "wall") -> None:
        if timing not in TIMINGS:
            raise ValueError(f"--timing must be one of {', '.join(TIMINGS)}, got {timing!r}")
        if timing == "cpu" and not os.path.exists("/proc/self/task"):
            raise ValueError("--timing cpu needs Linux /proc (per-thread schedstat)")
        self.cfg = cfg
        self.timing = timing
        m = cfg.model
        self.device = _device(cfg.serving.device)
        weights = f"weights {m.path}" if m.path else f"random weights seed {m.seed}"
        self.model = (
            f"{m.name} (hidden {m.hidden_size}, ffn {m.intermediate_size}, {m.num_layers} layers, "
            f"{m.num_heads}/{m.num_kv_heads} heads, vocab {m.vocab_size}, {m.dtype}, {weights})"
        )
        self.hardware = cpu_description() + ("" if self.device == "cpu" else f"; {_gpu_name()}")
        comm = "gloo" if self.device == "cpu" else "nccl"
        self.hardware += f"; one {self.device} process per CP rank, 1 torch thread each, {comm}; {timing} clock"
        self.prefix_align = cfg.cache.block_tokens
        self.max_tokens = cfg.pool.max_model_len
        self._rng = np.random.default_rng(seed)
        self._ids = itertools.count()
        self._plane: TorchDataPlane | None = None
        self._events = _Recorder()
        # (p, cached tokens the worker reported) per timed prefill: the evidence that each timed run reused
        # exactly its prefix (a mismatch raises before it is recorded).
        self.reused: list[tuple[int, int]] = []

    def setup(self, degree: int) -> None:
        """Start C rank processes as one worker of degree C (waits until every rank joined)."""
        from vertumnus.engines.torch.data_plane import TorchDataPlane

        self.teardown(degree)
        self._events = _Recorder()
        plane = TorchDataPlane(
            single_worker_config(self.cfg, degree), clock=time.perf_counter, keep_outputs=1, device=self.device
        )
        plane.start([WorkerGroup(worker_id=0, node=0, first_rank=0, degree=degree)], 1, self._events)
        self._plane = plane

    def measure(self, degree: int, r: int, p: int) -> float:
        """Service time of a prefill of r tokens after a cached prefix of p tokens (module docstring)."""
        bt = self.cfg.cache.block_tokens
        if p % bt:
            raise ValueError(f"prefix {p} is not a multiple of cache.block_tokens={bt}")
        tokens = self._rng.integers(0, self.cfg.model.vocab_size, size=r + p).tolist()
        if p:
            self._run(degree, tokens[:p], 0)
        pids = self._rank_pids(degree) if self.timing == "cpu" else []
        cpu0 = [_cpu_ns(pid) for pid in pids]
        result = self._run(degree, tokens, p // bt)
        cpu = [_cpu_ns(pid) - c0 for pid, c0 in zip(pids, cpu0, strict=True)]
        if result.cached_tokens != p:
            raise RuntimeError(f"torch worker reused {result.cached_tokens} cached tokens, expected {p}")
        self.reused.append((p, result.cached_tokens))
        return max(cpu) * 1e-9 if pids else result.finished_s - result.started_s

    def teardown(self, degree: int) -> None:
        """Stop the worker's rank processes."""
        plane, self._plane = self._plane, None
        if plane is not None:
            plane.close()

    def _rank_pids(self, degree: int) -> list[int]:
        assert self._plane is not None
        pids = [self._plane.rank_pid(r) for r in range(degree)]
        if any(pid is None for pid in pids):
            raise RuntimeError("torch worker lost a rank process while profiling")
        return [pid for pid in pids if pid is not None]

    def _run(self, degree: int, tokens: list[int], reuse_blocks: int) -> PrefillResult:
        assert self._plane is not None, "setup(degree) first"
        rid = f"profile-{next(self._ids)}"
        n = len(tokens)
        req = Request(rid, 0.0, n, keys_from_tokens(tokens, self.cfg.cache.block_tokens), token_ids=tokens)
        cached = reuse_blocks * self.cfg.cache.block_tokens
        placement = Placement(rid, 0, degree, cached, n - cached, 0.0, 0.0, 0.0, degree, 1)
        self._plane.submit(0, PrefillJob(req, placement, max_reuse_blocks=reuse_blocks))
        result = self._events.wait(rid)
        self._plane.take_output(rid)
        return result


def _cpu_ns(pid: int) -> int:
    """CPU time (ns) of every live thread of process ``pid`` (first field of each thread's schedstat)."""
    total = 0
    base = f"/proc/{pid}/task"
    for tid in os.listdir(base):
        try:
            with open(f"{base}/{tid}/schedstat", encoding="ascii") as f:
                total += int(f.read().split()[0])
        except (FileNotFoundError, ProcessLookupError):  # a thread exited between listdir and open
            continue
    return total


def _device(setting: str) -> str:
    """``serving.device`` → the rank device: auto means CUDA when this machine has a GPU."""
    import torch

    if setting == "cuda" and not torch.cuda.is_available():
        raise ValueError("serving.device is 'cuda' but this machine has no GPU (torch sees no CUDA device)")
    if setting != "auto":
        return setting
    return "cuda" if torch.cuda.is_available() else "cpu"


def _gpu_name() -> str:
    import torch

    return f"{torch.cuda.device_count()}× {torch.cuda.get_device_name(0)}"
