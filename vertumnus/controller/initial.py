"""Initial composition from a historical workload (DESIGN.md §2).

Expected window demand depends on which degrees a composition offers (a long request served by a CP8 costs
fewer seconds than at CP4), so D̄ is computed per *degree set*: each historical request is charged Ê at its
preferred degree within the set (J without q, as the scheduler would prefer it), with the reusable prefix it
would find in a global cache that holds every earlier request's blocks (0 when the history has no block
ids). D̄(S) = Σ Ê / (trace duration / window length).

Choice among reachable compositions X with degree set S(X) and K(X) = Σ_w κ_{C_w}:
  K(X) ≥ (1 + headroom)·D̄(S(X)) for some X → among those, the most GPUs in the largest degree, then in the
  next largest, and so on; otherwise → the largest K, ties by the same GPU order.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from vertumnus.cache.block_keys import keys_from_hash_ids
from vertumnus.controller.lattice import Counts, Lattice
from vertumnus.cost_model import CostModel


@dataclass(slots=True)
class History:
    """Summary of a historical workload: D̄ per degree set and the long-request share."""

    requests: int
    duration_s: float
    windows: float
    long_share: float
    demand_s: dict[tuple[int, ...], float]  # sorted degree set -> D̄ per window (seconds of Ê)


TRACE_BLOCK_TOKENS = 512  # Mooncake hash ids cover 512-token blocks


def read_trace_lengths(path: str | Path) -> tuple[np.ndarray, np.ndarray, list[tuple[int, ...]]]:
    """Arrival times (s), input lengths and chained keys of the *full* blocks from a Mooncake JSONL trace."""
    p = Path(path)
    if not p.exists():
        raise ValueError(f"history trace not found: {p}")
    ts: list[float] = []
    lens: list[int] = []
    keys: list[tuple[int, ...]] = []
    with p.open() as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                ts.append(float(rec["timestamp"]) / 1000.0)
                n = int(rec["input_length"])
                lens.append(n)
                keys.append(keys_from_hash_ids(rec.get("hash_ids", ())[: n // TRACE_BLOCK_TOKENS]))
            except (ValueError, KeyError, TypeError) as e:
                raise ValueError(f"{p}:{lineno}: not a Mooncake trace record ({e})") from None
    if not ts:
        raise ValueError(f"history trace {p} holds no requests")
    return np.asarray(ts), np.asarray(lens, dtype=np.int64), keys


def summarize_history(
    arrivals_s: np.ndarray,
    lengths: np.ndarray,
    keys: Sequence[tuple[int, ...]] | None,
    cost: CostModel,
    degrees: Sequence[int],
    window_s: float,
    long_threshold: int,
    block_tokens: int,
    beta: float,
    lam: float,
) -> History:
    """D̄ for every non-empty subset of ``degrees`` plus the long share (see module docstring)."""
    n = len(lengths)
    cached = np.zeros(n, dtype=np.float64)
    if keys is not None:
        seen: set[int] = set()
        for i, ks in enumerate(keys):  # per block, once per request: the longest previously seen prefix
            m = 0
            for k in ks:
                if k not in seen:
                    break
                m += 1
            cached[i] = m
            seen.update(ks)
    L = lengths.astype(np.float64)
    p = np.minimum(cached * block_tokens, np.maximum(L - 1, 0))
    r = L - p
    est = {c: cost.predict_degree(c, r, p) for c in degrees}
    duration = max(float(arrivals_s.max() - arrivals_s.min()), window_s) if n else window_s
    windows = duration / window_s
    demand: dict[tuple[int, ...], float] = {}
    for size in range(1, len(degrees) + 1):
        for subset in itertools.combinations(sorted(degrees), size):
            c_min = subset[0]
            weighted = np.stack([est[c] * (beta + lam * (c - c_min) / c_min) for c in subset])
            pick = np.argmin(weighted, axis=0)  # first minimum: lower degree on ties
            chosen = np.stack([est[c] for c in subset])[pick, np.arange(n)]
            demand[subset] = float(chosen.sum()) / windows
    long_share = float((lengths > long_threshold).mean()) if n else 0.0
    return History(n, duration, windows, long_share, demand)


def _gpu_order(lattice: Lattice, counts: Counts) -> tuple[int, ...]:
    """GPUs per degree, largest degree first (lexicographic preference for large workers)."""
    return tuple(n * d for d, n in sorted(zip(lattice.degrees, counts, strict=True), reverse=True))


def choose_initial(
    lattice: Lattice, cost: CostModel, window_s: float, headroom: float, history: History | None
) -> dict[int, int]:
    """The initial composition (degree -> worker count); see the module docstring."""
    top = max(lattice.degrees)
    if history is None:
        return {top: lattice.nodes * lattice.gpus_per_node // top}
    kappa = {c: cost.kappa(c, window_s) for c in lattice.degrees}
    scored: list[tuple[bool, float, tuple[int, ...], Counts]] = []
    for counts in lattice.reachable():
        cap = sum(kappa[d] * n for d, n in zip(lattice.degrees, counts, strict=True))
        present = tuple(d for d, n in zip(lattice.degrees, counts, strict=True) if n)
        ok = cap >= (1.0 + headroom) * history.demand_s[present]
        scored.append((ok, cap, _gpu_order(lattice, counts), counts))
    if any(s[0] for s in scored):
        best = max((s for s in scored if s[0]), key=lambda s: s[2])
    else:
        best = max(scored, key=lambda s: (s[1], s[2]))
    return lattice.as_dict(best[3])
