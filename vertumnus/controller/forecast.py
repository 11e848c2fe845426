"""The predictive policy's forecasts: what will arrive over the next span, as (offset from now, input length,
prefix tokens) per request.

Every forecaster answers one question, ``forecaster(now)``, behind :class:`Forecaster`:

    span   the arrivals of the last span (:meth:`ArrivalLog.forecast`: a busy span as recorded, a young log
           tiled, a quiet one at its rate)
    burst  the arrivals of only the last seconds, repeated over the span (:meth:`ArrivalLog.burst`)
    ...    a reference outside the production controller, e.g. the evaluation's clairvoyant forecast
           (:mod:`vertumnus.eval.clairvoyant`), injected with :meth:`Controller.use_forecaster
           <vertumnus.controller.controller.Controller.use_forecaster>`
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

Arrival = tuple[float, int, int]  # (offset from the decision instant, input length, prefix tokens found)


class Forecaster(Protocol):
    """``forecaster(now)``: the arrivals forecast for ``[now, now + span)``, offsets from ``now``.

    ``needs_history``: the forecast is drawn from the arrivals seen, so a decision waits until there are enough
    of them (a forecaster that knows what will arrive does not)."""

    needs_history: bool

    def __call__(self, now: float) -> list[Arrival]: ...


MAX_TILES = 20  # a log younger than span / 20 is tiled only 20 times (the replay's cost stays bounded)


@dataclass(slots=True)
class ArrivalLog:
    """First placements of recent requests: arrival instant, input length, prefix found (tokens)."""

    keep_s: float
    keep_n: int
    entries: deque[tuple[float, int, int]] = field(default_factory=deque)
    origin: float | None = None  # the earliest arrival ever logged: nothing is known before it

    def add(self, t: float, input_len: int, cached: int) -> None:
        self.origin = t if self.origin is None else min(self.origin, t)
        self.entries.append((t, input_len, cached))
        # Entries older than keep_s go, except the keep_n most recent (a quiet pool still has a forecast).
        while len(self.entries) > self.keep_n and self.entries[0][0] < t - self.keep_s:
            self.entries.popleft()

    def too_young(self, now: float, span_s: float, min_n: int) -> bool:
        """Fewer than ``min_n`` arrivals logged, the first of them less than ``span_s`` ago (or none yet): the
        forecast would tile a handful of arrivals over the span."""
        if self.origin is not None and self.origin <= now - span_s:
            return False
        return len(self.entries) < min_n

    def forecast(self, now: float, span_s: float, min_n: int) -> list[tuple[float, int, int]]:
        """The arrivals to replay, as (offset from the decision instant, input length, prefix tokens).

        Busy pool (≥ ``min_n`` arrivals in the last ``span_s``): those arrivals at their own offsets within the
        span, burstiness included. A log younger than the span (the pool just started) holds only the last
        ``now − origin`` seconds; those are repeated back to back to fill the span, so the forecast has the
        observed rate over the whole span instead of an empty head that the queues would drain in::

            span       |<-------------------- span_s -------------------->|
            observed                                      |<-- now−origin -->|
            forecast   |  A B C  |  A B C  |  A B C  |  A B C  |  A B C  |   (not: |      empty      |  A B C  |)

        Quiet pool: the request *mix* of the ``min_n`` most recent arrivals at the
        *rate* of the span (evenly spaced, one per ``span_s / n`` seconds; one per span when none arrived), so
        that a quiet spell is forecast as quiet, not as the burst that preceded it. A young log with fewer than
        ``min_n`` arrivals (n ≥ 2) is forecast at the rate it has seen, (n − 1) per ``now − origin`` seconds,
        with its mix repeated over the span.
        """
        ordered = sorted(self.entries)  # re-placed backlog can be logged after later arrivals
        start = now - span_s
        in_span = [e for e in ordered if e[0] >= start]
        seen = now - max(start, self.origin if self.origin is not None else start)
        if len(in_span) >= min_n:
            if seen >= span_s or seen <= 0:
                return [(t - start, n, p) for t, n, p in in_span]
            base = now - seen
            reps = min(math.ceil(span_s / seen), MAX_TILES)
            tiled = [(t - base + k * seen, n, p) for k in range(reps) for t, n, p in in_span]
            return [e for e in tiled if e[0] < span_s] if reps * seen > span_s else tiled
        mix = ordered[-min_n:]
        if 0 < seen < span_s and len(in_span) >= 2:
            # A young log with fewer than min_n arrivals: the rate it has seen (the first arrival marks the
            # origin, so n − 1 arrivals fell in ``seen``), the mix repeated over the span — not n arrivals
            # spread over a span the pool has not lived yet, which forecasts a busy start-up as quiet.
            gap = seen / (len(in_span) - 1)
            count = max(len(mix), min(math.ceil(span_s / gap), MAX_TILES * len(mix)))
            return [(k * gap, *mix[k % len(mix)][1:]) for k in range(count)]
        gap = span_s / max(len(in_span), 1)
        return [(k * gap, n, p) for k, (_, n, p) in enumerate(mix)]

    def burst(self, now: float, recent_s: float, span_s: float) -> list[tuple[float, int, int]]:
        """The arrivals of only the last ``recent_s`` seconds, repeated back to back over ``span_s``: the
        forecast if the current rate lasts (empty when nothing arrived that recently)."""
        start = now - recent_s
        recent = sorted(e for e in self.entries if e[0] >= start)
        reps = max(1, round(span_s / recent_s))
        return [(t - start + k * recent_s, n, p) for k in range(reps) for t, n, p in recent]


@dataclass(slots=True)
class SpanForecaster:
    """The span forecast of an :class:`ArrivalLog` (:meth:`ArrivalLog.forecast`)."""

    log: ArrivalLog
    span_s: float
    min_n: int
    needs_history: bool = True

    def __call__(self, now: float) -> list[Arrival]:
        return self.log.forecast(now, self.span_s, self.min_n)


@dataclass(slots=True)
class BurstForecaster:
    """The burst forecast of an :class:`ArrivalLog` (:meth:`ArrivalLog.burst`): the last ``recent_s`` repeated
    over ``span_s``."""

    log: ArrivalLog
    recent_s: float
    span_s: float
    needs_history: bool = True

    def __call__(self, now: float) -> list[Arrival]:
        return self.log.burst(now, self.recent_s, self.span_s)
