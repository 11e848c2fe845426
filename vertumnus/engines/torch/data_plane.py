"""``TorchDataPlane``: the :class:`vertumnus.interfaces.DataPlane` of the project's own PyTorch CP engine.

One process per rank (``nodes × gpus_per_node`` ranks; on CPU one thread each), long-lived. A worker is a view
over ranks; split / merge re-group parked ranks in place (weights and KV stay resident, every block on the rank
it is on — :mod:`vertumnus.cp.block_index`; :meth:`TorchDataPlane.block_layout` shows the layout). The driver thread
turns rank replies into :class:`EngineEvents` callbacks; callbacks always run on that thread, outside the data
plane's lock, in the order the causes happened (a job's ``prefill_started`` before its ``prefill_done``).

Cache blocks are manager blocks (``cache.block_tokens`` tokens), so reports need no translation; block keys
come from the request (or ``keys_from_tokens`` with that block size). Copies between workers (REPLICATE /
RECONCILE) go source ranks → driver → destination ranks through shared memory, re-partitioned to the
destination's geometry (block at depth b lands on rank b mod C_dst); same degree is rank-to-corresponding-rank.
Exports and imports are steps like any other: they run after the step the rank is executing (FIFO), never
inside it, so a block is never read or dropped while a prefill uses it.

Failure and restart: gloo groups do not survive a member's death, but groups *without* the dead rank keep
working. A failed worker's ranks are all killed (its KV is gone; the pool drops its holdings). ``restart``
respawns every dead rank under a new *generation* and sends ``Regroup`` to every live rank: at its next step
boundary each live rank destroys its groups and rejoins the world on the driver-hosted store under the new
generation prefix, re-creating all groups in the canonical order. Live workers keep weights, KV and geometry;
they pause only for the rendezvous. Restarted ranks take the failed worker's group and ack the epoch.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

from vertumnus.config import VertumnusConfig
from vertumnus.engines.torch import messages as m
from vertumnus.engines.torch.core import DataPlaneCore
from vertumnus.engines.torch.launcher import RankProcesses
from vertumnus.engines.torch.slots import PrefillOutput, Slot
from vertumnus.interfaces import EngineEvents, PrefillJob
from vertumnus.types import CacheOp, CacheOpKind, ReconfigPlan, WorkerGroup, WorkerState


class TorchDataPlane(DataPlaneCore):
    """Multi-process torch CP engine (see module docstring).

    ``return_kv``: every prefill also ships its full KV to the driver (for the decode pool); outputs (logits,
    KV) of the last ``keep_outputs`` prefills are kept until :meth:`take_output`.
    """

    def __init__(
        self,
        cfg: VertumnusConfig,
        *,
        clock: Callable[[], float] = time.monotonic,
        return_kv: bool = False,
        keep_outputs: int = 1024,
        device: str = "cpu",
        attn_impl: str = "auto",
        threads_per_rank: int = 1,
        start_method: str = "forkserver",
        timeout_s: float = 300.0,
    ) -> None:
        pool = cfg.pool
        spec: dict[str, object] = dict(
            world_size=pool.total_gpus,
            gpus_per_node=pool.gpus_per_node,
            degrees=tuple(pool.degrees),
            model=cfg.model,
            block_tokens=cfg.cache.block_tokens,
            capacity_blocks=pool.kv_capacity_blocks_per_rank,
            retain=cfg.cache.retention(),
            device=device,
            attn_impl=attn_impl,
            threads=threads_per_rank,
            timeout_s=timeout_s,
        )
        super().__init__(cfg, clock, return_kv, keep_outputs, spec, start_method, timeout_s)

    # -- DataPlane -----------------------------------------------------------------------------------------

    def start(self, groups: Sequence[WorkerGroup], epoch: int, events: EngineEvents) -> None:
        """Start every rank, each in its group (ranks outside all groups idle), and wait until all joined."""
        self._validate(groups)
        self._events = events
        self._procs = RankProcesses(self._start_method)
        by_rank = {self._global(g, r): g for g in groups for r in g.ranks}
        with self._lock:
            for g in groups:
                self._workers[g.worker_id] = Slot(g, epoch)
        for rank in range(self.world_size):
            self._procs.spawn(self._rank_spec(rank), 0, by_rank.get(rank), epoch)
        self._thread = threading.Thread(target=self._loop, name="torch-data-plane", daemon=True)
        self._thread.start()
        with self._ready_cv:
            ok = self._ready_cv.wait_for(
                lambda: len(self._ready) == self.world_size or self._failed_start is not None, self._timeout_s
            )
        if self._failed_start is not None or not ok:
            reason = self._failed_start or f"ranks not ready after {self._timeout_s:.0f} s"
            self.close()
            raise RuntimeError(f"torch data plane failed to start: {reason}")

    def submit(self, worker_id: int, job: PrefillJob) -> None:
        req = job.request
        if req.token_ids is None:
            raise ValueError(f"request {req.request_id}: the torch engine needs token_ids")
        if not 1 <= len(req.token_ids) <= self.cfg.pool.max_model_len:
            raise ValueError(
                f"request {req.request_id}: {len(req.token_ids)} tokens outside "
                f"[1, max_model_len={self.cfg.pool.max_model_len}]"
            )
        with self._lock:
            slot = self._slot(worker_id)
            op = job.reconcile
            if op is not None and op.src_worker is not None and (slot.running is not None or slot.queue):
                # It will wait: its copy runs now, during the wait (DataPlaneCore._pump picks it up).
                self._early[op.op_id] = worker_id
                self._start_copy(op, None)
            slot.queue.append(job)
            self._pump(slot)

    def withdraw(self, worker_id: int) -> list[PrefillJob]:
        with self._lock:
            slot = self._workers.get(worker_id)
            if slot is None:
                return []
            jobs = list(slot.queue)
            slot.queue.clear()
            for job in jobs:  # an early copy still lands (and reports); no prefill follows it
                if job.reconcile is not None:
                    self._early.pop(job.reconcile.op_id, None)
            return jobs

    def park(self, worker_ids: Sequence[int]) -> None:
        with self._lock:
            for wid in worker_ids:
                slot = self._slot(wid)
                if slot.state == WorkerState.ACTIVE:
                    slot.state = WorkerState.DRAINING
                self._pump(slot)

    def activate(self, plan: ReconfigPlan) -> None:
        with self._lock:
            sources = [self._slot(g.worker_id) for g in plan.sources]
            for s, g in zip(sources, plan.sources, strict=True):
                if s.state != WorkerState.PARKED or s.group != g:
                    raise ValueError(f"activate: worker {g.worker_id} is not parked as {g}")
            src_ranks = sorted(self._global(g, r) for g in plan.sources for r in g.ranks)
            tgt_ranks = sorted(self._global(g, r) for g in plan.targets for r in g.ranks)
            if src_ranks != tgt_ranks:
                raise ValueError("activate: targets must cover exactly the sources' ranks")
            self._validate(plan.targets)
            leftover = [j for s in sources for j in s.queue]  # submitted after the drain: not lost
            for s in sources:
                del self._workers[s.worker_id]
            for t in plan.targets:
                for r in t.ranks:
                    self._send(self._global(t, r), m.Activate(plan.kind, plan.epoch, t, plan.sources))
                self._workers[t.worker_id] = Slot(t, plan.epoch)
            first = self._workers[plan.targets[0].worker_id]
            first.queue.extend(leftover)
            for t in plan.targets:
                self._pump(self._workers[t.worker_id])

    def execute(self, op: CacheOp) -> None:
        with self._lock:
            dst = self._workers.get(op.dst_worker)
            if dst is None or not dst.usable:
                self._emit_op_failed(op.op_id, f"destination worker {op.dst_worker} unavailable")
            elif op.kind == CacheOpKind.RECLAIM:
                self._to_worker(dst, m.RemoveBlocks(op.op_id, dst.worker_id, tuple(op.keys[op.first_missing :])))
            else:
                self._start_copy(op, None)

    def restart(self, group: WorkerGroup, epoch: int) -> None:
        with self._lock:
            assert self._procs is not None and self._events is not None
            self._validate([group])
            old = self._workers.get(group.worker_id)
            if old is not None and old.usable:
                raise ValueError(f"restart: worker {group.worker_id} has not failed")
            for wid, s in list(self._workers.items()):
                overlap = set(s.group.ranks) & set(group.ranks) and s.group.node == group.node
                if overlap and s.usable and wid != group.worker_id:
                    raise ValueError(f"restart: ranks of {group} belong to live worker {wid}")
                if overlap and not s.usable:
                    del self._workers[wid]
            dead = [r for r in range(self.world_size) if not self._procs.alive(r)]
            members = {self._global(group, r) for r in group.ranks}
            self._generation += 1
            gen = self._generation
            for r in range(self.world_size):
                if r in dead:  # respawn; ranks of other failed workers come back idle
                    self._ready.discard(r)
                    self._procs.spawn(self._rank_spec(r), gen, group if r in members else None, epoch)
                else:
                    self._send(r, m.Regroup(gen))
                    if r in members:  # an idle rank respawned earlier joins now
                        self._send(r, m.Assign(group, epoch))
            self._workers[group.worker_id] = Slot(group, epoch)  # its first rank reports CLEARED with the acks

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(10.0)
        if self._procs is not None:
            self._procs.close()
            self._procs = None

    # -- extras for the serving layer and tests ------------------------------------------------------------

    def take_output(self, request_id: str) -> PrefillOutput | None:
        """The logits (and KV with ``return_kv``) of a finished prefill; available before its prefill_done."""
        with self._lock:
            return self._outputs.pop(request_id, None)

    def block_layout(self, worker_id: int) -> dict[int, int]:
        """Block key -> rank inside the worker, for every KV block the worker's ranks store (tests and debugging;
        the cache manager predicts the same layout). A step like any other: it answers after the work already
        sent to the worker. Not for engine-event callbacks (they run on the thread that collects the answer)."""
        with self._lock:
            slot = self._slot(worker_id)
            token = self._next_token
            self._next_token += 1
            got = self._listings[token] = {}
            self._to_worker(slot, m.ListBlocks(worker_id, token))
            degree = slot.group.degree
            ok = self._ready_cv.wait_for(lambda: len(got) == degree or not slot.usable, self._timeout_s)
            del self._listings[token]
            if not ok or len(got) < degree:
                raise RuntimeError(f"worker {worker_id} did not list its blocks")
        return {k: rank for rank, keys in got.items() for k in keys}

    def rank_pid(self, rank: int) -> int | None:
        """OS pid of global rank ``rank`` (tests kill ranks to exercise restart)."""
        return None if self._procs is None else self._procs.pid(rank)

    def workers(self) -> dict[int, tuple[WorkerGroup, WorkerState, int]]:
        """worker_id -> (group, state, queued jobs)."""
        with self._lock:
            return {w: (s.group, s.state, len(s.queue)) for w, s in self._workers.items()}

    def __enter__(self) -> TorchDataPlane:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
