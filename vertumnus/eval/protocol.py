"""Out-of-sample workloads: time-varying request streams resampled from the public Mooncake traces.

A workload is a sequence of :class:`LoadPhase` s. Each phase states a *load factor* (relative to the pool's
capacity) and a long-request share (long = input > ``controller.rules.long_threshold_tokens``), both either constant
or moving from a start to an end value along a linear or half-cosine curve (a sine wave is a chain of
half-cosine phases). Arrivals are a non-homogeneous Poisson process (thinning); each arrival is long with the
phase's share at that instant and is drawn, with replacement, from the source pool's long or short requests.

**Load → request rate.** w_i = min over the pool's degrees C of C·E_C(L_i, 0): GPU-seconds of request i prefilled
from scratch (no cached prefix) at its most GPU-efficient degree, by the config's cost model. With w̄_short and
w̄_long the means over the pool's short and long requests, a phase at load ρ and long share s arrives at

    λ = ρ · G / ((1 − s)·w̄_short + s·w̄_long)  requests/s        (G = the pool's GPUs)

so load 1.0 is the rate at which every GPU would be busy all the time with no prefix reuse at all. Prefix hits
make the real utilisation lower (the conversation trace reuses most of its tokens), so loads somewhat above 1
are still servable; the evaluation reports each run's measured hit rate. Under another cost profile the same
load gives another rate: the load is relative to the pool as that profile prices it.

**Prefix structure.** Hash ids that occur in two or more requests of the *source pool* keep their identity
(namespaced per trace), so shared system prompts and earlier conversation turns stay shared; ids unique to one
pool request get fresh ids at every draw, so a request drawn twice is not a free full cache hit.

**Hot prefixes** (optional, :class:`HotPrefixes`): ``count`` shared prefixes (system / tool prompts) of
``min_tokens``–``max_tokens`` tokens with Zipf popularity; a share of the arrivals gets one prepended. A session
(a source request whose first block id is shared, i.e. one turn of a multi-turn conversation) always gets the same
prefix — or none — so later turns still extend earlier ones; a fresh request draws. The prefix tokens count in
the load → rate rule (w_i is priced on the request as generated, before any cache).

**Source pools.** A pool is a fraction range of each named trace's requests in arrival order (``0:0.5`` = the
first half), which is how the tuning and test sets (``configs/eval/``) draw from disjoint source requests.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import Field, model_validator

from vertumnus.config import VertumnusConfig
from vertumnus.cost_model import CostModel
from vertumnus.eval.load_patterns import LoadPhase, Params, phase_bounds
from vertumnus.sim.workload import TraceError, TraceRecord, build_requests, read_trace
from vertumnus.types import Request

TRACE_NAMESPACE_BITS = 40  # shared ids of trace k become (k + 1) << 40 | id: traces never collide
FRESH_ID_BASE = 1 << 56  # fresh (per-draw) ids start here, above every namespaced id

# -- hot prefixes -----------------------------------------------------------------------------------------------
HOT_ID_BASE = 1 << 52  # hot-prefix block ids: below the fresh ids, above every namespaced trace id
_HOT_STRIDE = 1 << 20  # ids of prefix k: HOT_ID_BASE + k·stride + block


class HotPrefixes(Params):
    """Shared prefixes prepended to a share of the requests (module docstring)."""

    count: int = Field(ge=1, le=4096)
    min_tokens: int = Field(ge=512, description="Shortest prefix (rounded down to whole 512-token blocks).")
    max_tokens: int = Field(ge=512)
    share: float = Field(ge=0, le=1, description="Fraction of the requests (sessions) given a hot prefix.")
    zipf: float = Field(1.0, ge=0, description="Popularity of prefix k ∝ (k + 1)^-zipf.")
    seed: int = Field(0, ge=0, description="Draws the prefix lengths and the sessions' prefixes.")

    @model_validator(mode="after")
    def _range(self) -> HotPrefixes:
        if self.max_tokens < self.min_tokens:
            raise ValueError(f"max_tokens {self.max_tokens} is below min_tokens {self.min_tokens}")
        return self

    def blocks(self) -> np.ndarray:
        """Length in 512-token blocks of each prefix (deterministic in ``seed``)."""
        rng = np.random.default_rng(self.seed)
        lo, hi = self.min_tokens // 512, self.max_tokens // 512
        return rng.integers(lo, hi + 1, size=self.count)

    def popularity(self) -> np.ndarray:
        w = (np.arange(self.count) + 1.0) ** -self.zipf
        return w / w.sum()


@dataclass(slots=True)
class _HotDraw:
    """Per-generation state of the hot prefixes: lengths, popularity and each session's choice."""

    spec: HotPrefixes
    blocks: np.ndarray
    cdf: np.ndarray
    sessions: dict[int, int] = field(default_factory=dict)  # first shared block id -> prefix index (-1: none)

    @classmethod
    def of(cls, spec: HotPrefixes) -> _HotDraw:
        return cls(spec, spec.blocks(), np.cumsum(spec.popularity()))

    def _draw(self, rng: np.random.Generator) -> int:
        if rng.random() >= self.spec.share:
            return -1
        k = int(np.searchsorted(self.cdf, rng.random(), side="right"))
        return min(k, self.spec.count - 1)

    def choose(self, src: PoolRequest, rng: np.random.Generator) -> int:
        """The prefix index of one arrival (-1: none); a session keeps its first draw."""
        if src.shared and src.shared[0]:
            first = src.hash_ids[0]
            k = self.sessions.get(first)
            if k is None:
                k = self.sessions[first] = self._draw(rng)
            return k
        return self._draw(rng)

    def ids(self, k: int) -> list[int]:
        base = HOT_ID_BASE + k * _HOT_STRIDE
        return list(range(base, base + int(self.blocks[k])))


