"""The simulated engine: a :class:`~vertumnus.interfaces.DataPlane` on the simulator's virtual clock.

A degree-C worker serves its queue FCFS, one prefill at a time, for ``E_C(R, P)`` of the configured profile,
where P is the prefix it *actually* reuses (its own cache, capped by the job's ``max_reuse_blocks``). Each
worker keeps a physical :class:`~vertumnus.engines.sim.cache.BlockCache` of ``kv_capacity_blocks_per_rank × C``
blocks with LRU eviction and reports stores / removals as :class:`~vertumnus.types.CacheReport` s, like a real
engine's KV events. Cache copies cost ``blocks × bytes_per_block ÷ bandwidth`` (intra- or inter-node) and run
beside compute (copy engines / RDMA); they become visible when the confirming report arrives.

A job's attached copy (a reconcile or a fetch, ``PrefillJob.reconcile``) starts when the job is queued, not when
it reaches the head of the queue: it runs during the wait, beside the prefills ahead of it, and the prefill
starts when both the worker and the copy are done::

    worker   |== prefill A ==|== prefill B ==|......|== prefill J ==|
    copy J      |--- copy ---|                        (landed during the wait: J pays nothing for it)
    worker   |== A ==|.. waits ..|== prefill J ==|
    copy J      |----- copy -----|                    (longer than the wait: J starts when it lands)

A job withdrawn (drain) before its copy lands cancels the copy: nothing is stored or confirmed for it (the pool
fails the op itself). Blocks that landed early may be evicted by the prefills ahead before J runs; J then reuses
what is left (``BlockCache.leading``), as with any cached prefix.

Re-entrancy invariant: no DataPlane method calls back into the pool synchronously; every callback is an event
on the loop (kind ENGINE), so the pool never sees a callback from inside its own call.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from vertumnus.config import VertumnusConfig
from vertumnus.cost_model import CostModel
from vertumnus.engines.sim.cache import BlockCache
from vertumnus.engines.sim.events import EventKind, EventLoop
from vertumnus.engines.sim.worker import SimStats, SimWorker, reused_tokens
from vertumnus.interfaces import EngineEvents, PrefillJob
from vertumnus.types import (
    CacheOp,
    CacheOpKind,
    CacheReport,
    CacheReportKind,
    PrefillResult,
    ReconfigKind,
    ReconfigPlan,
    WorkerGroup,
)

_E = EventKind.ENGINE


@dataclass(slots=True)
class _EarlyCopy:
    """A queued job's attached copy, started at submit (see the module docstring)."""

    worker: SimWorker
    landed: bool = False
    waiting: tuple[PrefillJob, float] | None = None  # the job at the head, waiting for the copy: (job, started)


