"""Fast fluid replay of a workload on a candidate composition (the predictive controller's model).

The replay answers "what mean TTFT would these arrivals see on this set of workers, starting from these
queues?" with the scheduler's own rule and the cost model, and nothing else:

    worker  = (degree C, free_at): the instant its queue (q_w) runs dry, relative to the decision instant 0
    arrival = (t, Ê per degree):   Ê_C = E_C(L − P, P), P = the prefix the request found when it was placed
    place   : argmin over workers of  q + β·Ê_C + λ·Ê_C·(C − C_min)/C_min,   q = max(0, free_at − t)
    then      TTFT = q + Ê_C,  free_at ← t + TTFT

Workers of one degree are interchangeable except for free_at, and J grows with q, so the best worker of a
degree is the one that frees first: one heap of free_at per degree makes a placement O(#degrees · log W)
instead of O(W). Prefixes are what requests found where they were placed (a copy-on-move model would need the
whole trie); KV capacity is not modelled. Both are the same for every candidate, which is what a comparison
needs. Pure Python + numpy: policy code.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(slots=True)
class ReplayWorkers:
    """A candidate composition as (degree → free_at of each worker), seconds from the decision instant."""

    free_at: dict[int, list[float]]

    def copy(self) -> ReplayWorkers:
        return ReplayWorkers({c: list(v) for c, v in self.free_at.items()})


@dataclass(slots=True)
class ReplayArrivals:
    """Requests to replay, in arrival order: offsets ``t`` (s) and Ê per degree (aligned arrays)."""

    t: np.ndarray
    est: Mapping[int, np.ndarray]

    def __len__(self) -> int:
        return len(self.t)

    def compressed(self, factor: float) -> ReplayArrivals:
        """The same requests arriving ``factor`` × faster (a stressed forecast)."""
        return ReplayArrivals(self.t / factor, self.est)


def replay_mean_ttft(
    workers: ReplayWorkers,
    arrivals: ReplayArrivals,
    beta: float,
    lam: float,
    extra_ttft: Sequence[float] = (),
) -> float:
    """Mean predicted TTFT of ``arrivals`` (plus the already known TTFTs ``extra_ttft``) on ``workers``.

    Returns 0.0 when there is nothing to count; ``inf`` when requests arrive and no worker exists.
    """
    degrees = sorted(c for c, v in workers.free_at.items() if v)
    n = len(arrivals)
    if n == 0:
        return float(np.mean(extra_ttft)) if len(extra_ttft) else 0.0
    if not degrees:
        return float("inf")
    c_min = degrees[0]
    # Per-degree columns by position (ascending degree: ties go to the lower degree, as in the scheduler).
    heaps = [sorted(workers.free_at[c]) for c in degrees]  # a sorted list is a valid heap
    weights = [beta + lam * (c - c_min) / c_min for c in degrees]
    ests = [arrivals.est[c].tolist() for c in degrees]
    times = arrivals.t.tolist()
    total = float(sum(extra_ttft))
    replace = heapq.heapreplace
    if len(degrees) == 2:
        # The bundled pools' case (CP4 / CP8), unrolled: this loop is most of a predictive decision's cost.
        h0, h1 = heaps
        w0, w1 = weights
        for t, e0, e1 in zip(times, ests[0], ests[1], strict=True):
            q0 = h0[0] - t
            if q0 < 0.0:
                q0 = 0.0
            q1 = h1[0] - t
            if q1 < 0.0:
                q1 = 0.0
            if q1 + w1 * e1 < q0 + w0 * e0:
                ttft = q1 + e1
                replace(h1, t + ttft)
            else:
                ttft = q0 + e0
                replace(h0, t + ttft)
            total += ttft
        return total / (n + len(extra_ttft))
    k = len(degrees)
    for i in range(n):
        t = times[i]
        best = 0
        best_j = float("inf")
        best_q = 0.0
        for d in range(k):
            q = heaps[d][0] - t
            if q < 0.0:
                q = 0.0
            j = q + weights[d] * ests[d][i]
            if j < best_j:
                best_j, best, best_q = j, d, q
        ttft = best_q + ests[best][i]
        total += ttft
        replace(heaps[best], t + ttft)
    return total / (n + len(extra_ttft))
