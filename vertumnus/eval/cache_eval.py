"""The cache-manager ablation on hot-prefix workloads under KV pressure (``configs/eval/cache-*.yaml``).

Each workload is a steady stream resampled from the public traces (:mod:`vertumnus.eval.protocol`) with shared hot
prefixes prepended (system / tool prompts, Zipf popularity; multi-turn sessions keep theirs), run at several loads
and several per-GPU KV capacities — each capacity computed from a GPU's memory, the model's weights and its KV size
(:mod:`vertumnus.eval.kv_capacity`). Every point runs the pool without replication (``norepl``) and with each
replication policy (``rules``: the paper's thresholds; ``queue_aware``: :mod:`vertumnus.cache.hot_copy` and
retention; ``copies_only`` / ``retention_only``: queue_aware's two parts apart, see :data:`PARTS`), at the
set's fixed composition with the controller off, and again with the controller on (started from that
composition). Verdict per (workload, capacity, mode, policy), as the issue states it: P90 TTFT ≥ 10% below
``norepl`` at the highest load where ``norepl`` still meets the SLO target, and never more than 1% above it at any
load.

Replicates: with ``replicates: R`` in the set, every point is run on R independent request streams (the
workload's seed, then seed·1000 + k for k = 1..R−1), every policy on the same R streams, and a point's figures are
the means over the replicates (the verdict compares those means). One stream is not enough where the pool is at or
past its capacity: there a handful of different early decisions changes every later queue, and one policy's P90 moves
by ±20% against another's from one stream to the next (measured on the tuning set, docs/results.md), far more than
the 1% the verdict resolves. :meth:`CacheEvalResult.spread` gives the per-replicate range of ΔP90.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from vertumnus.config import VertumnusConfig
from vertumnus.cost_model import CostModel
from vertumnus.eval.eval_set import load_set
from vertumnus.eval.fmt import rel_change
from vertumnus.eval.kv_capacity import kv_blocks_per_gpu
from vertumnus.eval.load_patterns import LoadPhase
from vertumnus.eval.parallel import run_parallel
from vertumnus.eval.protocol import (
    Generated,
    HotPrefixes,
    generate,
    load_pool,
    mean_of_runs,
    replicate_seed,
)
from vertumnus.sim.inputs import load_cost, load_sim_config, resolve
from vertumnus.sim.policies import normalise_composition
from vertumnus.sim.runner import run_policy

POLICIES = ("norepl", "rules", "queue_aware", "copies_only", "retention_only")
# queue_aware's two parts, run apart so the ablation shows what each pays: its copies (fetch, push, the scan's
# inter-degree ones) over the engines' plain LRU, and its retention with no fetch or push copy.
PARTS: dict[str, dict[str, int]] = {"copies_only": {"retain_reused": 0}, "retention_only": {"hot_min_blocks": 10**9}}
MODES = ("fixed", "controller")
P90_GAIN = 0.10  # P90 at least this much lower at the highest load that meets the SLO
P90_SLACK = 0.01  # and never more than this much higher at any load
LOST = ("rejected", "failed", "unfinished")
METRICS = (
    "mean_ttft_s", "p90_ttft_s", "p99_ttft_s", "slo_attainment_token_weighted", "prefix_hit_rate_tokens",
    "replications", "fetch_copies", "push_copies", "scan_copies", "reclamations", "copied_blocks",
    "evicted_blocks", "rejected", "failed", "unfinished",
)  # fmt: skip


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Memory(_Strict):
    """How the per-GPU KV capacities are derived: weights and utilisation, and the GPU sizes to run."""

    weights_gb: float = Field(gt=0, description="Model weights per GPU (CP replicates them on every rank).")
    utilisation: float = Field(0.9, gt=0, le=1)
    gpus: dict[str, float] = Field(min_length=1, description="Label -> GPU memory in GB.")


class CacheWorkload(_Strict):
    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.\-]+$")
    description: str = ""
    seed: int = Field(ge=0)
    traces: tuple[str, ...] = Field(min_length=1)
    long_share: float = Field(ge=0, le=1)
    duration_s: float = Field(gt=0)
    hot_prefixes: HotPrefixes


class CacheEvalSet(_Strict):
    name: str
    description: str = ""
    traces: dict[str, str] = Field(min_length=1)
    requests: tuple[float, float]
    composition: str
    loads: tuple[float, ...] = Field(min_length=1)
    memory: Memory
    workloads: tuple[CacheWorkload, ...] = Field(min_length=1)
    replicates: int = Field(1, ge=1, le=20, description="Independent request streams per point (module docstring).")
    source: str = ""

    @model_validator(mode="after")
    def _check(self) -> CacheEvalSet:
        a, b = self.requests
        if not 0 <= a < b <= 1:
            raise ValueError(f"requests must be a range 0 ≤ start < end ≤ 1, got {[a, b]}")
        if any(not (x > 0 and math.isfinite(x)) for x in self.loads):
            raise ValueError(f"loads must be > 0, got {list(self.loads)}")
        names = [w.name for w in self.workloads]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate workload names in {names}")
        for w in self.workloads:
            unknown = sorted(set(w.traces) - set(self.traces))
            if unknown:
                raise ValueError(f"workload {w.name!r} names traces {unknown} not in traces {sorted(self.traces)}")
        return self

    def capacities(self, bytes_per_block: int) -> dict[str, int]:
        """GPU label -> KV blocks per GPU."""
        m = self.memory
        return {k: kv_blocks_per_gpu(gb, m.weights_gb, bytes_per_block, m.utilisation) for k, gb in m.gpus.items()}


def load_cache_set(path: str | Path) -> CacheEvalSet:
    """Read and validate a cache ablation set (ValueError with the reason)."""
    return load_set(path, CacheEvalSet, "cache evaluation set")


# -- runs ----------------------------------------------------------------------------------------------------------
@dataclass(slots=True, frozen=True)
class CacheTask:
    set_path: str
    config: str
    workload: str
    gpu: str
    load: float
    mode: str
    policy: str
    replicate: int = 0


@lru_cache(maxsize=4)
def cache_context(set_path: str, config: str) -> tuple[CacheEvalSet, VertumnusConfig, CostModel]:
    cfg = load_sim_config(config)
    return load_cache_set(set_path), cfg, load_cost(cfg)


@lru_cache(maxsize=2)
def _requests(set_path: str, config: str, workload: str, load: float, replicate: int = 0) -> Generated:
    es, cfg, cost = cache_context(set_path, config)
    w = next(x for x in es.workloads if x.name == workload)
    pool = load_pool({n: resolve(es.traces[n]) for n in w.traces}, es.requests, cfg, cost)
    phase = LoadPhase(w.duration_s, load, w.long_share, label=f"load {load:g}")
    seed = replicate_seed(w.seed, replicate)
    return generate(f"{w.name}@{load:g}", [phase], pool, seed, cfg, w.hot_prefixes, cost)


def run_config(es: CacheEvalSet, cfg: VertumnusConfig, task: CacheTask) -> VertumnusConfig:
    """The config of one run: capacity, composition, controller and replication policy."""
    out = cfg.model_copy(deep=True)
    out.pool.kv_capacity_blocks_per_rank = es.capacities(cfg.cache.bytes_per_block)[task.gpu]
    out.pool.initial_composition = normalise_composition(es.composition, cfg)
    out.controller.enabled = task.mode == "controller"
    out.cache.replication = task.policy != "norepl"
    if task.policy != "norepl":
        out.cache.policy = "rules" if task.policy == "rules" else "queue_aware"
        for key, value in PARTS.get(task.policy, {}).items():
            setattr(out.cache, key, value)
    return out


def run_task(task: CacheTask, key: str | None = None, value: float | None = None) -> dict[str, Any]:
    """One simulation; the :data:`METRICS` of its summary. ``key`` / ``value``: a ``section.name`` config key set
    for a replication policy's run (``norepl`` keeps the config; the tuning sweep, vertumnus/bench/cache_tune.py)."""
    es, cfg, cost = cache_context(task.set_path, task.config)
    gen = _requests(task.set_path, task.config, task.workload, task.load, task.replicate)
    run_cfg = run_config(es, cfg, task)
    if key is not None and task.policy != "norepl":
        section, name = key.split(".", 1)
        sub = getattr(run_cfg, section)
        setattr(sub, name, type(getattr(sub, name))(value))
    s = run_policy(gen.requests, run_cfg, cost, "vertumnus").summary
    out = {k: s.get(k) for k in METRICS}
    out["requests"] = len(gen.requests)
    return out


