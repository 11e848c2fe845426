"""The vLLM backend as a :class:`~vertumnus.interfaces.DataPlane`: one vLLM engine per CP worker.

Runs on the server's event loop like the torch data plane: every DataPlane method returns at once and the work
happens in loop tasks; no method calls back into the pool synchronously. Per worker one FIFO of items runs one
at a time (prefills, cache-op prefills, the park marker).

::

    submit ─► hashes registered (engine blocks → cache blocks) ─► FIFO ─► actor.prefill(max_tokens=1)
                                                                              │ PrefillResult, hand-off
    engine ─ZMQ─► KvEventSubscriber (thread) ─call_soon_threadsafe─► WorkerBlocks ─► CacheReport ─► pool

Reconfiguration (vLLM cannot change ``prefill_context_parallel_size`` in place): the sources drain and park as
usual; ``activate`` stops their engines, announces their caches cleared, starts one engine per target on the
same ranks and acks the plan's epoch once each target serves. Cache ops: :mod:`~vertumnus.engines.vllm.ops`.

Background tasks fail loudly: an exception escaping a loop task (a bug in a step, or in an EngineEvents callback
it calls) is logged, counted (``task_failures``), kept in :attr:`VllmDataPlane.task_failures`, and fails the
worker(s) the task belongs to — the pool sees ``worker_failed`` (and re-places that worker's requests) instead
of waiting forever for a completion that will not come. :meth:`VllmDataPlane.raise_task_failure` re-raises the
first one in the caller (tests poll it while they wait, so an assertion inside a callback fails the test at once).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import ray

from vertumnus.cache.block_keys import engine_blocks_per_block
from vertumnus.config import VertumnusConfig
from vertumnus.engines.vllm import metrics, ops, restart
from vertumnus.engines.vllm.blockmap import KeyIndex, WorkerBlocks
from vertumnus.engines.vllm.engine_args import EngineSpec, engine_env, engine_kwargs, kv_transfer_dict
from vertumnus.engines.vllm.events import Event
from vertumnus.engines.vllm.hashing import VllmBlockHasher
from vertumnus.engines.vllm.placement import Placement
from vertumnus.engines.vllm.subscriber import KvEventSubscriber
from vertumnus.engines.vllm.worker import (
    REMOTE_DECODE_PARAMS,
    Item,
    RestartRecord,
    VllmWorker,
    call,
    check_engine,
    stop_all,
)
from vertumnus.interfaces import EngineEvents, PrefillJob
from vertumnus.serving.handoff import Handoff
from vertumnus.serving.hosting import RayHosting
from vertumnus.types import CacheOp, CacheReport, CacheReportKind, PrefillResult, ReconfigPlan, WorkerGroup

log = logging.getLogger("vertumnus.vllm")


@dataclass(slots=True, frozen=True)
class TaskFailure:
    """An exception that escaped one of the data plane's loop tasks."""

    what: str  # the task, e.g. "worker 0 item"
    workers: tuple[int, ...]  # the workers it belonged to (failed because of it)
    error: Exception


