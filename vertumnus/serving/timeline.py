"""Per-request timing records behind ``GET /v1/requests/{id}``.

All instants are seconds on the server's monotonic clock (the pool's clock). Breakdown::

    arrival ──router──► placed ──queue──► prefill_started ──prefill──► prefill_done ──hand-off──► first_token
    └──────────────────────────────────────── TTFT ─────────────────────────────────────────────┘

``queue_s`` covers routing and waiting at the worker; ``handoff_s`` covers moving the KV to decode and producing
the first token. The log keeps the most recent ``capacity`` records (bounded memory).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field


@dataclass(slots=True)
class Timeline:
    """What happened to one request."""

    request_id: str
    arrival_s: float
    prompt_tokens: int
    slo_s: float
    user: str | None = None
    placed_s: float | None = None
    prefill_started_s: float | None = None
    prefill_done_s: float | None = None
    first_token_s: float | None = None
    finished_s: float | None = None
    worker_id: int | None = None
    degree: int | None = None
    cached_tokens: int = 0
    completion_tokens: int = 0
    placements: int = 0  # > 1 when the request was re-placed (drain or worker failure)
    outcome: str = "running"
    finish_reason: str | None = None
    workers: list[int] = field(default_factory=list)

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.arrival_s

    def as_json(self) -> dict[str, object]:
        def d(a: float | None, b: float | None) -> float | None:
            return None if a is None or b is None else round(b - a, 6)

        return {
            "id": self.request_id,
            "outcome": self.outcome,
            "finish_reason": self.finish_reason,
            "user": self.user,
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "completion_tokens": self.completion_tokens,
            "worker": self.worker_id,
            "degree": self.degree,
            "placements": self.placements,
            "workers": list(self.workers),
            "slo_s": None if self.slo_s == float("inf") else self.slo_s,
            "timing_s": {
                "router": d(self.arrival_s, self.placed_s),
                "queue": d(self.arrival_s, self.prefill_started_s),
                "prefill": d(self.prefill_started_s, self.prefill_done_s),
                "handoff": d(self.prefill_done_s, self.first_token_s),
                "ttft": d(self.arrival_s, self.first_token_s),
                "total": d(self.arrival_s, self.finished_s),
            },
        }


class TimelineLog:
    """Bounded insertion-ordered map request_id -> Timeline (oldest dropped first)."""

    __slots__ = ("_items", "capacity")

    def __init__(self, capacity: int = 10000) -> None:
        self.capacity = capacity
        self._items: OrderedDict[str, Timeline] = OrderedDict()

    def add(self, t: Timeline) -> None:
        self._items[t.request_id] = t
        if len(self._items) > self.capacity:
            self._items.popitem(last=False)

    def get(self, request_id: str) -> Timeline | None:
        return self._items.get(request_id)

    def recent(self, n: int) -> list[Timeline]:
        """The ``n`` most recently admitted requests, newest first."""
        out: list[Timeline] = []
        for t in reversed(self._items.values()):
            if len(out) >= n:
                break
            out.append(t)
        return out

    def __len__(self) -> int:
        return len(self._items)
