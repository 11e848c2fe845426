"""Admission of one server's requests: whether a request may enter (the pool started, some worker can serve,
an in-flight slot free, a prompt no longer than every worker's limit), and how long accepted requests may wait
while no worker can serve.

Every refusal is an :class:`~vertumnus.serving.errors.APIError` (429 / 503 with ``Retry-After``, 400 naming the
limit) raised before any work is queued, and counted in ``vertumnus_requests_total`` by outcome.
"""

from __future__ import annotations

from vertumnus.config import VertumnusConfig
from vertumnus.pool import PrefillPool
from vertumnus.serving.errors import APIError
from vertumnus.serving.metrics import ServingMetrics
from vertumnus.types import WorkerState

# while no worker can serve (every one FAILED, restarting) new requests get 503 at once; requests already
# accepted wait for the restart (their prefills are re-placed, FCFS), but no longer than this: then they get 503
# too, so nobody hangs on a pool whose restarts keep failing (a restart retries with backoff meanwhile)
UNAVAILABLE_FAIL_S = 180.0


class Admission:
    """The admission state of one server (see module docstring); ``ready`` is set by the runtime once every
    initial worker is ACTIVE and cleared when it closes."""

    def __init__(self, cfg: VertumnusConfig, pool: PrefillPool, metrics: ServingMetrics) -> None:
        self.pool = pool
        self.metrics = metrics
        self.max_inflight = cfg.serving.max_inflight
        self.max_model_len = cfg.pool.max_model_len
        self.inflight = 0
        self.ready = False
        self._failure: dict[int, str] = {}  # worker -> why it last failed (/health's reason while none serves)
        self._unavailable_since: float | None = None
        self._failed_state = int(WorkerState.FAILED)

    def unavailable(self) -> str | None:
        """None while at least one worker can serve (any state but FAILED: ACTIVE, or draining / switching
        into workers that will be); otherwise why not (/health, /ready, 503 at admission)."""
        if not self.ready:
            return "starting: the prefill workers are not ACTIVE yet"
        states = self.pool.scheduler.table.state
        if states.size and bool((states != self._failed_state).any()):
            return None
        why = "; ".join(f"worker {w}: {r}" for w, r in sorted(self._failure.items())) or "every worker FAILED"
        return f"no prefill worker can serve, restarting ({why}; details in the server log)"

    def worker_failed(self, worker_id: int, reason: str) -> None:
        """Remember why ``worker_id`` failed, for :meth:`unavailable`'s reason."""
        # the engine's own text (Ray errors: pids, addresses, tracebacks) stays in the log, never in a body
        self._failure[worker_id] = "a rank process died" if "died" in reason else "an engine step failed"

    def overdue(self, now: float) -> tuple[str, float] | None:
        """(why, for how long) once no worker could serve for ``UNAVAILABLE_FAIL_S``: the requests waiting then
        get 503. None while a worker can serve (which resets the clock) or not for that long yet."""
        reason = self.unavailable() if self.ready else None
        if reason is None:
            self._unavailable_since = None
            self._failure.clear()
            return None
        if self._unavailable_since is None:
            self._unavailable_since = now
        if now - self._unavailable_since < UNAVAILABLE_FAIL_S:
            return None
        return reason, now - self._unavailable_since

    def admit(self) -> None:
        """Reserve an in-flight slot or raise 429 / 503."""
        if not self.ready:
            raise APIError(503, "the prefill pool is not ready yet", code="not_ready", headers={"Retry-After": "1"})
        reason = self.unavailable()
        if reason is not None:
            self.metrics.requests.labels("unavailable").inc()
            raise APIError(503, reason, code="no_worker_available", headers={"Retry-After": "5"})
        if self.inflight >= self.max_inflight:
            self.metrics.requests.labels("rate_limited").inc()
            raise APIError(
                429,
                f"too many requests in flight (serving.max_inflight={self.max_inflight}); retry shortly",
                code="rate_limit_exceeded",
                headers={"Retry-After": "1"},
            )
        self.inflight += 1
        self.metrics.inflight.set(self.inflight)

    def release(self) -> None:
        """Give back the slot :meth:`admit` reserved."""
        self.inflight -= 1
        self.metrics.inflight.set(self.inflight)

    def check_length(self, n_tokens: int) -> None:
        """400 naming the limit when a prompt exceeds every worker's limit (before any work is queued)."""
        limit = self.max_model_len
        if n_tokens > limit:
            self.metrics.requests.labels("too_long").inc()
            raise APIError(
                400,
                f"prompt has {n_tokens} tokens; the largest worker accepts at most {limit} tokens (max_model_len)",
                param="prompt",
                code="context_length_exceeded",
            )
