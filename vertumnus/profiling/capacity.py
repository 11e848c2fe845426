"""κ_C: the largest window demand one degree-C worker serves while meeting the target SLO attainment.

Method (DESIGN.md §1, paper §4): one worker of degree C serves a trace's requests FCFS, one prefill at a time,
under increasing load. Load level j compresses the trace's arrival times so that the *mean window demand*
``D_j = Σ_i Ê_i · H / span`` (seconds of predicted work per window of H seconds) is ``u_j · H`` for a
geometric ladder of utilisations u_j ∈ (0, 1]. At each level the token-weighted SLO attainment
``Σ L_i [TTFT_i ≤ τ_i] / Σ L_i`` is computed with ``TTFT_i = finish_i − arrival_i + T_ext`` and
``τ_i = slo.base_s + slo.per_token_s · L_i``. κ_C is the demand of the last level before the first level that
misses ``slo.target_attainment`` ("stays ≥ the target"), so κ_C is monotone in the target by construction:
a lower target can only move the first failing level up the same ladder. κ_C ≤ H (a worker cannot do more than
H seconds of work per H-second window).

Prefix reuse: the worker keeps an LRU cache of the trace's 512-token blocks with its KV capacity
(``pool.kv_capacity_blocks_per_rank · C`` cache blocks of ``cache.block_tokens``); a request reuses the longest
prefix of its blocks the cache holds (at least one token is always computed). Cache state depends on the order
of requests only, so P_i is computed once per degree and shared by every load level.

Quantised timestamps: public traces round arrival times (the conversation trace ticks every 3 s, ~9 requests
a tick). Compressing or stretching time keeps such batches simultaneous, so even the lightest load would queue
them behind each other; :func:`spread_ties` spaces the requests of a tick evenly over the interval to the next
tick (deterministic, arrival order kept) before any load level is applied.

Service times: the fitted model (Ê_i itself, default) or measured on the real engine (``--capacity-engine
real``: each request's prefill timed queue-free on a worker of degree C; a worker runs one prefill at a time, so
the FCFS recurrence below gives the queueing exactly for those service times).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from vertumnus.cache.block_keys import keys_from_hash_ids
from vertumnus.config import VertumnusConfig
from vertumnus.cost_model import CostModel
from vertumnus.profiling.targets import ProfilingTarget

TRACE_BLOCK_TOKENS = 512  # Mooncake hash ids cover 512-token blocks
DEFAULT_UTILISATIONS = tuple(float(u) for u in np.geomspace(0.01, 1.0, 61))  # ladder step ≈ 8 %


@dataclass(slots=True, frozen=True)
class CapacityWorkload:
    """A trace's requests with lengths capped to what the worker accepts (arrivals from 0, seconds)."""

    arrivals: np.ndarray
    lengths: np.ndarray  # capped L_i
    block_keys: tuple[tuple[int, ...], ...]  # chained keys of the full 512-token blocks of the capped prompt
    source: str
    capped: int  # how many requests were shortened

    @property
    def span_s(self) -> float:
        return float(self.arrivals[-1] - self.arrivals[0])


@dataclass(slots=True, frozen=True)
class CapacityPoint:
    utilisation: float
    demand_s: float  # mean window demand Σ Ê per window of H seconds
    attainment: float  # token-weighted SLO attainment
    mean_ttft_s: float


@dataclass(slots=True, frozen=True)
class CapacityResult:
    degree: int
    kappa: float  # seconds of demand per window of window_s
    window_s: float
    target: float
    points: tuple[CapacityPoint, ...]
    requests: int
    service: str  # "model" or "real"