class SimDataPlane:
    """All simulated ranks of a pool (see module docstring)."""

    def __init__(self, cfg: VertumnusConfig, cost: CostModel, loop: EventLoop) -> None:
        self.cfg = cfg
        self.cost = cost
        self.loop = loop
        # op id -> the attached copy of a queued job, in flight or landed before the job started
        self._early: dict[int, _EarlyCopy] = {}
        self.block_tokens = cfg.cache.block_tokens
        self.per_rank_blocks = cfg.pool.kv_capacity_blocks_per_rank
        self.retain = cfg.cache.retention()  # the cache manager's eviction order (None: plain LRU)
        # the engine's switch; the controller's controller.predictive.switch_s is only its prior
        self.switch_s = cfg.pool.sim_switch_s
        self.workers: dict[int, SimWorker] = {}
        self.stats = SimStats()
        self._events: EngineEvents | None = None
        self._tick = 0

    # -- helpers ----------------------------------------------------------------------------------------------
    @property
    def events(self) -> EngineEvents:
        assert self._events is not None, "SimDataPlane.start() was not called"
        return self._events

    def _next_tick(self) -> int:
        self._tick += 1
        return self._tick

    def _new_worker(self, group: WorkerGroup, epoch: int, cache: BlockCache | None = None) -> SimWorker:
        if cache is None:
            cache = BlockCache(self.per_rank_blocks * group.degree, group.degree, self.retain)
        w = SimWorker(group, cache, epoch)
        self.workers[group.worker_id] = w
        return w

    def _ack(self, group: WorkerGroup, epoch: int) -> None:
        now = self.loop.now
        for rank in group.global_ranks(self.cfg.pool.gpus_per_node):
            self.events.epoch_ack(group.worker_id, rank, epoch, now)

    def _report(
        self, wid: int, kind: CacheReportKind, keys: Sequence[int], parent: int | None = None, op_id: int | None = None
    ) -> None:
        self.events.cache_report(CacheReport(wid, kind, tuple(keys), parent, op_id))

    def _report_store(
        self,
        wid: int,
        keys: Sequence[int],
        first_new: int | None,
        evicted: list[int],
        op_id: int | None = None,
        confirm_from: int | None = None,
    ) -> None:
        """REMOVED for the evicted blocks, then STORED for the chain from its first new block (or from
        ``confirm_from`` when an op must be confirmed although nothing was new)."""
        if evicted:
            self.stats.evicted_blocks += len(evicted)
            self._report(wid, CacheReportKind.REMOVED, evicted)
        start = first_new
        if confirm_from is not None:
            start = confirm_from if start is None else min(start, confirm_from)
        if start is not None and start < len(keys):
            self._report(wid, CacheReportKind.STORED, keys[start:], keys[start - 1] if start else None, op_id)

    def _bandwidth(self, src: SimWorker, dst: SimWorker) -> float:
        gbps = self.cfg.cache.intra_node_gbps if src.group.node == dst.group.node else self.cfg.cache.inter_node_gbps
        return gbps * 1e9

    def copy_seconds(self, blocks: int, src: SimWorker, dst: SimWorker) -> float:
        """Transfer time of ``blocks`` cache blocks from ``src`` to ``dst``."""
        return blocks * self.cfg.cache.bytes_per_block / self._bandwidth(src, dst)

    def _land(self, dst: SimWorker, op: CacheOp) -> None:
        """A copy's blocks arrive at ``dst``: store them, report evictions and STORED(op_id)."""
        first_new, evicted = dst.cache.store(op.keys, self._next_tick())
        self._report_store(dst.group.worker_id, op.keys, first_new, evicted, op.op_id, op.first_missing)

    def _copy_time(self, src: SimWorker, dst: SimWorker, op: CacheOp) -> float:
        """Seconds ``op`` takes to bring the blocks ``dst`` misses from ``src`` (counted in the stats)."""
        blocks = dst.cache.missing(op.keys)
        dur = self.copy_seconds(blocks, src, dst)
        self.stats.copies += 1
        self.stats.copied_blocks += blocks
        self.stats.copy_s += dur
        return dur

    @staticmethod
    def _can_supply(src: SimWorker, dst: SimWorker, op: CacheOp) -> bool:
        """Whether ``src`` holds every block of the path ``op.keys`` that ``dst`` lacks. Copies move exactly
        those blocks (after a split the sibling holds the blocks a child is missing, not the whole path)."""
        have, give = dst.cache, src.cache
        return all(k in give for k in op.keys if k not in have)

    def _live(self, wid: int | None) -> SimWorker | None:
        w = self.workers.get(wid) if wid is not None else None
        return None if w is None or w.retired else w

    # -- DataPlane ----------------------------------------------------------------------------------------
    def start(self, groups: Sequence[WorkerGroup], epoch: int, events: EngineEvents) -> None:
        """Create the workers (empty caches); every rank acks ``epoch`` at the current instant."""
        self._events = events
        for g in groups:
            self._new_worker(g, epoch)
            self.loop.push(self.loop.now, _E, self._ack, g, epoch)

    def submit(self, worker_id: int, job: PrefillJob) -> None:
        """Queue a job; the worker starts it when idle (FCFS)."""
        w = self._live(worker_id)
        if w is None:
            raise ValueError(f"submit to unknown or retired worker {worker_id}")
        w.queue.append(job)
        if job.reconcile is not None and (w.running is not None or len(w.queue) > 1):
            self._start_early_copy(w, job.reconcile)
        self._kick(w)

    def _start_early_copy(self, w: SimWorker, op: CacheOp) -> None:
        """Begin a queued job's attached copy now; an op no source can serve is left to the job's start (which
        fails it as an ordinary miss)."""
        src = self._live(op.src_worker)
        if src is None or not self._can_supply(src, w, op):
            return
        self._early[op.op_id] = _EarlyCopy(w)
        self.loop.push(self.loop.now + self._copy_time(src, w, op), _E, self._early_landed, op)

    def _early_landed(self, op: CacheOp) -> None:
        early = self._early.get(op.op_id)
        if early is None:
            return  # cancelled: the job was withdrawn
        w = early.worker
        if w.retired:
            del self._early[op.op_id]
            return
        self._land(w, op)
        if early.waiting is None:
            early.landed = True  # the job is still queued: it starts with these blocks when its turn comes
            return
        del self._early[op.op_id]
        job, started = early.waiting
        if w.running is job:
            self._compute(w, job, started)

    def _kick(self, w: SimWorker) -> None:
        if w.running is None and not w.start_scheduled and not w.parking and w.queue:
            w.start_scheduled = True
            self.loop.push(self.loop.now, _E, self._start_next, w)

    def withdraw(self, worker_id: int) -> list[PrefillJob]:
        """Remove and return the queued (not started) jobs."""
        w = self.workers[worker_id]
        jobs = list(w.queue)
        w.queue.clear()
        self._cancel_early(jobs)  # the pool fails those ops
        return jobs

    def _cancel_early(self, jobs: Sequence[PrefillJob]) -> None:
        """Forget the early copies of jobs taken off a queue: nothing lands or is confirmed for them."""
        for job in jobs:
            if job.reconcile is not None:
                self._early.pop(job.reconcile.op_id, None)

    def park(self, worker_ids: Sequence[int]) -> None:
        """Park each worker once its running prefill (if any) finished."""
        for wid in worker_ids:
            w = self.workers[wid]
            w.parking = True
            if w.running is None:
                self.loop.push(self.loop.now, _E, self._parked, w)

    def _parked(self, w: SimWorker) -> None:
        if w.parked or w.retired:
            return
        w.parked = True
        self.events.worker_parked(w.group.worker_id, self.loop.now)

    def activate(self, plan: ReconfigPlan) -> None:
        """Regroup parked ranks after the switch (``pool.sim_switch_s``); each target
        rank then acks ``plan.epoch``."""
        for g in plan.sources:
            w = self.workers[g.worker_id]
            if not w.parked:
                raise ValueError(f"activate: worker {g.worker_id} is not parked")
        self.loop.push(self.loop.now + self.switch_s, _E, self._switch, plan)

    def _switch(self, plan: ReconfigPlan) -> None:
        srcs = [self.workers[g.worker_id] for g in plan.sources]
        for s in srcs:
            s.retired = True
            del self.workers[s.group.worker_id]
        leftover = [job for s in srcs for job in s.queue]
        assert not leftover, "parked workers must have been withdrawn before the switch"
        if plan.kind == ReconfigKind.SPLIT:
            (src,) = srcs
            lo_g, hi_g = sorted(plan.targets, key=lambda g: (g.node, g.first_rank))
            cap = (self.per_rank_blocks * lo_g.degree, self.per_rank_blocks * hi_g.degree)
            lo, hi, ev_lo, ev_hi = src.cache.split(cap)
            parts = [(lo_g, lo, ev_lo), (hi_g, hi, ev_hi)]
        else:
            (tgt,) = plan.targets
            offsets = [(s.group.first_rank - tgt.first_rank, s.cache) for s in srcs]
            merged, ev = BlockCache.merge(offsets, self.per_rank_blocks * tgt.degree, tgt.degree, self.retain)
            parts = [(tgt, merged, ev)]
        for g, cache, _ in parts:
            self._new_worker(g, plan.epoch, cache)
        # Acks first: the last one commits the plan in the pool, which only then tracks the targets' caches,
        # so evictions forced by a smaller child capacity are reported after the commit.
        for g, _, _ in parts:
            self._ack(g, plan.epoch)
        for g, _, evicted in parts:
            if evicted:
                self.stats.evicted_blocks += len(evicted)
                self._report(g.worker_id, CacheReportKind.REMOVED, evicted)

    def execute(self, op: CacheOp) -> None:
        """Replicate / reconcile: copy the missing blocks, confirm with STORED(op_id). Reclaim: delete now,
        confirm with REMOVED(op_id)."""
        if op.kind == CacheOpKind.RECLAIM:
            self.loop.push(self.loop.now, _E, self._reclaim, op)
            return
        dst, src = self._live(op.dst_worker), self._live(op.src_worker)
        if dst is None or src is None:
            self.loop.push(self.loop.now, _E, self._fail, op.op_id, "source or destination worker is gone")
            return
        if not self._can_supply(src, dst, op):
            self.loop.push(self.loop.now, _E, self._fail, op.op_id, "source no longer holds the missing blocks")
            return
        if len(op.keys) > dst.cache.capacity:
            self.loop.push(self.loop.now, _E, self._fail, op.op_id, "prefix exceeds destination capacity")
            return
        self.loop.push(self.loop.now + self._copy_time(src, dst, op), _E, self._copied, op, dst)

    def _copied(self, op: CacheOp, dst: SimWorker) -> None:
        if dst.retired:
            self._fail(op.op_id, "destination was reconfigured during the copy")
            return
        self._land(dst, op)

    def _reclaim(self, op: CacheOp) -> None:
        dst = self._live(op.dst_worker)
        if dst is None:
            self._fail(op.op_id, "worker is gone")
            return
        removed = dst.cache.remove(op.keys[op.first_missing :])
        self._report(op.dst_worker, CacheReportKind.REMOVED, removed or op.keys[op.first_missing :], op_id=op.op_id)

    def _fail(self, op_id: int, reason: str) -> None:
        self.stats.failed_ops += 1
        self.events.cache_op_failed(op_id, reason)

    def restart(self, group: WorkerGroup, epoch: int) -> None:
        """Bring a failed worker back with an empty cache after the switch."""
        old = self.workers.pop(group.worker_id, None)
        if old is not None:
            old.retired = True
        self.loop.push(self.loop.now + self.switch_s, _E, self._restarted, group, epoch)

    def _restarted(self, group: WorkerGroup, epoch: int) -> None:
        self._new_worker(group, epoch)
        self._ack(group, epoch)

    def fail_worker(self, worker_id: int, reason: str = "injected failure") -> None:
        """Test / what-if hook: the worker dies now, losing its running and queued jobs and its cache."""
        w = self.workers[worker_id]
        w.retired = True
        self._cancel_early(w.queue)
        w.queue.clear()
        w.running = None
        self.loop.push(self.loop.now, _E, self.events.worker_failed, worker_id, reason, self.loop.now)

    def close(self) -> None:
        """Nothing to release in the simulator."""

    # -- prefill ------------------------------------------------------------------------------------------
    def _start_next(self, w: SimWorker) -> None:
        w.start_scheduled = False
        if w.retired or w.running is not None or w.parking or not w.queue:
            return
        job = w.queue.popleft()
        w.running = job
        self.events.prefill_started(w.group.worker_id, job.request.request_id, self.loop.now)
        op = job.reconcile
        early = self._early.get(op.op_id) if op is not None else None
        if op is not None and early is not None:  # its copy began at submit
            if early.landed:
                del self._early[op.op_id]
                self._compute(w, job, self.loop.now)
            else:
                early.waiting = (job, self.loop.now)
            return
        src = self._live(op.src_worker) if op is not None else None
        if op is not None and (src is None or not self._can_supply(src, w, op)):
            self._fail(op.op_id, "no valid copy to reconcile from")
            op = None
        if op is None or src is None:
            self._compute(w, job, self.loop.now)
            return
        dur = self._copy_time(src, w, op)
        self.loop.push(self.loop.now + dur, _E, self._reconciled, w, job, op, self.loop.now)

    def _reconciled(self, w: SimWorker, job: PrefillJob, op: CacheOp, started: float) -> None:
        if w.retired:
            return
        self._land(w, op)
        self._compute(w, job, started)

    def _compute(self, w: SimWorker, job: PrefillJob, started: float) -> None:
        req = job.request
        blocks = w.cache.leading(req.block_keys, job.max_reuse_blocks)
        w.cache.touch(req.block_keys[:blocks], self._next_tick(), reuse=True)  # in use: most recently used
        p = reused_tokens(blocks, req.input_len, self.block_tokens) if blocks else 0
        dur = self.cost.predict(w.group.degree, req.input_len - p, p)
        self.loop.push(self.loop.now + dur, _E, self._done, w, job, p, started)

    def _done(self, w: SimWorker, job: PrefillJob, cached: int, started: float) -> None:
        if w.retired or w.running is not job:
            return  # the worker failed meanwhile: the pool re-places its requests
        now = self.loop.now
        req = job.request
        first_new, evicted = w.cache.store(req.block_keys, self._next_tick())
        wid = w.group.worker_id
        self._report_store(wid, req.block_keys, first_new, evicted)
        w.running = None
        self.stats.prefills += 1
        self.events.prefill_done(PrefillResult(req.request_id, wid, cached, started, now))
        if w.parking:
            self._parked(w)
        else:
            self._kick(w)
