"""The serving runtime: one asyncio loop owns the prefill pool, the data plane's callbacks, decode and metrics.

Why the pool lives in the server process (not in a separate scheduler actor): every request must be placed by
the scheduler before any engine work starts, so an actor would add a Ray round trip (~1 ms on this class of
machine, more under load) to the critical path of every request and serialise the pool behind an actor mailbox
anyway. Inside the server, placement is a plain call on the same event loop that parsed the request; engine
callbacks (``EngineEvents``) arrive as asyncio tasks on that loop, so the pool sees a strictly serial stream of
calls without locks. Ray still hosts everything that holds GPU/CPU work and state worth isolating: rank actors
(weights, KV) and decode actors. If the server process dies, HTTP is gone regardless of where the pool lives.

Request lifecycle (all on the loop)::

    admit (429 past serving.max_inflight) ─► Request(block keys hashed once) ─► pool.submit ─► ... engine ...
    ─► pool listener request_done (exactly once) ─► take hand-off ─► decode stream ─► first token (TTFT) ─► done

Admission (ready, some worker can serve, in-flight slots, prompt length) is vertumnus/serving/admission.py; the
pool's timers and the predictive decision thread are vertumnus/serving/pool_timer.py.

A client that goes away closes the generator: before its prefill finished the request is marked cancelled and
its hand-off is dropped on arrival (the prefill itself is not interrupted: a CP step is not preemptible); during
decode the backend's ``abort`` frees the decode KV at once.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import secrets
import time
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from typing import Any

from vertumnus.cache.block_keys import keys_from_tokens
from vertumnus.config import VertumnusConfig
from vertumnus.cost_model import CostModel
from vertumnus.interfaces import DataPlane, EngineStatsSource
from vertumnus.pool import GAVE_UP_ERROR, PoolSnapshot, PrefillPool, RequestRejected
from vertumnus.serving.admission import UNAVAILABLE_FAIL_S, Admission
from vertumnus.serving.errors import APIError
from vertumnus.serving.handoff import DecodeBackend, DecodeChunk, DecodeRequest, Handoff, HandoffSource
from vertumnus.serving.metrics import ServingMetrics, WorkerRow
from vertumnus.serving.observed import ObservedDataPlane
from vertumnus.serving.pool_timer import PoolTimer
from vertumnus.serving.sampling import SamplingParams
from vertumnus.serving.timeline import Timeline, TimelineLog
from vertumnus.types import (
    CacheOp,
    CacheOpKind,
    Placement,
    PrefillResult,
    ReconfigKind,
    ReconfigPlan,
    Request,
)

log = logging.getLogger("vertumnus.serving")


@dataclass(slots=True)
class Submission:
    """A placed request: its prefill's hand-off arrives on ``future`` (exactly once)."""

    request: Request
    timeline: Timeline
    future: asyncio.Future[Handoff]
    cancelled: bool = False