def load_workload(trace: str | Path, max_tokens: int, limit: int | None = None) -> CapacityWorkload:
    """Read a Mooncake JSONL trace (the simulator's parser), cap lengths at ``max_tokens``, keep ``limit``."""
    from vertumnus.sim.workload import read_trace

    if max_tokens < 2:
        raise ValueError(f"max prompt length must be ≥ 2 tokens, got {max_tokens}")
    records, _issues = read_trace(trace)
    if limit is not None:
        if limit < 2:
            raise ValueError(f"--capacity-requests must be ≥ 2, got {limit}")
        records = records[:limit]
    if len(records) < 2:
        raise ValueError(f"trace {trace}: need at least 2 valid requests to measure capacity, got {len(records)}")
    lengths = np.array([min(r.input_len, max_tokens) for r in records], dtype=np.int64)
    arrivals = spread_ties(np.array([r.timestamp_s for r in records], dtype=np.float64))
    if arrivals[-1] <= 0:
        raise ValueError(f"trace {trace}: all requests arrive at the same instant; need a positive time span")
    keys = tuple(
        keys_from_hash_ids(r.hash_ids[: int(n) // TRACE_BLOCK_TOKENS]) for r, n in zip(records, lengths, strict=True)
    )
    capped = int(sum(r.input_len > max_tokens for r in records))
    return CapacityWorkload(arrivals, lengths, keys, str(trace), capped)


def spread_ties(times: np.ndarray) -> np.ndarray:
    """Shift sorted times to start at 0 and space each run of equal times evenly up to the next distinct time.

    The last run uses the median gap between distinct times. Order is kept; distinct times are unchanged.
    """
    t = np.asarray(times, dtype=np.float64) - float(times[0])
    uniq, start, count = np.unique(t, return_index=True, return_counts=True)
    if len(uniq) < 2:
        return t
    gaps = np.append(np.diff(uniq), np.median(np.diff(uniq)))
    rank = np.arange(len(t)) - np.repeat(start, count)  # position of each request inside its run
    return np.asarray(t + rank * np.repeat(gaps / count, count))


def cached_prefixes(work: CapacityWorkload, capacity_blocks: int) -> np.ndarray:
    """P_i of each request at one worker with an LRU cache of ``capacity_blocks`` 512-token blocks."""
    lru: OrderedDict[int, None] = OrderedDict()
    out = np.zeros(len(work.lengths), dtype=np.int64)
    for i, keys in enumerate(work.block_keys):  # one step per block, never per token
        hit = 0
        for k in keys:
            if k not in lru:
                break
            hit += 1
        out[i] = min(hit * TRACE_BLOCK_TOKENS, int(work.lengths[i]) - 1)
        for k in keys:
            lru[k] = None
            lru.move_to_end(k)
        while len(lru) > capacity_blocks:
            lru.popitem(last=False)
    return out


def fcfs_finish(arrivals: np.ndarray, service: np.ndarray) -> np.ndarray:
    """Finish times of one FCFS server: f_i = max(a_i, f_{i−1}) + s_i, vectorised.

    Unrolled, f_i = S_i + max_{j ≤ i}(a_j − S_{j−1}) with S the cumulative service (S_{−1} = 0).
    """
    s = np.cumsum(service)
    return np.asarray(s + np.maximum.accumulate(arrivals - (s - service)))


def capacity_curve(
    work: CapacityWorkload,
    service: np.ndarray,
    predicted: np.ndarray,
    cfg: VertumnusConfig,
    utilisations: tuple[float, ...] = DEFAULT_UTILISATIONS,
) -> list[CapacityPoint]:
    """Attainment at each load level of the ladder (see the module docstring)."""
    h = cfg.controller.window_s
    total = float(predicted.sum())
    weights = work.lengths.astype(np.float64)
    tau = cfg.slo.base_s + cfg.slo.per_token_s * weights
    out: list[CapacityPoint] = []
    for u in utilisations:
        # mean window demand = total · H / (span / s) = u · H  ⇒  compression s = u · span / total
        arrivals = work.arrivals * (total / (u * work.span_s))
        ttft = fcfs_finish(arrivals, service) - arrivals + cfg.slo.t_ext_s
        att = float(weights[ttft <= tau].sum() / weights.sum())
        out.append(CapacityPoint(u, u * h, att, float(ttft.mean())))
    return out


def kappa_from_curve(points: list[CapacityPoint], target: float) -> float:
    """Demand of the last level before the first one below ``target`` (0 if the lightest level misses it)."""
    kappa = 0.0
    for pt in points:
        if pt.attainment < target:
            break
        kappa = pt.demand_s
    return kappa


def measure_capacity(
    degree: int,
    model: CostModel,
    work: CapacityWorkload,
    cfg: VertumnusConfig,
    target: ProfilingTarget | None = None,
    on_request: Callable[[], None] | None = None,
) -> CapacityResult:
    """κ_C for one degree; service times from ``model`` (target None) or timed on ``target`` (real engine).

    With a target, ``target.setup/teardown(degree)`` bracket the runs and ``on_request`` ticks a progress bar.
    """
    cap_blocks = cfg.pool.kv_capacity_blocks_per_rank * degree * cfg.cache.block_tokens // TRACE_BLOCK_TOKENS
    p = cached_prefixes(work, max(cap_blocks, 0))
    r = work.lengths - p
    predicted = model.predict_degree(degree, r, p)
    if target is None:
        service = predicted
    else:
        align = target.prefix_align
        p_real = p // align * align  # the engine reuses whole engine blocks only
        times = []
        target.setup(degree)
        try:
            for ri, pi in zip((work.lengths - p_real).tolist(), p_real.tolist(), strict=True):
                times.append(target.measure(degree, ri, pi))
                if on_request:
                    on_request()
        finally:
            target.teardown(degree)
        service = np.array(times, dtype=np.float64)
    points = capacity_curve(work, service, predicted, cfg)
    target_att = cfg.slo.target_attainment
    return CapacityResult(
        degree,
        kappa_from_curve(points, target_att),
        cfg.controller.window_s,
        target_att,
        tuple(points),
        len(work.lengths),
        "model" if target is None else "real",
    )