@dataclass(slots=True)
class CacheEvalResult:
    set_name: str
    config: str
    profile: str
    capacities: dict[str, int]
    bytes_per_block: int
    slo_target: float
    runs: dict[CacheTask, dict[str, Any]] = field(default_factory=dict)

    def replicas(self, workload: str, gpu: str, load: float, mode: str, policy: str) -> list[dict[str, Any]]:
        """The point's runs, one per replicate, in replicate order."""
        key = (workload, gpu, load, mode, policy)
        found = sorted((t.replicate, r) for t, r in self.runs.items()
                       if (t.workload, t.gpu, t.load, t.mode, t.policy) == key)  # fmt: skip
        if not found:
            raise KeyError(f"no run of {key}")
        return [r for _, r in found]

    def run(self, workload: str, gpu: str, load: float, mode: str, policy: str) -> dict[str, Any]:
        """The point's figures: each metric's mean over the replicates (lost requests: their sum)."""
        return mean_of_runs(self.replicas(workload, gpu, load, mode, policy), LOST)

    def spread(self, workload: str, gpu: str, load: float, mode: str, policy: str) -> tuple[float, float]:
        """Smallest and largest per-replicate relative P90 change against ``norepl`` (nan if none)."""
        a = self.replicas(workload, gpu, load, mode, policy)
        b = self.replicas(workload, gpu, load, mode, "norepl")
        rel = [rel_change(x["p90_ttft_s"], y["p90_ttft_s"]) for x, y in zip(a, b, strict=True)]
        rel = [x for x in rel if math.isfinite(x)]
        return (min(rel), max(rel)) if rel else (math.nan, math.nan)


