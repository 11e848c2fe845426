"""The clairvoyant controller: the predictive controller with the forecast replaced by the requests to come.

A reference for the out-of-sample protocol (:mod:`vertumnus.eval.evaluate`), not a policy: no server knows its
future arrivals. The predictive controller forecasts the next span from the last one; at each decision the
clairvoyant reference hands it the requests that *will* arrive in ``[now, now + span)`` instead, and leaves
everything else as configured (margins, persistence, resamples, the switch it charges, the moves it may take).
Its mean TTFT against the controller's splits the controller's loss to the best fixed composition in two:

    controller ÷ best fixed  =  (controller ÷ clairvoyant)  ×  (clairvoyant ÷ best fixed)
                                 the forecast's error          what a perfect forecast still pays: the start,
                                                               the drains and switches, the myopic span

Prefix of a request to come (the forecast's third field is the prefix a request found): the longest leading run
of its blocks that a worker validly holds now, or that an earlier request of the same span carries (its blocks
will be cached by then: a later turn of a conversation, a shared system prompt). Chained block keys make "block
j is covered" imply every block before it, so the run is found by bisection, not by a walk over the blocks.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import TYPE_CHECKING

from vertumnus.cache.manager import CacheManager
from vertumnus.controller.forecast import Arrival
from vertumnus.types import Request

if TYPE_CHECKING:
    from vertumnus.sim.runner import Simulation


class ClairvoyantForecast:
    """``now`` → the arrivals of ``[now, now + span_s)`` as (offset from now, input length, prefix tokens): a
    :class:`~vertumnus.controller.forecast.Forecaster` that knows what will arrive (so no decision waits for a
    history). It replaces the span and the burst forecast alike."""

    __slots__ = ("block_tokens", "cache", "calls", "requests", "span_s", "times")
    needs_history = False

    def __init__(self, requests: Sequence[Request], cache: CacheManager, block_tokens: int, span_s: float) -> None:
        self.requests = sorted(requests, key=lambda r: r.arrival_s)
        self.times = [r.arrival_s for r in self.requests]
        self.cache = cache
        self.block_tokens = block_tokens
        self.span_s = span_s
        self.calls = 0

    def __call__(self, now: float) -> list[Arrival]:
        self.calls += 1
        lo = bisect.bisect_left(self.times, now)
        hi = bisect.bisect_left(self.times, now + self.span_s)
        coming: set[int] = set()  # block keys of the span's earlier requests
        out = []
        for r in self.requests[lo:hi]:
            keys = r.block_keys
            held = max(self.cache.lookup(keys).held_blocks.values(), default=0)
            a, b = held, len(keys)  # invariant: keys[:a] covered; the answer lies in [a, b]
            while a < b:
                mid = (a + b + 1) // 2
                if keys[mid - 1] in coming:
                    a = mid
                else:
                    b = mid - 1
            coming.update(keys)
            out.append((r.arrival_s - now, r.input_len, min(a * self.block_tokens, r.input_len)))
        return out


def clairvoyant_forecaster(sim: Simulation) -> ClairvoyantForecast:
    """The clairvoyant reference for a simulation (``Simulation(..., forecaster=clairvoyant_forecaster)``): the
    simulation's own requests over the controller's forecast span (ValueError without the predictive
    controller)."""
    ctl = sim.pool.controller
    if not ctl.enabled or ctl.params is None:
        has = f"controller.policy {ctl.policy.name!r}" if ctl.enabled else f"no controller ({sim.policy!r})"
        raise ValueError(f"the clairvoyant reference needs the predictive controller; this run has {has}")
    return ClairvoyantForecast(sim.requests, sim.pool.cache, sim.cfg.cache.block_tokens, ctl.params.span_s)