def hot_work(pool: SourcePool, spec: HotPrefixes, cost: CostModel, degrees: Sequence[int]) -> SourcePool:
    """``pool`` with w̄_short / w̄_long priced on requests as generated: with probability ``share`` a prefix of
    prefix-k's tokens (popularity p_k) in front, uncached (the load definition)."""
    tokens = spec.blocks().astype(np.float64) * 512.0
    pop = spec.popularity()

    def mean(reqs: list[PoolRequest], old: float) -> float:
        if not reqs:
            return old
        lens = np.array([r.input_len for r in reqs], dtype=np.float64)
        plain = gpu_seconds(cost, degrees, lens).mean()
        grid = (lens[:, None] + tokens[None, :]).ravel()
        with_p = gpu_seconds(cost, degrees, grid).reshape(lens.size, tokens.size).mean(axis=0) @ pop
        return float((1.0 - spec.share) * plain + spec.share * with_p)

    return SourcePool(pool.short, pool.long, mean(pool.short, pool.work_short), mean(pool.long, pool.work_long),
                      pool.gpus, pool.traces, pool.fraction)  # fmt: skip


# -- source pools ----------------------------------------------------------------------------------------------
@dataclass(slots=True, frozen=True)
class PoolRequest:
    """One source request: where it comes from and its ids, with ``shared[k]`` true when id k is shared."""

    trace: str
    line: int
    input_len: int
    output_len: int
    hash_ids: tuple[int, ...]  # already namespaced per trace
    shared: tuple[bool, ...]


@dataclass(slots=True)
class SourcePool:
    """Short and long requests of a fraction range of one or more traces, with their mean GPU-seconds."""

    short: list[PoolRequest]
    long: list[PoolRequest]
    work_short: float  # w̄_short: mean GPU-seconds, no cache, cheapest degree
    work_long: float
    gpus: int
    traces: tuple[str, ...] = ()
    fraction: tuple[float, float] = (0.0, 1.0)

    def rate(self, load: float, long_share: float) -> float:
        """Requests/s at ``load`` and ``long_share`` (module docstring)."""
        work = (1.0 - long_share) * self.work_short + long_share * self.work_long
        return load * self.gpus / work if work > 0 else 0.0

    @property
    def capacity_rps(self) -> tuple[float, float]:
        """Load-1.0 rates of an all-short and an all-long stream."""
        return self.rate(1.0, 0.0), self.rate(1.0, 1.0)