def tasks_of(set_path: str, config: str) -> list[CacheTask]:
    es, _, _ = cache_context(set_path, config)
    # one request stream per (workload, load, replicate): consecutive tasks share it, so _requests' small cache
    # generates each stream once per worker process
    return [
        CacheTask(set_path, config, w.name, gpu, load, mode, pol, k)
        for w in es.workloads for load in es.loads for k in range(es.replicates) for gpu in es.memory.gpus
        for mode in MODES for pol in POLICIES
    ]  # fmt: skip


def evaluate_cache(
    set_path: str, config: str, jobs: int = 1, progress: Callable[[int, int], None] | None = None
) -> CacheEvalResult:
    """Every run of the set under ``config`` (jobs > 1: a process pool)."""
    es, cfg, cost = cache_context(set_path, config)
    normalise_composition(es.composition, cfg)  # a bad composition fails before any run
    tasks = tasks_of(set_path, config)
    res = CacheEvalResult(es.name, config, cost.profile.source, es.capacities(cfg.cache.bytes_per_block),
                          cfg.cache.bytes_per_block, cfg.slo.target_attainment)  # fmt: skip
    report = progress
    done = run_parallel(tasks, run_task, jobs, None if report is None else lambda i, n, _t: report(i, n))
    res.runs = dict(zip(tasks, done, strict=True))
    return res


# -- verdicts ------------------------------------------------------------------------------------------------------
@dataclass(slots=True)
class CacheVerdict:
    """One replication policy against ``norepl`` on one (workload, KV size, mode): the ablation's P90 criterion."""

    workload: str
    gpu: str
    mode: str
    policy: str
    slo_load: float | None  # highest load where norepl meets the SLO target (None: none does)
    p90_at_slo_load: float | None  # relative P90 change there
    worst_p90: float  # largest relative P90 change over all loads
    lost: int
    worst_load: float = math.nan  # the load of worst_p90
    slo_range: tuple[float, float] = (math.nan, math.nan)  # per-replicate ΔP90 range at slo_load
    worst_range: tuple[float, float] = (math.nan, math.nan)  # ... at worst_load

    @property
    def passed(self) -> bool:
        return (
            self.p90_at_slo_load is not None
            and self.p90_at_slo_load <= -P90_GAIN
            and self.worst_p90 <= P90_SLACK
            and self.lost == 0
        )


def verdicts(res: CacheEvalResult, loads: Sequence[float], workloads: Sequence[str]) -> list[CacheVerdict]:
    """Each replication policy that ran against ``norepl``, per (workload, KV size, mode)."""
    ran = {t.policy for t in res.runs}
    policies = [p for p in POLICIES[1:] if p in ran]
    out = []
    for w in workloads:
        for gpu in res.capacities:
            for mode in MODES:
                base = {x: res.run(w, gpu, x, mode, "norepl") for x in loads}
                ok = [x for x in loads if (base[x]["slo_attainment_token_weighted"] or 0) >= res.slo_target]
                top = max(ok) if ok else None
                for pol in policies:
                    runs = {x: res.run(w, gpu, x, mode, pol) for x in loads}
                    rel = {x: rel_change(runs[x]["p90_ttft_s"], base[x]["p90_ttft_s"]) for x in loads}
                    lost = sum(int(r[k] or 0) for r in runs.values() for k in LOST)
                    worst = max(loads, key=lambda x: (rel[x] if math.isfinite(rel[x]) else -math.inf, x))
                    v = CacheVerdict(w, gpu, mode, pol, top, rel[top] if top is not None else None, max(rel.values()),
                                lost, worst)  # fmt: skip
                    v.worst_range = res.spread(w, gpu, worst, mode, pol)
                    if top is not None:
                        v.slo_range = res.spread(w, gpu, top, mode, pol)
                    out.append(v)
    return out
