"""Configuration epochs: start-up, reconfiguration (drain → park → switch → commit) and failure restarts.

::

    begin(plan)        sources ACTIVE → DRAINING: leave the candidate set; data_plane.withdraw() → host
                       re-places every queued job; data_plane.park(sources)
    worker_parked(s)   s → PARKED; when every source parked: drain_s recorded, sources → SWITCHING,
                       targets registered (SWITCHING, awaiting plan.epoch), data_plane.activate(plan)
    epoch_ack(t, r, e) rank r of target t adopted epoch e; when every rank of every target acked:
    commit             cache.on_reconfigure(plan) and scheduler metadata (sources removed) FIRST, then
                       targets → ACTIVE, lattice updated, epoch = plan.epoch, switch_s recorded

Invariant: a worker is ACTIVE (schedulable) only after all its ranks acked the epoch it waits for *and* the
scheduler and the cache manager know its geometry. Every worker that is not ACTIVE and not DRAINING/PARKED
is in ``awaiting`` (start-up, switch targets, FAILED workers being restarted). Epoch numbers only grow; each
plan and each restart takes a fresh one.

Concurrency: several plans may be in flight at once when their workers are disjoint (e.g. two splits of two
different CP8 blocks when demand is far above capacity). Each runs the same drain → park → switch → commit
sequence independently; a plan's epoch is fixed when it begins, so plans may commit out of epoch order and
the committed epoch is the maximum acked so far. Target ids are reserved in the lattice when a plan begins, so
later plans never reuse them.

Failures: a FAILED worker is restarted under a fresh epoch (``data_plane.restart``). A plan *source* that
fails while draining is restarted and parked again (the plan continues); a plan *target* that fails before
commit is restarted and the commit waits for its new acks. After ``activate`` the sources' ranks belong to
the targets, so a failure reported against a source id is ignored (data planes report target ids then).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Protocol

from vertumnus.controller.lattice import Lattice, LatticeOp
from vertumnus.interfaces import DataPlane, EngineEvents, PrefillJob
from vertumnus.scheduler.scheduler import Scheduler
from vertumnus.types import ReconfigPlan, WorkerGroup, WorkerState


class CacheMeta(Protocol):
    """The cache manager's worker-metadata calls the epoch protocol makes."""

    def add_worker(self, worker_id: int, degree: int, node: int, capacity_blocks: int) -> None: ...

    def remove_worker(self, worker_id: int) -> None: ...

    def set_available(self, worker_id: int, available: bool) -> None: ...

    def on_reconfigure(self, plan: ReconfigPlan) -> None: ...


class ReconfigHost(Protocol):
    """What the pool does for the epoch protocol."""

    def replace_job(self, job: PrefillJob, now: float) -> None:
        """A job withdrawn from a draining worker: release it there and place it again (or backlog it)."""
        ...

    def workers_activated(self, worker_ids: Sequence[int], now: float) -> None:
        """Workers just became ACTIVE (flush the backlog, or place the other workers' queues again)."""
        ...

    def reconfig_committed(self, plan: ReconfigPlan, drain_s: float, switch_s: float) -> None:
        """A reconfiguration committed (listeners)."""
        ...


class Phase(IntEnum):
    DRAIN = 0  # waiting for worker_parked of every source
    SWITCH = 1  # activate() called; waiting for the targets' acks


@dataclass(slots=True)
class Reconfiguration:
    """The plan in flight and its timings."""

    plan: ReconfigPlan
    phase: Phase
    drain_start_s: float
    parked: set[int] = field(default_factory=set)
    target_epochs: dict[int, int] = field(default_factory=dict)  # epoch each target acked (restarts: later)
    drain_s: float = 0.0
    switch_start_s: float = 0.0


@dataclass(slots=True)
class ReconfigRecord:
    """A committed reconfiguration."""

    plan: ReconfigPlan
    started_s: float
    drain_s: float
    switch_s: float


@dataclass(slots=True)
class _Awaiting:
    epoch: int
    degree: int
    acked: set[int] = field(default_factory=set)


