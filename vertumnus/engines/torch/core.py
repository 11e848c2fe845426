"""Driver-side core of :class:`~vertumnus.engines.torch.data_plane.TorchDataPlane`: dispatch, rank replies,
failure detection and the event thread.

Locking: every method here except :meth:`DataPlaneCore._loop` / ``_drain`` runs with ``_lock`` held. Events
for the pool are queued as callbacks in ``_pending`` and run by the driver thread after releasing the lock,
so a callback may call back into the data plane (e.g. ``worker_failed`` → ``submit`` elsewhere) safely.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence

from vertumnus.cache.block_keys import keys_from_tokens
from vertumnus.config import VertumnusConfig
from vertumnus.engines.torch import messages as m
from vertumnus.engines.torch.launcher import RankProcesses
from vertumnus.engines.torch.slots import Copy, PrefillOutput, Running, Slot, partition_blocks
from vertumnus.interfaces import EngineEvents, PrefillJob
from vertumnus.types import CacheOp, PrefillResult, WorkerGroup, WorkerState

log = logging.getLogger(__name__)
Callback = Callable[[], None]


class DataPlaneCore:
    """State and driver-thread machinery shared by the public API."""

    def __init__(
        self,
        cfg: VertumnusConfig,
        clock: Callable[[], float],
        return_kv: bool,
        keep_outputs: int,
        spec: dict[str, object],
        start_method: str,
        timeout_s: float,
    ) -> None:
        self.cfg = cfg
        self.clock = clock
        self.return_kv = return_kv
        self.keep_outputs = keep_outputs
        self.block_tokens = cfg.cache.block_tokens
        self.world_size = cfg.pool.total_gpus
        self._spec = spec
        self._start_method = start_method
        self._timeout_s = timeout_s
        self._lock = threading.RLock()
        self._ready_cv = threading.Condition(self._lock)
        self._pending: deque[Callback] = deque()
        self._workers: dict[int, Slot] = {}
        self._copies: dict[int, Copy] = {}
        # op id -> worker: attached copies started when their job was queued behind others (submit), so the
        # transfer overlaps the wait; the job's prefill follows the import in the ranks' command order.
        self._early: dict[int, int] = {}
        self._outputs: OrderedDict[str, PrefillOutput] = OrderedDict()
        self._ready: set[int] = set()
        self._listings: dict[int, dict[int, tuple[int, ...]]] = {}  # block_layout token -> rank -> keys
        self._next_token = 0
        self._failed_start: str | None = None
        self._generation = 0
        self._procs: RankProcesses | None = None
        self._events: EngineEvents | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    # -- helpers -------------------------------------------------------------------------------------------

    def _rank_spec(self, rank: int) -> m.RankSpec:
        return m.RankSpec(rank=rank, **self._spec)  # type: ignore[arg-type]

    def _global(self, g: WorkerGroup, local: int) -> int:
        return g.node * self.cfg.pool.gpus_per_node + local

    def _validate(self, groups: Sequence[WorkerGroup]) -> None:
        pool = self.cfg.pool
        seen: set[int] = set()
        for g in groups:
            if (
                g.degree not in pool.degrees
                or g.first_rank % g.degree
                or not 0 <= g.node < pool.nodes
                or g.first_rank + g.degree > pool.gpus_per_node
            ):
                raise ValueError(f"{g} is not an aligned block of an allowed degree {pool.degrees}")
            ranks = {self._global(g, r) for r in g.ranks}
            if ranks & seen:
                raise ValueError(f"{g} overlaps another group")
            seen |= ranks

    def _slot(self, worker_id: int) -> Slot:
        slot = self._workers.get(worker_id)
        if slot is None or not slot.usable:
            raise ValueError(f"worker {worker_id} is unknown or failed")
        return slot

    def _send(self, rank: int, cmd: m.Command) -> None:
        assert self._procs is not None
        self._procs.send(rank, cmd)

    def _to_worker(self, slot: Slot, cmd: m.Command) -> None:
        # Invariant: every rank of a worker gets the same command sequence (sent together under the lock).
        for r in slot.group.ranks:
            self._send(self._global(slot.group, r), cmd)

    def _emit(self, cb: Callback) -> None:
        self._pending.append(cb)

    def _ev(self) -> EngineEvents:
        assert self._events is not None
        return self._events

    def _emit_op_failed(self, op_id: int, reason: str) -> None:
        ev = self._ev()
        self._emit(lambda: ev.cache_op_failed(op_id, reason))

    # -- dispatch ------------------------------------------------------------------------------------------

    def _pump(self, slot: Slot) -> None:
        """Dispatch the next job if the worker is idle and ACTIVE; send Park once a draining worker is idle."""
        if slot.running is not None or not slot.usable:
            return
        if slot.state == WorkerState.DRAINING and not slot.park_sent:
            slot.park_sent = True
            self._to_worker(slot, m.Park(slot.worker_id))
            return
        if slot.state != WorkerState.ACTIVE or not slot.queue:
            return
        job = slot.queue.popleft()
        now = self.clock()
        slot.running = Running(job, now)
        ev, wid, rid = self._ev(), slot.worker_id, job.request.request_id
        self._emit(lambda: ev.prefill_started(wid, rid, now))
        op = job.reconcile
        if op is not None and self._early.pop(op.op_id, None) is not None:
            copy = self._copies.get(op.op_id)
            if copy is not None:  # still exporting: the prefill goes out right after the import
                slot.running.copy_op = op.op_id
                copy.job = job
                return
            self._send_prefill(slot, job)  # imported already (queued ahead of this prefill), or failed: a miss
            return
        if op is not None and op.src_worker is not None:
            slot.running.copy_op = op.op_id
            self._start_copy(op, job)
            return
        if op is not None:
            self._emit_op_failed(op.op_id, "no valid copy to reconcile from: ordinary miss")
        self._send_prefill(slot, job)

    def _send_prefill(self, slot: Slot, job: PrefillJob) -> None:
        req = job.request
        toks = list(req.token_ids or ())
        n_full = len(toks) // self.block_tokens
        keys = req.block_keys if len(req.block_keys) == n_full else keys_from_tokens(toks, self.block_tokens)
        self._to_worker(
            slot, m.RunPrefill(slot.worker_id, req.request_id, toks, tuple(keys), job.max_reuse_blocks, self.return_kv)
        )

    def _start_copy(self, op: CacheOp, job: PrefillJob | None) -> None:
        src = self._workers.get(op.src_worker) if op.src_worker is not None else None
        if src is None or not src.usable:
            self._emit_op_failed(op.op_id, f"source worker {op.src_worker} unavailable")
            if job is not None:
                self._send_prefill(self._workers[op.dst_worker], job)
            return
        self._copies[op.op_id] = Copy(op, src.worker_id, op.dst_worker, src.group.degree, job)
        self._to_worker(src, m.ExportBlocks(op.op_id, src.worker_id, tuple(op.keys[op.first_missing :])))

    # -- replies -------------------------------------------------------------------------------------------

    def _handle(self, msg: m.Reply) -> None:
        ev = self._ev()
        now = self.clock()
        if isinstance(msg, m.Ready):
            if msg.generation == self._generation:
                self._ready.add(msg.rank)
                self._ready_cv.notify_all()
        elif isinstance(msg, m.EpochAck):
            self._emit(lambda: ev.epoch_ack(msg.worker_id, msg.rank, msg.epoch, now))
        elif isinstance(msg, m.PrefillDone):
            self._on_prefill(msg, now)
        elif isinstance(msg, m.Parked):
            slot = self._workers.get(msg.worker_id)
            if slot is not None and slot.usable and slot.park_sent:  # else: an earlier incarnation's reply
                slot.parked.add(msg.rank)
                if len(slot.parked) == slot.group.degree:
                    slot.state = WorkerState.PARKED
                    self._emit(lambda: ev.worker_parked(msg.worker_id, now))
        elif isinstance(msg, m.Exported):
            self._on_exported(msg)
        elif isinstance(msg, m.OpDone):
            if msg.rank == 0:  # the worker's first rank carries reports; every rank decided the same
                self._emit_reports(msg.reports)
                if msg.error is not None:
                    self._emit_op_failed(msg.op_id, msg.error)
        elif isinstance(msg, m.Reports):
            self._emit_reports(msg.reports)
        elif isinstance(msg, m.BlockList):
            got = self._listings.get(msg.token)
            if got is not None:
                got[msg.rank] = msg.keys
                self._ready_cv.notify_all()
        elif isinstance(msg, m.RankFailed):
            log.error("rank %d failed: %s", msg.rank, msg.message)
            if len(self._ready) < self.world_size and self._generation == 0:
                self._failed_start = msg.message
                self._ready_cv.notify_all()
            self._fail_rank(msg.rank, f"rank {msg.rank} failed: {msg.message.strip().splitlines()[-1]}")

    def _emit_reports(self, reports: list[m.CacheReport]) -> None:
        ev = self._ev()
        for rep in reports:
            self._emit(lambda rep=rep: ev.cache_report(rep))  # type: ignore[misc]

    def _on_prefill(self, msg: m.PrefillDone, now: float) -> None:
        slot = self._workers.get(msg.worker_id)
        run = slot.running if slot is not None else None
        if slot is None or run is None or run.job.request.request_id != msg.request_id or msg.epoch != slot.epoch:
            return  # stale: the worker failed meanwhile (or this is its earlier incarnation's reply)
        run.replies[msg.rank] = msg
        if len(run.replies) < slot.group.degree:
            return
        done = [r for r in run.replies.values() if isinstance(r, m.PrefillDone)]
        lead = next(r for r in done if r.rank == 0)
        logits = next(r.logits for r in done if r.logits is not None)
        self._outputs[msg.request_id] = PrefillOutput(
            msg.request_id,
            slot.worker_id,
            lead.cached_tokens,
            logits,
            lead.kv,
            max(r.compute_s for r in done),
            max(r.cpu_s for r in done),
        )
        while len(self._outputs) > self.keep_outputs:
            self._outputs.popitem(last=False)
        self._emit_reports(lead.reports)
        result = PrefillResult(msg.request_id, slot.worker_id, lead.cached_tokens, run.started_s, now)
        ev = self._ev()
        self._emit(lambda: ev.prefill_done(result))
        slot.running = None
        self._pump(slot)

    def _on_exported(self, msg: m.Exported) -> None:
        copy = self._copies.get(msg.op_id)
        if copy is None:
            return
        copy.exported[msg.rank] = (msg.keys, msg.blocks)
        if len(copy.exported) < copy.expected:
            return
        del self._copies[msg.op_id]
        dst = self._workers.get(copy.dst)
        if dst is None or not dst.usable:
            self._emit_op_failed(copy.op.op_id, f"destination worker {copy.dst} unavailable")
            return
        op = copy.op
        available = tuple(k for keys, _ in copy.exported.values() for k in keys)
        for r, (keys, blocks) in zip(dst.group.ranks, partition_blocks(copy, dst.group.degree), strict=True):
            self._send(
                self._global(dst.group, r),
                m.ImportBlocks(op.op_id, dst.worker_id, tuple(op.keys), op.first_missing, available, keys, blocks),
            )
        if copy.job is not None:
            self._send_prefill(dst, copy.job)

    # -- failures ------------------------------------------------------------------------------------------

    def _check_alive(self) -> None:
        assert self._procs is not None
        for slot in list(self._workers.values()):
            if slot.usable:
                dead = [r for r in slot.group.ranks if not self._procs.alive(self._global(slot.group, r))]
                if dead:
                    self._fail(slot, f"rank process(es) {dead} of node {slot.group.node} exited")

    def _fail_rank(self, rank: int, reason: str) -> None:
        for slot in list(self._workers.values()):
            if slot.usable and rank in {self._global(slot.group, r) for r in slot.group.ranks}:
                self._fail(slot, reason)

    def _fail(self, slot: Slot, reason: str) -> None:
        """Mark FAILED, kill all its ranks (its KV is lost), drop its jobs (the pool re-places them)."""
        assert self._procs is not None
        slot.state = WorkerState.FAILED
        for r in slot.group.ranks:
            self._procs.kill(self._global(slot.group, r))
        slot.queue.clear()
        slot.running = None
        wid = slot.worker_id
        for op_id in [i for i, w in self._early.items() if w == wid]:
            del self._early[op_id]
        for op_id, copy in list(self._copies.items()):
            if wid in (copy.src, copy.dst):
                del self._copies[op_id]
                self._emit_op_failed(op_id, f"worker {wid} failed")
                dst = self._workers.get(copy.dst)
                if copy.job is not None and dst is not None and dst.usable:
                    self._send_prefill(dst, copy.job)  # the reconcile source died: ordinary miss
        ev, now = self._ev(), self.clock()
        self._emit(lambda: ev.worker_failed(wid, reason, now))

    # -- driver thread -------------------------------------------------------------------------------------

    def _loop(self) -> None:
        last_check = 0.0
        while not self._stop.is_set():
            self._drain()
            try:
                msg = self._procs.replies.get(timeout=0.05) if self._procs is not None else None
            except (queue.Empty, OSError, EOFError):
                msg = None
            self._drain()  # events caused before this reply was produced go first
            with self._lock:
                if msg is not None:
                    self._handle(msg)
                if self._procs is not None and time.monotonic() - last_check > 0.2:
                    last_check = time.monotonic()
                    self._check_alive()
            self._drain()

    def _drain(self) -> None:
        while True:
            with self._lock:
                if not self._pending:
                    return
                cb = self._pending.popleft()
            try:
                cb()
            except Exception:  # a faulty listener must not stop the data plane
                log.exception("engine event callback failed")
