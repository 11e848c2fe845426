"""The prefill pool facade: scheduler + cache manager + controller + a data plane, driven the same way by the
simulator and the server.

Request path (``submit``), one call per step: admissibility (``scheduler.check_admissible``, once per placement
attempt) → ``cache.lookup`` (held / pending prefixes, the fetch on offer) → ``scheduler.place`` (J, reservation,
``Placement.fetch``) → ``cache.commit`` (statistics on the first placement only — a re-placement after a drain or
failure is the same request —, the reconcile or fetch copy attached to the job, the pin of the reused prefix) →
``data_plane.submit`` → ``cache.replicate_hot`` and ``controller.observe`` (first placement only).
Nothing schedulable (all draining / not yet acked / KV full) → the request waits in the backlog and is placed
when a worker becomes ACTIVE or frees capacity. Completion (``prefill_done``) releases the reservation and the
pin and reports to listeners exactly once.

Identities: ``Placement.epoch`` is the epoch the chosen worker was activated under (engines may reject jobs
of another epoch); ``epoch_ack``'s ``rank`` may be any identifier unique within the worker (node-local or
global rank) — a worker activates once ``degree`` distinct ranks acked the epoch it waits for.

Threading: the pool does no locking. Callers serialise every call — the simulator runs one event loop, the
server holds one lock / one asyncio loop around submit, on_timer, reconfigure, snapshot and all EngineEvents
callbacks.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence

from vertumnus.cache.manager import CacheManager
from vertumnus.cache.placement import Pin
from vertumnus.config import VertumnusConfig, parse_composition
from vertumnus.controller.controller import Controller
from vertumnus.controller.epochs import EpochManager
from vertumnus.controller.initial import (
    TRACE_BLOCK_TOKENS,
    History,
    choose_initial,
    read_trace_lengths,
    summarize_history,
)
from vertumnus.controller.lattice import Lattice
from vertumnus.cost_model import CostModel
from vertumnus.interfaces import DataPlane, PrefillJob
from vertumnus.pool_listener import PoolListener, PoolSnapshot, WorkerSnapshot, build_snapshot
from vertumnus.scheduler.policy import RoutingPolicy
from vertumnus.scheduler.scheduler import RequestRejected, Scheduler
from vertumnus.scheduler.table import Ticket
from vertumnus.types import (
    CacheOp,
    CacheReport,
    Placement,
    PrefillResult,
    ReconfigKind,
    ReconfigPlan,
    Request,
    WorkerState,
)

# a request running on this many workers when each of them failed is failed instead of re-placed again
MAX_FAILED_RUNS = 2
# The error of a request given up after MAX_FAILED_RUNS (its own text: no engine internals in it).
GAVE_UP_ERROR = (
    f"the prefill failed on {MAX_FAILED_RUNS} workers (each failed while running it); "
    "it is not retried on the rest of the pool"
)

__all__ = ["PoolListener", "PoolSnapshot", "PrefillPool", "RequestRejected", "WorkerSnapshot"]


class PrefillPool:
    """Implements :class:`vertumnus.interfaces.EngineEvents`; see the module docstring."""

    def __init__(
        self,
        cfg: VertumnusConfig,
        cost: CostModel,
        data_plane: DataPlane,
        clock: Callable[[], float],
        router: RoutingPolicy | None = None,
        history: History | None = None,
    ) -> None:
        self.cfg = cfg
        self.cost = cost
        self.data_plane = data_plane
        self.clock = clock
        self.scheduler = Scheduler(cfg, cost, router)
        self.cache = CacheManager(cfg.cache, cost, cfg.pool.degrees)
        self.lattice = Lattice(cfg.pool.nodes, cfg.pool.gpus_per_node, cfg.pool.degrees)
        self.epochs = EpochManager(
            self.lattice, self.scheduler, self.cache, data_plane, self, cfg.pool.kv_capacity_blocks_per_rank
        )
        if history is None and cfg.pool.history_trace and not cfg.pool.initial_composition:
            history = self._read_history(cfg.pool.history_trace)
        self.history = history
        self.controller = Controller(cfg, cost, self.lattice, self.epochs, self.cache, history)
        self.listeners: list[PoolListener] = []
        self._backlog: deque[Request] = deque()  # new arrivals waiting, FCFS
        self._requeued: deque[Request] = deque()  # re-placements waiting (drain / failure); go first
        self._waiting: set[str] = set()
        self._pins: dict[str, Pin] = {}  # request -> the pin of its reused prefix
        self._job_op: dict[str, int] = {}  # request -> its reconcile op id
        self._ops: dict[int, CacheOp] = {}  # cache ops in flight
        self._strikes: dict[str, int] = {}  # request -> workers that failed while running its prefill
        self.rebalanced = 0  # queued requests placed again when workers became ACTIVE (cumulative)
        self._scan_interval = cfg.cache.scan_interval_s
        self._next_scan = float("inf")
        self.started = False

    def _read_history(self, path: str) -> History:
        ts, lens, keys = read_trace_lengths(self.cfg.resolve_path(path))
        c = self.cfg
        return summarize_history(
            ts, lens, keys, self.cost, c.pool.degrees, c.controller.window_s, c.controller.rules.long_threshold_tokens,
            TRACE_BLOCK_TOKENS, c.scheduler.beta, c.scheduler.lam,
        )  # fmt: skip

    # -- lifecycle ----------------------------------------------------------------------------------------
    def start(self) -> None:
        """Choose the initial composition, bring the data plane up (workers ACTIVE once their ranks ack)."""
        if self.started:
            raise ValueError("pool already started")
        self.started = True
        c = self.cfg
        if c.pool.initial_composition:
            comp = parse_composition(c.pool.initial_composition)
        else:
            comp = choose_initial(self.lattice, self.cost, c.controller.window_s, c.pool.initial_headroom, self.history)
        groups = self.lattice.build(comp)
        now = self.clock()
        self.controller.start(now)
        self._next_scan = now + self._scan_interval
        self.epochs.start(groups, self)

    def add_listener(self, listener: PoolListener) -> None:
        self.listeners.append(listener)

    # -- requests -----------------------------------------------------------------------------------------
    def submit(self, request: Request) -> Placement | None:
        """Place now, or hold in the backlog (None); raises RequestRejected if no worker could ever serve it."""
        if not self.started:
            raise ValueError("pool not started: call start() first")
        self.scheduler.check_admissible(request)
        rid = request.request_id
        if rid in self.scheduler.tickets or rid in self._waiting:
            raise ValueError(f"request {rid!r} is already in the pool")
        if not self._backlog and not self._requeued:
            placement = self._place(request, first=True)  # admissible: checked above
            if placement is not None:
                return placement
        self._backlog.append(request)
        self._waiting.add(rid)
        return None

    def _place(self, request: Request, first: bool) -> Placement | None:
        """Place an admissible request now (see the module docstring), or None when nothing is schedulable."""
        keys = request.block_keys
        match = self.cache.lookup(keys)
        placement = self.scheduler.place(request, match, self.clock(), first)
        if placement is None:
            return None
        wid = placement.worker_id
        commit = self.cache.commit(request, match, placement, first)
        op = commit.op
        if op is not None:
            self._ops[op.op_id] = op
            self._job_op[request.request_id] = op.op_id
        if commit.pin is not None:
            self._pins[request.request_id] = commit.pin
        try:
            self.data_plane.submit(wid, PrefillJob(request, placement, op, commit.reuse_blocks))
        except BaseException:
            self._unplace(request.request_id, cancel_reconcile=True)  # nothing stays reserved for it
            raise
        if first:
            hot = self.cache.replicate_hot(keys, match, placement, self.scheduler, self.clock())
            if hot is not None:  # queue_aware: the reused prefix copied off a queued holder
                self._ops[hot.op_id] = hot
                self.data_plane.execute(hot)
            self.controller.observe(
                placement.predicted_s, request.input_len, placement.cached_tokens, request.arrival_s
            )
        return placement

    def _unplace(self, request_id: str, cancel_reconcile: bool) -> None:
        """Forget a placement: reservation, pin, and (withdrawn / failed) its reconcile op."""
        self.scheduler.release(request_id)
        pin = self._pins.pop(request_id, None)
        if pin is not None and self.epochs.in_cache(pin.worker_id):
            self.cache.release(pin)
        op_id = self._job_op.pop(request_id, None)
        if cancel_reconcile and op_id is not None and op_id in self._ops:
            self._fail_op(op_id, "request moved before its reconcile ran")

    def _retry(self, request: Request, first: bool) -> bool:
        """Place a waiting request; False if it must keep waiting. Unservable ones are reported failed (the
        pool may have lost its largest workers since the request arrived)."""
        try:
            self.scheduler.check_admissible(request)
            placement = self._place(request, first)
        except RequestRejected as e:
            now = self.clock()
            self._strikes.pop(request.request_id, None)
            result = PrefillResult(request.request_id, -1, 0, now, now, ok=False, error=str(e))
            for listener in self.listeners:
                listener.request_done(request, None, result)
            return True
        return placement is not None

    def _flush(self) -> None:
        """Place waiting requests in order (re-placements first) until one cannot be placed."""
        for queue, first in ((self._requeued, False), (self._backlog, True)):
            while queue:
                req = queue.popleft()  # popped first: a synchronous data plane may re-enter _flush
                self._waiting.discard(req.request_id)
                if not self._retry(req, first):
                    queue.appendleft(req)
                    self._waiting.add(req.request_id)
                    return

    def _replace(self, request: Request) -> None:
        if self._requeued or not self._retry(request, False):
            self._requeued.append(request)
            self._waiting.add(request.request_id)

    # -- ReconfigHost (called by the epoch protocol) ------------------------------------------------------
    def replace_job(self, job: PrefillJob, now: float) -> None:
        """A job withdrawn from a draining worker: release it there and place it elsewhere (or requeue)."""
        ticket = self.scheduler.ticket(job.request.request_id)
        if ticket is None or ticket.worker_id != job.placement.worker_id:
            return  # already moved or finished
        self._unplace(job.request.request_id, cancel_reconcile=True)
        self._replace(job.request)

    def workers_activated(self, worker_ids: Sequence[int], now: float) -> None:
        if self._requeued or self._backlog:
            self._flush()  # the waiting requests are placed first; they take the fresh workers as they fit
        elif self.cfg.scheduler.rebalance_on_activate:
            self._rebalance(set(worker_ids), now)

    def _rebalance(self, fresh: set[int], now: float) -> None:
        """Place every queued (not started) request of the other ACTIVE workers again, in arrival order.

        J chose each of them when it arrived, among the workers ACTIVE then. A worker that just became ACTIVE
        (a split's children, a merge's parent, a restarted worker) is empty while the backlog built during the
        drain and the switch waits elsewhere; without this it would serve only later arrivals, and the requests
        queued behind the lost capacity would pay for the switch in full. Re-placing in arrival order keeps
        FCFS among them; a request whose old worker is still its best goes back there, behind the ones placed
        before it. A job's attached copy is cancelled with the withdrawal and planned again where it lands.
        """
        jobs: list[PrefillJob] = []
        for wid in self.scheduler.worker_ids():
            if wid in fresh or self.scheduler.state(wid) != WorkerState.ACTIVE:
                continue
            if self.scheduler.waiting_at(wid):
                jobs.extend(self.data_plane.withdraw(wid))
        if not jobs:
            return
        jobs.sort(key=lambda j: j.request.arrival_s)
        self.rebalanced += len(jobs)
        for job in jobs:
            self.replace_job(job, now)

    def reconfig_committed(self, plan: ReconfigPlan, drain_s: float, switch_s: float) -> None:
        retired = {s.worker_id for s in plan.sources}
        for op_id, op in list(self._ops.items()):
            if op.dst_worker in retired or op.src_worker in retired:
                self._ops.pop(op_id)
                for listener in self.listeners:
                    listener.cache_op_done(op, False)
        for listener in self.listeners:
            listener.reconfig_done(plan, drain_s, switch_s)

    # -- timers -------------------------------------------------------------------------------------------
    def next_timer(self) -> float:
        """Next instant ``on_timer`` has work (window end or cache scan); inf before start."""
        return min(self.controller.next_timer(), self._next_scan)

    def on_timer(self, now: float) -> None:
        """Close every window that ended by ``now`` and run a due cache scan; idempotent per instant."""
        self.controller.on_timer(now, lambda w: self.scheduler.queue_s(w, now))
        if self._next_scan <= now:
            self._next_scan += self._scan_interval
            if self._next_scan <= now:  # late caller: skip missed scans rather than bursting them
                self._next_scan = now + self._scan_interval
            for op in self.cache.scan(now, self.scheduler.queue_map(now)):
                self._ops[op.op_id] = op
                self.data_plane.execute(op)

    def idle_state(self) -> tuple[object, ...]:
        """Everything an idle timer tick reads and may change: window sums and streak, the long-share
        reference, queues, cache ops, epoch, composition, cache statistics. Equal before and after a full timer
        period without engine work means every further idle tick is the same no-op (see :meth:`skip_idle`)."""
        acc = self.controller.account
        return (
            acc.demand_s, acc.requests, acc.streak, int(acc.streak_dir), acc.ref_long,
            len(self._backlog), len(self._requeued), len(self._ops), self.epochs.current is None,
            tuple(self.lattice.composition().items()), *self.cache.idle_state(),
        )  # fmt: skip

    def skip_idle(self, until: float) -> int:
        """Jump the timers over an idle stretch: window ends, split checks and cache scans before ``until`` are
        dropped (the simulator calls this once :meth:`idle_state` is a fixed point, so each would be a no-op).
        Returns the windows skipped."""
        skipped = self.controller.timers.advance_idle(until)
        if self._next_scan < until:
            scans = math.ceil((until - self._next_scan) / self._scan_interval)
            self._next_scan += scans * self._scan_interval
            self.cache.skip_scans(scans)
        return skipped

    # -- admin --------------------------------------------------------------------------------------------
    def reconfigure(self, kind: ReconfigKind, worker_id: int) -> ReconfigPlan:
        """Manual split / merge of ``worker_id`` (merge: with its sibling); ValueError when impossible."""
        if not self.started:
            raise ValueError("pool not started")
        now = self.clock()
        return self.controller.manual(ReconfigKind(kind), worker_id, now, lambda w: self.scheduler.queue_s(w, now))

    def snapshot(self) -> PoolSnapshot:
        """The pool right now (``/v1/pool``)."""
        return build_snapshot(
            self.clock(), self.scheduler, self.epochs, self.controller, self.cache,
            len(self._backlog) + len(self._requeued), self.cfg.pool.gpus_per_node,
        )  # fmt: skip

    # -- EngineEvents -------------------------------------------------------------------------------------
    def prefill_started(self, worker_id: int, request_id: str, now: float) -> None:
        self.scheduler.started(request_id, worker_id, now)

    def prefill_done(self, result: PrefillResult) -> None:
        ticket = self.scheduler.ticket(result.request_id)
        if ticket is None or ticket.worker_id != result.worker_id:
            return  # late report from a worker the request was taken away from (or a duplicate)
        self._unplace(result.request_id, cancel_reconcile=False)
        self._strikes.pop(result.request_id, None)
        for listener in self.listeners:
            listener.request_done(ticket.request, ticket.placement, result)
        if self._requeued or self._backlog:
            self._flush()

    def cache_report(self, report: CacheReport) -> None:
        if not self.epochs.in_cache(report.worker_id):
            return  # failed or retired worker: its late reports must not resurrect holdings
        self.cache.apply_report(report)
        if report.op_id is not None:
            op = self._ops.pop(report.op_id, None)
            if op is not None:
                for listener in self.listeners:
                    listener.cache_op_done(op, True)

    def cache_op_failed(self, op_id: int, reason: str) -> None:
        if op_id in self._ops:
            self._fail_op(op_id, reason)

    def _fail_op(self, op_id: int, reason: str) -> None:
        op = self._ops.pop(op_id)
        self.cache.op_failed(op_id, reason)
        for listener in self.listeners:
            listener.cache_op_done(op, False)

    def worker_parked(self, worker_id: int, now: float) -> None:
        self.epochs.on_parked(worker_id, now)

    def epoch_ack(self, worker_id: int, rank: int, epoch: int, now: float) -> None:
        self.epochs.on_ack(worker_id, rank, epoch, now)

    def worker_failed(self, worker_id: int, reason: str, now: float) -> None:
        """FAILED: cancel its cache ops, drop its holdings, re-place its queued and running requests (FCFS),
        restart its ranks under a fresh epoch; ACTIVE again after every rank acked."""
        if not self.epochs.can_fail(worker_id):
            return
        for op_id, op in list(self._ops.items()):
            if worker_id in (op.dst_worker, op.src_worker):
                self._fail_op(op_id, f"worker {worker_id} failed: {reason}")
        group = self.epochs.fail(worker_id)
        assert group is not None
        for ticket in self.scheduler.tickets_at(worker_id):
            rid = ticket.request.request_id
            self._unplace(rid, cancel_reconcile=True)
            if ticket.running:  # a strike against the request: it may be what failed the worker
                self._strikes[rid] = self._strikes.get(rid, 0) + 1
                if self._strikes[rid] >= MAX_FAILED_RUNS:
                    self._give_up(ticket.request, ticket)
                    continue
            self._replace(ticket.request)
        self.epochs.restart(group)

    def _give_up(self, request: Request, ticket: Ticket) -> None:
        """A request whose prefill was running on ``MAX_FAILED_RUNS`` workers when they failed fails alone: a
        request that breaks workers (an engine bug it triggers) must not be re-placed onto the rest of the pool."""
        self._strikes.pop(request.request_id, None)
        now = self.clock()
        result = PrefillResult(
            request.request_id, ticket.worker_id, 0, ticket.started_s, now, ok=False, error=GAVE_UP_ERROR
        )
        for listener in self.listeners:
            listener.request_done(request, ticket.placement, result)
