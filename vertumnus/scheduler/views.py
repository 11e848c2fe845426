"""Placement through a custom :class:`~vertumnus.scheduler.policy.RoutingPolicy` (the simulator's baselines).

The default placement cost runs vectorised in :class:`~vertumnus.scheduler.scheduler.Scheduler`; any other
policy sees one :class:`~vertumnus.scheduler.policy.WorkerView` per eligible worker, built here from the
scheduler's columns: Ê_w = E_{C_w}(L − P_w, P_w) with P_w = min(held_w·B, L − 1), q_w(now), and C_pref (the
degree of the least Ê·(β + λ·(C − C_min)/C_min), as the default placement computes it). No fetch is priced.
"""

from __future__ import annotations

import numpy as np

from vertumnus.cost_model import CostModel
from vertumnus.scheduler.policy import RoutingPolicy, WorkerView
from vertumnus.scheduler.table import WorkerTable
from vertumnus.types import PrefixMatch, Request, WorkerState


def choose(
    t: WorkerTable,
    slices: list[tuple[int, int, int]],
    cost: CostModel,
    router: RoutingPolicy,
    block_tokens: int,
    beta: float,
    lam: float,
    request: Request,
    match: PrefixMatch,
    eligible: np.ndarray,
    c_min: int,
    now: float,
) -> tuple[int, int, int, float, float, int]:
    """(row, held blocks, P, Ê, q_w, C_pref) of the router's choice among the eligible rows; ``slices``: the
    (degree, first row, end row) ranges of ``t``. ValueError when the router picks a non-candidate."""
    L = request.input_len
    held = np.zeros(len(t.infos), dtype=np.int64)
    for wid, h in match.held_blocks.items():
        i = t.index.get(wid)
        if i is not None:
            held[i] = h
    p = np.minimum(held * block_tokens, L - 1)
    r = L - p
    est = np.empty(len(t.infos), dtype=np.float64)
    for c, lo, hi in slices:
        est[lo:hi] = cost.predict_degree(c, r[lo:hi], p[lo:hi])
    weighted = est * (beta + lam * (t.degree - c_min) / c_min)
    weighted[~eligible] = np.inf
    q = t.queue_vector(now)
    views = [
        WorkerView(
            worker_id=t.infos[i].worker_id,
            degree=int(t.degree[i]),
            node=t.infos[i].node,
            state=WorkerState(int(t.state[i])),
            queue_s=float(q[i]),
            outstanding_blocks=int(t.outstanding[i]),
            free_blocks=int(t.free_blocks[i]),
            held_blocks=int(held[i]),
            cached_tokens=int(p[i]),
            predicted_s=float(est[i]),
        )
        for i in np.flatnonzero(eligible)
    ]
    wid = router.choose(request, match, views, now)
    k = t.index.get(wid)
    if k is None or not eligible[k]:
        raise ValueError(f"routing policy {type(router).__name__} chose non-candidate worker {wid}")
    pref = int(t.degree[int(np.argmin(weighted))])
    return k, int(held[k]), int(p[k]), float(est[k]), float(q[k]), pref
