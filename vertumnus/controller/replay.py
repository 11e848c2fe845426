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
    heaps = {c: sorted(workers.free_at[c]) for c in degrees}  # a sorted list is a valid heap
    weight = {c: beta + lam * (c - c_min) / c_min for c in degrees}
    est = {c: arrivals.est[c].tolist() for c in degrees}
    times = arrivals.t.tolist()
    total = float(sum(extra_ttft))
    for i in range(n):
        t = times[i]
        best_c = degrees[0]
        best_j = float("inf")
        best_q = 0.0
        for c in degrees:  # ascending: ties go to the lower degree, as in the scheduler
            q = heaps[c][0] - t
            if q < 0.0:
                q = 0.0
            j = q + weight[c] * est[c][i]
            if j < best_j:
                best_j, best_c, best_q = j, c, q
        ttft = best_q + est[best_c][i]
        total += ttft
        heapq.heapreplace(heaps[best_c], t + ttft)
    return total / (n + len(extra_ttft))