class ServingRuntime:
    """Pool + data plane + decode backend + metrics of one server (see module docstring)."""

    def __init__(
        self,
        cfg: VertumnusConfig,
        data_plane: DataPlane,
        decode: DecodeBackend,
        cost: CostModel,
        engine_name: str,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cfg = cfg
        self.clock = clock
        self.engine_name = engine_name
        self.decode = decode
        self.data_plane = ObservedDataPlane(data_plane, self)
        # decided once: a Protocol isinstance check costs ~0.5 ms, far too much per request
        self._handoff_source = data_plane if isinstance(data_plane, HandoffSource) else None
        self.pool = PrefillPool(cfg, cost, self.data_plane, clock)
        # window ends, cache scans and the predictive decision (in a thread) run off this timer
        self.timer = PoolTimer(self.pool, clock, self._fail_overdue)
        self.pool.add_listener(self)
        self.metrics = ServingMetrics(self.worker_rows, cfg.pool.degrees, lambda: self.pool.rebalanced)
        # the engine's own counters (vLLM: KV-event feeds, logical reclamations, restarts) join /metrics
        self.engine_stats_source = data_plane if isinstance(data_plane, EngineStatsSource) else None
        if self.engine_stats_source is not None:
            self.metrics.registry.register(self.engine_stats_source.collector())
        self.admission = Admission(cfg, self.pool, self.metrics)
        self.timelines = TimelineLog()
        self.block_tokens = cfg.cache.block_tokens
        self._pending: dict[str, Submission] = {}
        self._id_tag = secrets.token_hex(7)
        self._ids = itertools.count()
        self._background: set[asyncio.Task[Any]] = set()

    # -- lifecycle ------------------------------------------------------------------------------------------
    async def start(self, timeout_s: float = 600.0) -> None:
        """Start decode and the pool; return once every initial worker acknowledged its epoch (ACTIVE)."""
        await self.decode.start()
        self.pool.start()
        deadline = self.clock() + timeout_s
        while not all(r.state == "active" for r in self.worker_rows()):
            failed = getattr(self.data_plane.inner, "startup_error", None)  # engines that can fail to start
            if failed is not None:
                raise RuntimeError(f"the data plane failed to start: {type(failed).__name__}: {failed}") from failed
            if self.clock() > deadline:
                raise RuntimeError("prefill workers did not become ACTIVE in time: " + repr(self.worker_rows()))
            await asyncio.sleep(0.05)
        self.timer.start()
        self.admission.ready = True

    def engine_stats(self) -> dict[str, Any] | None:
        """The data plane's own counters (None for engines without any)."""
        return None if self.engine_stats_source is None else self.engine_stats_source.stats()

    async def close(self) -> None:
        """Stop the timer, decode and the data plane (idempotent)."""
        self.admission.ready = False
        self.timer.stop()
        await self.decode.close()
        self.data_plane.close()

    def _fail_overdue(self) -> None:
        """Every timer tick: once no worker could serve for ``UNAVAILABLE_FAIL_S``, the accepted requests still
        waiting get 503 (admission.py)."""
        overdue = self.admission.overdue(self.clock())
        if overdue is None:
            return
        reason, unavailable_s = overdue
        waiting = [sub for sub in self._pending.values() if not sub.future.done() and not sub.cancelled]
        for sub in waiting:
            sub.future.set_exception(
                APIError(503, f"{reason}; waited {UNAVAILABLE_FAIL_S:.0f} s", code="no_worker_available")
            )
        if waiting:
            log.warning(
                "failed %d waiting requests: no worker could serve for %.0f s",
                len(waiting),
                unavailable_s,
            )

    # -- requests -------------------------------------------------------------------------------------------
    def new_request_id(self, prefix: str) -> str:
        """Unique per server: a random per-process tag plus a counter (uuid4 reads os.urandom on every call,
        ~0.2 ms on some VMs — too much per request)."""
        return f"{prefix}-{self._id_tag}{next(self._ids):010x}"

    def submit(
        self,
        request_id: str,
        prompt_ids: list[int],
        max_tokens: int,
        slo_s: float | None,
        user: str | None,
        arrival_s: float,
    ) -> Submission:
        """Hash the prompt's blocks once and place the request on the pool (raises 400 when no worker could
        ever serve it). The caller holds an admission slot (``admission.admit()``) and then consumes :meth:`stream`."""
        n = len(prompt_ids)
        slo = slo_s if slo_s is not None else self.cfg.slo.base_s + self.cfg.slo.per_token_s * n
        tl = Timeline(request_id, arrival_s, n, slo, user=user)
        req = Request(
            request_id,
            arrival_s,
            n,
            keys_from_tokens(prompt_ids, self.block_tokens),
            output_len=max_tokens,
            slo_s=slo,
            token_ids=prompt_ids,
        )
        fut: asyncio.Future[Handoff] = asyncio.get_running_loop().create_future()
        sub = Submission(req, tl, fut)
        self._pending[request_id] = sub
        try:
            self.pool.submit(req)
        except RequestRejected as e:
            self._pending.pop(request_id, None)
            self.metrics.requests.labels("too_long" if e.reason == "too_long" else "rejected").inc()
            raise APIError(400, str(e), param="prompt", code=e.reason) from None
        self.timelines.add(tl)
        tl.placed_s = self.clock()
        self.metrics.router.observe(tl.placed_s - arrival_s)
        return sub

    async def stream(
        self, sub: Submission, params: SamplingParams, eos_ids: frozenset[int]
    ) -> AsyncGenerator[DecodeChunk, None]:
        """Wait for the request's prefill, then stream its decode chunks. Closing the iterator early (client
        gone, stop string) cancels the request and frees its decode KV."""
        tl = sub.timeline
        request_id = tl.request_id
        in_decode = False
        finished = False
        try:
            handoff = await sub.future
            in_decode = True
            async for chunk in self.decode.stream(DecodeRequest(handoff, params, eos_ids)):
                if tl.first_token_s is None and chunk.token_ids:
                    tl.first_token_s = self.clock()
                    self.metrics.observe_ttft(tl.first_token_s - tl.arrival_s, tl.prompt_tokens, tl.slo_s)
                    if tl.prefill_done_s is not None:
                        self.metrics.handoff.observe(tl.first_token_s - tl.prefill_done_s)
                tl.completion_tokens += len(chunk.token_ids)
                if chunk.finish_reason is not None:
                    tl.finish_reason = chunk.finish_reason
                    finished = True
                yield chunk
            finished = True
        except APIError:
            tl.outcome = "error"
            self.metrics.requests.labels("error").inc()
            raise
        except Exception:
            tl.outcome = "error"
            self.metrics.requests.labels("error").inc()
            log.exception("request %s failed", request_id)
            # the exception (often a Ray error with a remote traceback) goes to the log, never into the body
            raise APIError(500, f"generation failed (request {request_id}; see the server log)") from None
        finally:
            tl.finished_s = self.clock()
            self.metrics.completion_tokens.inc(tl.completion_tokens)
            if tl.outcome == "running":
                tl.outcome = "ok" if finished else "cancelled"
                self.metrics.requests.labels(tl.outcome).inc()
            if tl.outcome != "ok":
                sub.cancelled = True  # a hand-off still to come is dropped on arrival
                if in_decode:
                    self._spawn(self.decode.abort(request_id))

    def cancel_unstarted(self, sub: Submission) -> None:
        """The client left before its stream was ever consumed: cancel (the hand-off is dropped on arrival)."""
        tl = sub.timeline
        if tl.outcome == "running":
            tl.outcome = "cancelled"
            tl.finished_s = self.clock()
            self.metrics.requests.labels("cancelled").inc()
        sub.cancelled = True

    def finish_early(self, sub: Submission, reason: str) -> None:
        """The caller stopped on a stop string before the decode side did: count it as a normal finish; the
        caller then closes the stream, which aborts decode."""
        tl = sub.timeline
        tl.finish_reason = reason
        tl.outcome = "ok"
        self.metrics.requests.labels("ok").inc()
        self._spawn(self.decode.abort(tl.request_id))

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # -- PoolListener ---------------------------------------------------------------------------------------
    def request_done(self, request: Request, placement: Placement | None, result: PrefillResult | None) -> None:
        """The pool's final word on a prefill (exactly once, after any re-placement)."""
        sub = self._pending.pop(request.request_id, None)
        handoff = self._take_handoff(request)
        if sub is None or sub.future.done():
            return
        tl = sub.timeline
        if result is not None:
            tl.prefill_done_s = result.finished_s
            tl.worker_id, tl.cached_tokens = result.worker_id, result.cached_tokens
        if placement is not None:
            tl.degree = placement.degree
        if sub.cancelled:
            return  # the client is gone; dropping the hand-off releases its KV
        if result is None or placement is None or not result.ok:
            error = result.error if result is not None else "no worker can serve it"
            if placement is None:  # accepted into the backlog, then no worker could ever take it
                sub.future.set_exception(APIError(400, f"request cannot be served: {error}", code="unservable"))
            else:
                # engine errors (Ray's carry pids, IPs and remote tracebacks) go to the log, not into the body
                log.warning("request %s: prefill failed: %s", request.request_id, error)
                public = error if error == GAVE_UP_ERROR else f"request {request.request_id}; see the server log"
                sub.future.set_exception(APIError(500, f"prefill failed: {public}", code="prefill_failed"))
            return
        self.metrics.prefill.labels(str(placement.degree)).observe(max(result.finished_s - result.started_s, 0.0))
        self.metrics.prompt_tokens.inc(request.input_len)
        self.metrics.cached_tokens.inc(result.cached_tokens)
        sub.future.set_result(handoff)

    def _take_handoff(self, request: Request) -> Handoff:
        got = self._handoff_source.take_handoff(request.request_id) if self._handoff_source is not None else None
        return got or Handoff(request.request_id, list(request.token_ids or []))

    def reconfig_done(self, plan: ReconfigPlan, drain_s: float, switch_s: float) -> None:
        self.metrics.reconfigs.labels("split" if plan.kind == ReconfigKind.SPLIT else "merge").inc()
        self.metrics.reconfig_s.labels("drain").observe(drain_s)
        self.metrics.reconfig_s.labels("switch").observe(switch_s)

    def cache_op_done(self, op: CacheOp, ok: bool) -> None:
        kind = CacheOpKind(op.kind).name.lower()
        (self.metrics.cache_ops if ok else self.metrics.cache_op_failures).labels(kind).inc()

    # -- observed engine events (ObservedDataPlane) ---------------------------------------------------------
    def on_prefill_started(self, worker_id: int, request_id: str, now: float) -> None:
        pend = self._pending.get(request_id)
        if pend is None:
            return
        tl = pend.timeline
        if tl.prefill_started_s is None:
            self.metrics.queue.observe(now - tl.arrival_s)
        tl.prefill_started_s = now
        tl.placements += 1
        tl.workers.append(worker_id)
        if tl.placements > 1:
            self.metrics.replacements.inc()

    def on_worker_failed(self, worker_id: int, reason: str) -> None:
        log.warning("worker %d failed: %s", worker_id, reason)
        self.metrics.worker_failures.inc()
        self.admission.worker_failed(worker_id, reason)

    # -- views ----------------------------------------------------------------------------------------------
    def worker_rows(self, snap: PoolSnapshot | None = None) -> list[WorkerRow]:
        """The pool's workers as /v1/pool and the metrics show them."""
        snap = snap or self.pool.snapshot()
        return [
            WorkerRow(w.worker_id, self.engine_name, w.degree, w.node, tuple(w.ranks), w.state.lower(), w.epoch,
                      w.queue_s, w.cached_blocks, w.queued, w.running, w.free_kv_blocks)
            for w in snap.workers
        ]  # fmt: skip

    def reconfigure(self, op: str, worker_id: int) -> ReconfigPlan:
        """Order a split / merge (admin); ValueError when the controller refuses."""
        kind = ReconfigKind.SPLIT if op == "split" else ReconfigKind.MERGE
        return self.pool.reconfigure(kind, worker_id)