class VllmDataPlane:
    """See module docstring. ``placement``: rank → Ray bundle / devices (probed at construction)."""

    def __init__(self, cfg: VertumnusConfig, hosting: RayHosting, clock: Any, placement: Placement) -> None:
        self.cfg = cfg
        self.v = cfg.vllm
        self.hosting = hosting
        self.clock = clock
        self.placement = placement
        self.gpn = cfg.pool.gpus_per_node
        self.block_tokens = cfg.cache.block_tokens
        engine_blocks_per_block(self.block_tokens, self.v.block_size)  # fail early on a non-dividing block
        if cfg.cache.retention() is not None:  # vLLM's block pool evicts from its own free queue (LRU)
            log.warning(
                "cache.retain_reused=%d is not applied by vLLM engines: their prefix cache stays plain LRU",
                cfg.cache.retain_reused,
            )
        self.workers: dict[int, VllmWorker] = {}
        self.indexes: dict[tuple[int, str | None], KeyIndex] = {}
        self.hashers: dict[tuple[int, str | None], VllmBlockHasher] = {}
        self.handoffs: dict[str, Handoff] = {}
        self.counters: Counter[str] = Counter()
        self.engine_start_s: list[float] = []
        self.restarts: list[RestartRecord] = []
        self.failures: dict[int, int] = {}
        self.feeds: list[KvEventSubscriber] = []  # every feed ever opened (their counters add up)
        self._gen = itertools.count()
        self._events: EngineEvents | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self.task_failures: list[TaskFailure] = []  # not yet re-raised by raise_task_failure()

    # -- plumbing -------------------------------------------------------------------------------------------
    @property
    def events(self) -> EngineEvents:
        assert self._events is not None, "start() not called"
        return self._events

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        assert self._loop is not None, "start() not called"
        return self._loop

    def spawn(self, coro: Awaitable[Any], what: str, workers: Sequence[VllmWorker | int] = ()) -> None:
        """Run ``coro`` as a loop task of ``workers`` (objects, or ids looked up when it fails); an exception
        escaping it fails them (module docstring)."""

        async def guarded() -> None:
            try:
                await coro
            except Exception as e:  # CancelledError (close()) is not an Exception: it passes
                self._task_failed(what, workers, e)

        task = self.loop.create_task(guarded())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def soon(
        self, fn: Callable[..., Any], *args: Any, what: str, workers: Sequence[VllmWorker | int] = (), delay: float = 0
    ) -> None:
        """``loop.call_soon`` / ``call_later`` of a plain callback, failing like :meth:`spawn` if it raises."""
        if delay > 0:
            self.loop.call_later(delay, self.guarded, what, workers, fn, *args)
        else:
            self.loop.call_soon(self.guarded, what, workers, fn, *args)

    def guarded(self, what: str, workers: Sequence[VllmWorker | int], fn: Callable[..., Any], *args: Any) -> None:
        """``fn(*args)`` now; an exception fails ``workers`` as in :meth:`spawn` (for loop callbacks)."""
        try:
            fn(*args)
        except Exception as e:
            self._task_failed(what, workers, e)

    def _task_failed(self, what: str, workers: Sequence[VllmWorker | int], e: Exception) -> None:
        """Record the failure and fail its workers (at most once each: ``fail`` ignores failed / replaced ones)."""
        log.error("vLLM data plane: %s failed", what, exc_info=e)
        owners = [w if isinstance(w, VllmWorker) else self.workers.get(w) for w in workers]
        mine = tuple(w for w in owners if w is not None)
        self.counters["task_failures"] += 1
        self.task_failures.append(TaskFailure(what, tuple(w.worker_id for w in mine), e))
        reason = f"{what} failed: {type(e).__name__}: {e}"
        for w in mine:
            try:
                self.fail(w, reason)
            except Exception as again:  # the failure report itself raised (a callback bug): keep it too
                log.error("vLLM data plane: failing worker %d raised", w.worker_id, exc_info=again)
                self.task_failures.append(TaskFailure(f"failing worker {w.worker_id}", (), again))

    def raise_task_failure(self) -> None:
        """Re-raise (and forget) the first exception that escaped a background task, if any."""
        if self.task_failures:
            failure = self.task_failures.pop(0)
            failure.error.add_note(f"raised in the vLLM data plane's background task: {failure.what}")
            raise failure.error

    def enqueue(self, w: VllmWorker, item: Item, front: bool = False) -> None:
        (w.queue.appendleft if front else w.queue.append)(item)
        self._pump(w)

    def _pump(self, w: VllmWorker) -> None:
        """Start the next item once the engine is up (prefills wait while the worker parks)."""
        if w.busy or w.failed or not w.ready or not w.queue:
            return
        if w.parking and w.queue[0].job is not None:
            return
        item = w.queue.popleft()
        w.busy = True
        self.spawn(self._run(w, item), f"worker {w.worker_id} item", (w,))

    async def _run(self, w: VllmWorker, item: Item) -> None:
        try:
            await item.run()
        finally:
            w.busy = False
            self._pump(w)

    def fail(self, w: VllmWorker, reason: str) -> None:
        """Mark FAILED once, fail its queued cache ops, stop its engine, tell the pool."""
        if w.failed or self.workers.get(w.worker_id) is not w:
            return
        w.failed = True
        self.failures[w.worker_id] = self.failures.get(w.worker_id, 0) + 1
        for it in w.queue:
            if it.op_id is not None:
                self.events.cache_op_failed(it.op_id, f"worker {w.worker_id} failed")
        w.queue.clear()
        log.error("vLLM worker %d failed: %s", w.worker_id, reason)
        self.spawn(w.stop(), f"stop of failed worker {w.worker_id}")
        self.events.worker_failed(w.worker_id, reason, self.clock())

    # -- engines --------------------------------------------------------------------------------------------
    def spec(self, group: WorkerGroup) -> EngineSpec:
        cores = self.placement.cpu_cores(group)
        env = engine_env(self.v, group.degree, cores) | self.placement.env(group)
        role = self.v.kv_role
        return EngineSpec(
            kwargs=engine_kwargs(self.cfg, group.degree, self.placement.use_gpu),
            env=env,
            replay_host=self.v.events_host,
            kv_transfer=kv_transfer_dict(self.v, role),
            label=f"of worker {group.worker_id} (CP{group.degree}, ranks {list(group.ranks)})",
        )

    def _mirror(self, w: VllmWorker) -> None:
        """Hasher and block mirror of the engine block size the config implies (checked after start)."""
        dcp = int(self.v.engine_args.get("decode_context_parallel_size", 1))
        e_tokens = self.v.block_size * dcp
        key = (e_tokens, self.v.hash_seed)
        if key not in self.indexes:
            per = engine_blocks_per_block(self.block_tokens, e_tokens)
            self.indexes[key] = KeyIndex(self.block_tokens, per, self.v.token_cache_blocks)
            self.hashers[key] = VllmBlockHasher(e_tokens, self.v.hash_seed)
        w.hasher = self.hashers[key]
        w.blocks = WorkerBlocks(w.worker_id, self.indexes[key], self.events.cache_report)

    async def launch(self, group: WorkerGroup, epoch: int) -> VllmWorker | None:
        """Start ``group``'s engine and ack ``epoch`` on every rank; FAILED (reported) on error."""
        w = VllmWorker(group, next(self._gen), group.global_ranks(self.gpn))
        self.workers[group.worker_id] = w
        self._mirror(w)
        spec = self.spec(group)
        name = f"w{group.worker_id}.g{w.generation}"
        feed = KvEventSubscriber(name, self.v.events_host, lambda evs: self._deliver(w, evs), self.v.events_resync_s)
        self.feeds.append(feed)
        try:
            info = await w.launch(spec, self.placement.options(group, spec.env), feed, self.v.start_timeout_s)
            check_engine(info, w.hasher, self.v.hash_seed)
        except Exception as e:
            text = "engine start timed out" if isinstance(e, asyncio.TimeoutError) else str(e)
            self.fail(w, text)
            return None
        self.engine_start_s.append(float(info["start_s"]))
        log.info("vLLM worker %d (CP%d) started in %.1f s", group.worker_id, group.degree, info["start_s"])
        if self.workers.get(group.worker_id) is not w:  # closed or replaced meanwhile
            await w.stop()
            return None
        w.ready = True
        self.events.cache_report(CacheReport(group.worker_id, CacheReportKind.CLEARED))  # a fresh engine
        now = self.clock()
        for r in w.ranks:
            self.events.epoch_ack(group.worker_id, r, epoch, now)
        self._pump(w)
        return w

    def _deliver(self, w: VllmWorker, events: list[Event]) -> None:
        """Subscriber thread → event loop."""
        self.loop.call_soon_threadsafe(self.guarded, f"KV events of worker {w.worker_id}", (w,), self._apply, w, events)

    def _apply(self, w: VllmWorker, events: list[Event]) -> None:
        if self.workers.get(w.worker_id) is not w or w.blocks is None or w.stopped:
            self.counters["stale_event_batches"] += 1
            return
        w.blocks.apply(events)

    # -- DataPlane: lifecycle -------------------------------------------------------------------------------
    def start(self, groups: Sequence[WorkerGroup], epoch: int, events: EngineEvents) -> None:
        self._events = events
        self._loop = asyncio.get_running_loop()
        for g in groups:
            self.spawn(self.launch(g, epoch), f"start of worker {g.worker_id}", (g.worker_id,))

    def restart(self, group: WorkerGroup, epoch: int) -> None:
        self.spawn(restart.restart(self, group, epoch), f"restart of worker {group.worker_id}", (group.worker_id,))

    def close(self) -> None:
        """Stop every engine (graceful shutdown, then kill) and every feed."""
        for t in list(self._tasks):
            t.cancel()
        workers, self.workers = list(self.workers.values()), {}
        stop_all(workers)
        self.handoffs.clear()

    # -- DataPlane: requests --------------------------------------------------------------------------------
    def submit(self, worker_id: int, job: PrefillJob) -> None:
        w = self.workers[worker_id]
        req = job.request
        if req.token_ids is not None and w.hasher is not None and w.blocks is not None:
            per = w.blocks.index.per_block
            hashes = w.hasher.hashes(req.token_ids, len(req.block_keys) * per)  # full cache blocks only
            w.blocks.index.register(req.block_keys, hashes, req.token_ids)
        self.enqueue(w, Item(lambda: self._prefill(w, job), job))

    def withdraw(self, worker_id: int) -> list[PrefillJob]:
        w = self.workers[worker_id]
        jobs = [it.job for it in w.queue if it.job is not None]
        w.queue = type(w.queue)(it for it in w.queue if it.job is None)
        return jobs

    async def _prefill(self, w: VllmWorker, job: PrefillJob) -> None:
        req, wid = job.request, w.worker_id
        started = self.clock()
        self.events.prefill_started(wid, req.request_id, started)
        vocab = int(w.info.get("vocab_size", 1 << 62))
        bad = "request without token ids" if req.token_ids is None else None
        if req.token_ids and (min(req.token_ids) < 0 or max(req.token_ids) >= vocab):
            bad = f"token ids must lie in [0, {vocab})"  # an out-of-range id would kill the engine core
        if bad is not None or req.token_ids is None:
            self.events.prefill_done(PrefillResult(req.request_id, wid, 0, started, self.clock(), False, bad))
            return
        if job.reconcile is not None:
            ops.expect(self, w, job.reconcile)
        params = dict(REMOTE_DECODE_PARAMS) if self.v.kv_connector else None
        try:
            out = await call(w.actor.prefill.remote(req.request_id, list(req.token_ids), params, False))
        except ray.exceptions.RayActorError as e:
            self.fail(w, f"engine actor died: {e}")
            return
        except RuntimeError as e:
            if "EngineDead" in str(e) or "EngineCore" in str(e):
                self.fail(w, f"engine died: {e}")
                return
            self.events.prefill_done(PrefillResult(req.request_id, wid, 0, started, self.clock(), False, str(e)))
            return
        if job.reconcile is not None:
            ops.watch(self, w, job.reconcile.op_id)
        ids = list(req.token_ids)
        self.handoffs[req.request_id] = Handoff(req.request_id, ids, None, out.get("kv_transfer_params"))
        self.events.prefill_done(PrefillResult(req.request_id, wid, int(out["cached_tokens"]), started, self.clock()))
        self.handoffs.pop(req.request_id, None)  # still here: the pool did not accept this completion

    def take_handoff(self, request_id: str) -> Handoff | None:
        return self.handoffs.pop(request_id, None)

    # -- DataPlane: reconfiguration -------------------------------------------------------------------------
    def park(self, worker_ids: Sequence[int]) -> None:
        for wid in worker_ids:
            w = self.workers[wid]
            w.parking = True
            self.enqueue(w, Item(lambda w=w: self._park(w)), front=True)  # type: ignore[misc]

    async def _park(self, w: VllmWorker) -> None:
        self.events.worker_parked(w.worker_id, self.clock())

    def activate(self, plan: ReconfigPlan) -> None:
        targets = tuple(t.worker_id for t in plan.targets)
        self.spawn(restart.activate(self, plan), f"activation of epoch {plan.epoch}", targets)

    # -- DataPlane: cache ops -------------------------------------------------------------------------------
    def execute(self, op: CacheOp) -> None:
        ops.execute(self, op)

    # -- views ----------------------------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """Counters of the data plane and of the KV-event feeds (:func:`vertumnus.engines.vllm.metrics.stats`)."""
        return metrics.stats(self)

    def collector(self) -> metrics.VllmCollector:
        """A Prometheus collector of the same figures, for the server's registry."""
        return metrics.VllmCollector(self)