class EpochManager:
    """Owns epoch numbers, pending activations and the plan in flight."""

    def __init__(
        self,
        lattice: Lattice,
        scheduler: Scheduler,
        cache: CacheMeta,
        data_plane: DataPlane,
        host: ReconfigHost,
        kv_blocks_per_rank: int,
    ) -> None:
        self.lattice = lattice
        self.scheduler = scheduler
        self.cache = cache
        self.data_plane = data_plane
        self.host = host
        self.kv_blocks_per_rank = kv_blocks_per_rank
        self.epoch = 0  # committed configuration epoch
        self._last_epoch = 0  # last epoch number handed out
        self.awaiting: dict[int, _Awaiting] = {}
        self.inflight: list[Reconfiguration] = []  # plans in flight, in begin order (disjoint workers)
        self.records: list[ReconfigRecord] = []
        self._in_cache: set[int] = set()

    def _fresh_epoch(self) -> int:
        self._last_epoch += 1
        return self._last_epoch

    @property
    def current(self) -> Reconfiguration | None:
        """The oldest plan in flight (None when the pool is not reconfiguring)."""
        return self.inflight[0] if self.inflight else None

    def busy_workers(self) -> set[int]:
        """Sources and targets of every plan in flight."""
        return {g.worker_id for r in self.inflight for g in (*r.plan.sources, *r.plan.targets)}

    def _with_source(self, worker_id: int) -> Reconfiguration | None:
        return next((r for r in self.inflight if any(s.worker_id == worker_id for s in r.plan.sources)), None)

    def _with_target(self, worker_id: int) -> Reconfiguration | None:
        return next((r for r in self.inflight if any(t.worker_id == worker_id for t in r.plan.targets)), None)

    def group(self, worker_id: int) -> WorkerGroup | None:
        """Geometry of a registered worker (current composition or a pending plan target)."""
        g = self.lattice.groups.get(worker_id)
        if g is None:
            cur = self._with_target(worker_id)
            if cur is not None:
                g = next(t for t in cur.plan.targets if t.worker_id == worker_id)
        return g

    # -- start-up -----------------------------------------------------------------------------------------
    def start(self, groups: Sequence[WorkerGroup], events: EngineEvents) -> None:
        """Register the initial workers (not schedulable) and bring the data plane up under epoch 1."""
        epoch = self._fresh_epoch()
        for g in groups:
            self.scheduler.add_worker(g.worker_id, g.degree, g.node, WorkerState.SWITCHING, epoch)
            self.awaiting[g.worker_id] = _Awaiting(epoch, g.degree)
        self.data_plane.start(groups, epoch, events)

    # -- reconfiguration ----------------------------------------------------------------------------------
    def next_plan(self, op: LatticeOp, predicted_drain_s: float = 0.0, reconcile_blocks: float = 0.0) -> ReconfigPlan:
        """A plan for ``op`` under the next epoch number (not yet handed out)."""
        return ReconfigPlan(op.kind, op.sources, op.targets, self._last_epoch + 1, predicted_drain_s, reconcile_blocks)

    def begin(self, plan: ReconfigPlan, now: float) -> None:
        """Drain the sources: out of the candidate set, queued jobs re-placed, then park."""
        busy = self.busy_workers()
        assert not any(g.worker_id in busy for g in (*plan.sources, *plan.targets)), "plans must be disjoint"
        assert plan.epoch == self._last_epoch + 1
        self._last_epoch = plan.epoch
        self.lattice.reserve_ids(max(t.worker_id for t in plan.targets) + 1)
        self.inflight.append(Reconfiguration(plan, Phase.DRAIN, now))
        ids = [s.worker_id for s in plan.sources]
        for wid in ids:  # all sources leave the candidate set before any job is re-placed
            self.scheduler.set_state(wid, WorkerState.DRAINING)
            if wid in self._in_cache:
                self.cache.set_available(wid, False)  # no new cache ops towards / from a draining worker
        for wid in ids:
            for job in self.data_plane.withdraw(wid):
                self.host.replace_job(job, now)
        self.data_plane.park(ids)

    def on_parked(self, worker_id: int, now: float) -> None:
        cur = self._with_source(worker_id)
        if cur is None or cur.phase != Phase.DRAIN or worker_id in self.awaiting:
            return
        self.scheduler.set_state(worker_id, WorkerState.PARKED)
        cur.parked.add(worker_id)
        if len(cur.parked) < len(cur.plan.sources):
            return
        cur.drain_s = now - cur.drain_start_s
        cur.phase = Phase.SWITCH
        cur.switch_start_s = now
        for s in cur.plan.sources:
            self.scheduler.set_state(s.worker_id, WorkerState.SWITCHING)
        for t in cur.plan.targets:
            self.scheduler.add_worker(t.worker_id, t.degree, t.node, WorkerState.SWITCHING, cur.plan.epoch)
            self.awaiting[t.worker_id] = _Awaiting(cur.plan.epoch, t.degree)
        self.data_plane.activate(cur.plan)

    def on_ack(self, worker_id: int, rank: int, epoch: int, now: float) -> None:
        """Count one rank's ack; completes a start-up / restart activation or a plan commit."""
        pend = self.awaiting.get(worker_id)
        if pend is None or pend.epoch != epoch:
            return  # stale or unknown: ignored
        pend.acked.add(rank)
        if len(pend.acked) < pend.degree:
            return
        del self.awaiting[worker_id]
        cur = self._with_target(worker_id)
        if cur is not None:
            cur.target_epochs[worker_id] = epoch
            if cur.phase == Phase.SWITCH and not any(t.worker_id in self.awaiting for t in cur.plan.targets):
                self._commit(cur, now)
            return
        cur = self._with_source(worker_id)
        if cur is not None and cur.phase == Phase.DRAIN:
            self._ensure_cache(worker_id)
            self.cache.set_available(worker_id, False)
            self.scheduler.set_epoch(worker_id, epoch)
            self.scheduler.set_state(worker_id, WorkerState.DRAINING)  # restarted source: park it again
            self.data_plane.park([worker_id])
            return
        self._activate(worker_id, epoch, now)

    def _activate(self, worker_id: int, epoch: int, now: float) -> None:
        self._ensure_cache(worker_id)
        self.scheduler.set_epoch(worker_id, epoch)
        self.epoch = max(self.epoch, epoch)
        self.scheduler.set_state(worker_id, WorkerState.ACTIVE)
        self.host.workers_activated([worker_id], now)

    def _ensure_cache(self, worker_id: int) -> None:
        if worker_id not in self._in_cache:
            g = self.group(worker_id)
            assert g is not None
            self.cache.add_worker(worker_id, g.degree, g.node, self.kv_blocks_per_rank * g.degree)
            self._in_cache.add(worker_id)

    def _commit(self, cur: Reconfiguration, now: float) -> None:
        plan = cur.plan
        # Metadata first (cache manager, scheduler, lattice), schedulable last.
        self.cache.on_reconfigure(plan)
        for t in plan.targets:
            if cur.target_epochs.get(t.worker_id, plan.epoch) != plan.epoch:
                # Restarted before the commit: its ranks came back with empty caches (their CLEARED report
                # was dropped, the target was not tracked yet), so the sources' holdings must not carry over.
                self.cache.remove_worker(t.worker_id)
                self.cache.add_worker(t.worker_id, t.degree, t.node, self.kv_blocks_per_rank * t.degree)
        for s in plan.sources:
            self._in_cache.discard(s.worker_id)
            # A completion still in flight (parked reported before prefill_done) keeps its ticket: the late
            # prefill_done finds it and reports the request; releasing it touches no worker row.
            self.scheduler.remove_worker(s.worker_id)
        self._in_cache.update(t.worker_id for t in plan.targets)
        self.lattice.apply(plan.sources, plan.targets)
        switch_s = now - cur.switch_start_s
        self.records.append(ReconfigRecord(plan, cur.drain_start_s, cur.drain_s, switch_s))
        self.inflight.remove(cur)
        for t in plan.targets:
            e = cur.target_epochs.get(t.worker_id, plan.epoch)
            self.scheduler.set_epoch(t.worker_id, e)
            self.scheduler.set_state(t.worker_id, WorkerState.ACTIVE)
            self.epoch = max(self.epoch, e)
        self.host.reconfig_committed(plan, cur.drain_s, switch_s)
        self.host.workers_activated([t.worker_id for t in plan.targets], now)

    # -- failures -----------------------------------------------------------------------------------------
    def in_cache(self, worker_id: int) -> bool:
        """Whether the cache manager currently tracks this worker (ACTIVE-ish, not failed / retired)."""
        return worker_id in self._in_cache

    def can_fail(self, worker_id: int) -> bool:
        """False for a stale failure report: unknown / retired worker, already FAILED, or a source whose ranks
        were switched to the plan's targets."""
        if worker_id not in self.scheduler.table.index or self.scheduler.state(worker_id) == WorkerState.FAILED:
            return False
        cur = self._with_source(worker_id)
        return not (cur is not None and cur.phase == Phase.SWITCH)

    def fail(self, worker_id: int) -> WorkerGroup | None:
        """Mark a worker FAILED and forget its cache holdings; returns its group, or None if the report is
        stale (see :meth:`can_fail`). The caller re-places its requests and then calls :meth:`restart`."""
        if not self.can_fail(worker_id):
            return None
        g = self.group(worker_id)
        assert g is not None
        self.scheduler.set_state(worker_id, WorkerState.FAILED)
        for cur in self.inflight:
            cur.parked.discard(worker_id)
        self.awaiting.pop(worker_id, None)
        if worker_id in self._in_cache:
            self.cache.remove_worker(worker_id)
            self._in_cache.discard(worker_id)
        return g

    def restart(self, group: WorkerGroup) -> int:
        """Restart a FAILED worker's ranks under a fresh epoch; it activates after all ranks ack."""
        epoch = self._fresh_epoch()
        self.awaiting[group.worker_id] = _Awaiting(epoch, group.degree)
        self.data_plane.restart(group, epoch)
        return epoch