def slice_records(records: Sequence[TraceRecord], fraction: tuple[float, float]) -> list[TraceRecord]:
    """Records [⌊a·n⌋, ⌊b·n⌋) of a trace in arrival order; adjacent ranges never share a record."""
    a, b = fraction
    if not 0 <= a < b <= 1:
        raise ValueError(f"bad request range {a}:{b}; need 0 ≤ start < end ≤ 1")
    n = len(records)
    return list(records[math.floor(a * n) : math.floor(b * n)])


def gpu_seconds(cost: CostModel, degrees: Sequence[int], lengths: np.ndarray) -> np.ndarray:
    """min over degrees C of C·E_C(L, 0) per request (GPU-seconds of an uncached prefill)."""
    return np.min(np.stack([c * cost.predict_degree(c, lengths, np.zeros_like(lengths)) for c in degrees]), axis=0)


def make_pool(
    traces: Mapping[str, Sequence[TraceRecord]],
    fraction: tuple[float, float],
    cfg: VertumnusConfig,
    cost: CostModel,
) -> SourcePool:
    """The pool of ``traces`` (name → records, the namespace order is the sorted name order) over ``fraction``."""
    threshold = cfg.controller.rules.long_threshold_tokens
    short: list[PoolRequest] = []
    long: list[PoolRequest] = []
    for k, name in enumerate(sorted(traces)):
        recs = slice_records(traces[name], fraction)
        counts: dict[int, int] = {}
        for r in recs:
            for h in set(r.hash_ids):
                counts[h] = counts.get(h, 0) + 1
        ns = (k + 1) << TRACE_NAMESPACE_BITS
        for r in recs:
            pr = PoolRequest(
                name, r.line, r.input_len, r.output_len,
                tuple(ns | h for h in r.hash_ids), tuple(counts[h] > 1 for h in r.hash_ids),
            )  # fmt: skip
            (long if r.input_len > threshold else short).append(pr)
    if not short and not long:
        raise TraceError(f"no source requests in range {fraction[0]:g}:{fraction[1]:g} of {sorted(traces)}")
    degrees = list(cfg.pool.degrees)

    def mean_work(reqs: list[PoolRequest]) -> float:
        if not reqs:
            return math.inf  # an empty class makes any share of it unreachable (rate → 0)
        return float(gpu_seconds(cost, degrees, np.array([r.input_len for r in reqs], dtype=np.float64)).mean())

    return SourcePool(short, long, mean_work(short), mean_work(long), cfg.pool.total_gpus, tuple(sorted(traces)),
                      fraction)  # fmt: skip


@lru_cache(maxsize=8)
def _read_cached(path: str) -> tuple[TraceRecord, ...]:
    records, _ = read_trace(path)
    return tuple(records)


def load_pool(
    paths: Mapping[str, str | Path], fraction: tuple[float, float], cfg: VertumnusConfig, cost: CostModel
) -> SourcePool:
    """Read the traces (cached per process) and build their pool."""
    traces = {name: _read_cached(str(p)) for name, p in paths.items()}
    return make_pool(traces, fraction, cfg, cost)


# -- generation -------------------------------------------------------------------------------------------------
@dataclass(slots=True)
class Generated:
    """A generated workload: requests, phase layout and where each request was drawn from."""

    name: str
    requests: list[Request]
    phases: list[LoadPhase]
    bounds: list[tuple[float, float]]
    sources: list[tuple[str, int]]  # (trace, source line) of each request, in request order
    rates: list[tuple[float, float]] = field(default_factory=list)  # req/s at each phase's start and end

    @property
    def duration_s(self) -> float:
        return self.bounds[-1][1] if self.bounds else 0.0


