"""The zero-queue lower bound: every request at its best degree with its full matched prefix, no waiting.

"Matched prefix" = the longest prefix of the request that any earlier arrival carried (an infinite, global,
instantly shared cache). In the simulator a worker can only hold blocks of requests that arrived earlier, so
every policy's reuse P lies in [0, P_match] (block multiples). E_C(L − P, P) is concave in P
(d²E/dP² = −α_C/C ≤ 0), so its minimum over that interval is at an end point:

    LB_i = min_C min(E_C(L, 0), E_C(L − P_match, P_match)) + T_ext ≤ TTFT_i under any policy.
"""

from __future__ import annotations

from collections.abc import Sequence

from vertumnus.cost_model import CostModel
from vertumnus.engines.sim.worker import reused_tokens
from vertumnus.sim.metrics import RequestRecord
from vertumnus.types import Request


def lower_bound(
    requests: Sequence[Request], cost: CostModel, degrees: Sequence[int], block_tokens: int, t_ext_s: float
) -> list[RequestRecord]:
    """Per-request lower-bound records (``worker`` −1, ``degree`` = the best degree), in arrival order."""
    seen: set[int] = set()
    out: list[RequestRecord] = []
    degs = sorted(degrees)
    for r in sorted(requests, key=lambda q: q.arrival_s):
        keys = r.block_keys
        held = 0
        # Chained keys: key k seen ⇒ keys 0..k−1 seen, so the leading run is the matched prefix.
        while held < len(keys) and keys[held] in seen:
            held += 1
        p = reused_tokens(held, r.input_len, block_tokens)
        best_e, best_c, best_p = float("inf"), degs[0], 0
        for c in degs:
            for pp in (0, p):
                e = cost.predict(c, r.input_len - pp, pp)
                if e < best_e:
                    best_e, best_c, best_p = e, c, pp
        rec = RequestRecord(r.request_id, r.arrival_s, r.input_len, r.slo_s, -1, best_c, best_p)
        rec.finished_s = r.arrival_s + best_e
        rec.ttft_s = best_e + t_ext_s
        rec.status = "done"
        out.append(rec)
        seen.update(keys)
    return out