def generate_records(
    phases: Sequence[LoadPhase], pool: SourcePool, seed: int, hot: HotPrefixes | None = None
) -> tuple[list[TraceRecord], list[tuple[str, int]]]:
    """Arrivals (thinning of a Poisson process at each phase's peak rate) and resampled, re-identified requests,
    with ``hot`` prefixes prepended (price the pool with :func:`hot_work` first)."""
    if pool.short == [] and any(p.long_share < 1 or (p.long_end is not None and p.long_end < 1) for p in phases):
        raise ValueError("the source pool has no short requests but a phase asks for them")
    if pool.long == [] and any(p.long_share > 0 or (p.long_end or 0) > 0 for p in phases):
        raise ValueError("the source pool has no long requests but a phase asks for them")
    rng = np.random.default_rng(seed)
    draw = _HotDraw.of(hot) if hot is not None else None
    next_fresh = FRESH_ID_BASE
    records: list[TraceRecord] = []
    sources: list[tuple[str, int]] = []
    for (start, end), ph in zip(phase_bounds(phases), phases, strict=True):
        # rate(g) = G·load(g) / w̄(share(g)) with load and share affine in the same monotone g: a Möbius function
        # of g, hence monotone, so its peak over the phase is at one of the two ends.
        peak = max(pool.rate(*ph.at(0.0)), pool.rate(*ph.at(1.0)))
        t = start
        while peak > 0:
            t += float(rng.exponential(1.0 / peak))
            if t >= end:
                break
            load, share = ph.at((t - start) / ph.duration_s)
            if rng.random() * peak >= pool.rate(load, share):
                continue
            bucket = pool.long if rng.random() < share else pool.short
            src = bucket[int(rng.integers(len(bucket)))]
            ids = []
            for h, shared in zip(src.hash_ids, src.shared, strict=True):
                if shared:
                    ids.append(h)
                else:
                    ids.append(next_fresh)
                    next_fresh += 1
            input_len = src.input_len
            k = draw.choose(src, rng) if draw is not None else -1
            if draw is not None and k >= 0:
                front = draw.ids(k)
                ids = front + ids
                input_len += 512 * len(front)
            records.append(TraceRecord(len(records) + 1, t, input_len, src.output_len, tuple(ids)))
            sources.append((src.trace, src.line))
    return records, sources


def replicate_seed(seed: int, replicate: int) -> int:
    """The request-stream seed of replicate ``replicate`` of a workload seeded ``seed`` (0: the seed itself).

    Evaluation sets with ``replicates: R`` run every point on R independent streams drawn with these seeds."""
    if replicate < 0:
        raise ValueError(f"replicate must be ≥ 0, got {replicate}")
    return seed if replicate == 0 else seed * 1000 + replicate


def mean_of_runs(runs: Sequence[Mapping[str, Any]], summed: Sequence[str] = ()) -> dict[str, Any]:
    """The figures of one point over its replicate streams: each numeric figure's mean, those named in ``summed``
    (counts: requests, lost requests) their sum; a figure some run lacks is None; text is the first run's.
    One run is returned as it is."""
    if not runs:
        raise ValueError("mean_of_runs needs at least one run")
    if len(runs) == 1:
        return dict(runs[0])
    out: dict[str, Any] = {}
    for k, v0 in runs[0].items():
        vals = [r.get(k) for r in runs]
        nums = [float(v) for v in vals if isinstance(v, (int, float))]
        if not isinstance(v0, (int, float)) or isinstance(v0, bool):
            out[k] = v0
        elif len(nums) < len(vals):
            out[k] = None
        elif k in summed:
            out[k] = int(sum(nums))
        else:
            out[k] = sum(nums) / len(nums)
    return out


def generate(
    name: str,
    phases: Sequence[LoadPhase],
    pool: SourcePool,
    seed: int,
    cfg: VertumnusConfig,
    hot: HotPrefixes | None = None,
    cost: CostModel | None = None,
) -> Generated:
    """Requests of one workload (deterministic for a given pool, phases, seed and hot prefixes; ``cost`` prices
    the hot prefixes into the rates and is required with ``hot``)."""
    if hot is not None:
        if cost is None:
            raise ValueError("generate: hot prefixes need the cost model (the load → rate rule prices them)")
        pool = hot_work(pool, hot, cost, list(cfg.pool.degrees))
    records, sources = generate_records(phases, pool, seed, hot)
    if not records:
        raise ValueError(f"workload {name!r} generated no requests (all loads zero?)")
    requests = build_requests(records, cfg, prefix=f"{name}:", origin_s=0.0)
    rates = [(pool.rate(*p.at(0.0)), pool.rate(*p.at(1.0))) for p in phases]
    return Generated(name, requests, list(phases), phase_bounds(phases), sources, rates)
