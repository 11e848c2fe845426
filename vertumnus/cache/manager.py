"""The prefix-cache manager: the global trie over all workers' caches (DESIGN.md §3), its statistics, the
periodic replication / reclamation scan, the confirm protocol, and pending reconciliation after split / merge.

Public verbs, by caller:

- the pool, per request (:mod:`vertumnus.cache.placement` has the sequence): :meth:`CacheManager.lookup`,
  :meth:`CacheManager.commit`, :meth:`CacheManager.replicate_hot`, :meth:`CacheManager.release`;
- the pool, engine feedback and timers: :meth:`CacheManager.apply_report`, :meth:`CacheManager.op_failed`,
  :meth:`CacheManager.scan`, :meth:`CacheManager.skip_scans`, :meth:`CacheManager.idle_state`;
- the epoch protocol: :meth:`CacheManager.add_worker`, :meth:`CacheManager.remove_worker`,
  :meth:`CacheManager.set_available`, :meth:`CacheManager.on_reconfigure`; the controller:
  :meth:`CacheManager.reconcile_traffic`;
- snapshots: :meth:`CacheManager.stats`, :meth:`CacheManager.cached_blocks`.

Tests and tools read the collaborators directly: ``trie`` (:mod:`~vertumnus.cache.trie`), ``workers``
(:mod:`~vertumnus.cache.workers`), ``book`` (:mod:`~vertumnus.cache.ops`), ``counters``;
:func:`vertumnus.cache.invariants.check` and :func:`vertumnus.cache.stats.node_stats` work on them.

Visibility protocol: a replica ordered by :meth:`CacheManager.scan` becomes a holder (visible to ``match``) only
when its destination confirms with a STORED report carrying the op id; a reclaimed replica leaves the holders
only with the REMOVED report carrying the op id. Ordinary STORED / REMOVED reports (the engines' own prefills
and LRU evictions) apply at once. The manager is single-threaded: the pool serialises calls.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from vertumnus.cache import choose, hot_copy, marks, reconcile, reconfigure, reports
from vertumnus.cache import stats as cstats
from vertumnus.cache.bits import leading_runs
from vertumnus.cache.ops import OpBook
from vertumnus.cache.placement import CacheCommit, Pin, WorkerLoads, as_tuple, fetch_offer, fetch_op
from vertumnus.cache.scan import Candidate, find
from vertumnus.cache.trie import Trie
from vertumnus.cache.workers import WorkerInfo, WorkerTable
from vertumnus.config import CacheConfig
from vertumnus.cost_model import CostModel
from vertumnus.types import (
    CacheOp,
    CacheOpKind,
    CacheReport,
    CacheReportKind,
    Placement,
    PrefixMatch,
    ReconfigPlan,
    Request,
)

_NO_PATH = np.zeros(0, np.int64)
_COUNTERS = (
    "inter_ordered", "intra_ordered", "replications_confirmed", "reclamations_ordered", "reclamations_confirmed",
    "reconciliations_ordered", "reconciliations_confirmed", "reconcile_blocks", "reconcile_misses", "ops_failed",
    "ignored_reports", "unknown_parent_reports", "unmatched_unpins", "scans", "stats_dropped", "reconfigurations",
    "pending_blocks_created", "hot_ordered", "fetch_ordered",
)  # fmt: skip


class CacheManager:
    """Global prefix trie plus replication policy. See the module docstring for the protocol."""

    def __init__(self, cfg: CacheConfig, cost: CostModel, degrees: Sequence[int]) -> None:
        degs = sorted(set(degrees))
        if not degs:
            raise ValueError("CacheManager needs at least one degree")
        unknown = [c for c in degs if c not in cost.degrees]
        if unknown:
            raise ValueError(f"degrees {unknown} are missing from the cost profile (has {cost.degrees})")
        self.cfg = cfg
        self.cost = cost
        self.degrees = degs
        self.workers = WorkerTable(degs)
        self.trie = Trie(len(degs))
        self._recorder = cstats.Recorder(self.trie, cost, cfg.block_tokens)
        self.book = OpBook()
        self.counters: Counter[str] = Counter()
        # The last lookup's path (rows root→leaf), reused by commit / replicate_hot for the same keys object
        # while the trie's rows are unchanged (trie.version).
        self._last: tuple[Sequence[int] | None, int, np.ndarray] = (None, -1, _NO_PATH)

    # -- workers (the epoch protocol) -------------------------------------------------------------------------
    def add_worker(self, worker_id: int, degree: int, node: int, capacity_blocks: int) -> None:
        """Register a worker with an empty cache (ValueError on a duplicate id or an unknown degree)."""
        self.workers.add(worker_id, degree, node, capacity_blocks)
        while self.workers.slots_needed > 64 * self.trie.words:
            self.trie.add_word()

    def remove_worker(self, worker_id: int) -> None:
        """Forget a worker: all its holdings, pending state, pins and cache ops go."""
        self.trie.try_free(self._retire(self._worker(worker_id)))

    def set_available(self, worker_id: int, available: bool) -> None:
        """Whether cache ops may use the worker (the pool clears it while a worker drains / switches / fails)."""
        self.workers.set_available(self._worker(worker_id), available)

    def _worker(self, worker_id: int) -> WorkerInfo:
        w = self.workers.by_id.get(worker_id)
        if w is None:
            raise ValueError(f"worker {worker_id} is not registered with the cache manager")
        return w

    def _retire(self, w: WorkerInfo) -> list[int]:
        """Drop a worker's ops, marks, pins and slot; returns the rows it had marks on (to free)."""
        for op_id in self.book.involving(w.worker_id):
            self.book.pop(op_id, self.workers.by_id.get(self.book.ops[op_id].op.dst_worker))
        rows = marks.nodes_of(self.trie, w)
        marks.drop(self.trie, w, rows)
        w.pin_index.clear()
        self.workers.remove(w)
        return rows.tolist()

    # -- per request ------------------------------------------------------------------------------------------
    def lookup(self, keys: Sequence[int]) -> PrefixMatch:
        """Walk the trie with a request's block keys: MatchedPath length (blocks some worker holds or has
        pending), per-worker valid leading blocks, per-worker held-or-pending leading blocks, and the fetch the
        scheduler may price (``cache.policy: queue_aware``; :func:`~vertumnus.cache.placement.fetch_offer`)."""
        trie = self.trie
        path = trie.lookup(keys)
        if path.size == 0:
            self._last = (keys, trie.version, _NO_PATH)
            return PrefixMatch(0, {}, {})
        one = trie.words == 1  # one mask word: 1-D column takes instead of (n, words) row gathers
        held_rows = trie.hold_col[0][path] if one else trie.holders[path]
        wid = self.workers.slot_wid
        held = leading_runs(held_rows, wid)
        offer = fetch_offer(self.cfg, self.workers, held)
        if trie.pending_marks == 0:
            matched = max(held.values(), default=0)
            self._last = (keys, trie.version, path[:matched])
            return PrefixMatch(matched, held, dict(held), offer)
        pend_rows = trie.pend_col[0][path] if one else trie.pending[path]
        both = leading_runs(held_rows | pend_rows, wid)
        matched = max(both.values(), default=0)
        self._last = (keys, trie.version, path[:matched])
        return PrefixMatch(matched, held, both, offer)

    def commit(self, request: Request, match: PrefixMatch, placement: Placement, first: bool = True) -> CacheCommit:
        """The cache's part of a placement the scheduler made on ``match`` (this request's :meth:`lookup`).

        In order: the statistics (``first`` only: a re-placement after a drain or failure is the same request);
        the copy to attach to the job — a reconcile when the worker has pending blocks beyond its valid prefix
        and a source physically has them, else ``placement.fetch``; without a copy, the blocks a copy already
        in flight into the worker brings (an earlier request's, attached to a job ahead of this one in the
        worker's FCFS queue, so it lands before this prefill starts) when the placement was priced with them
        (the engine reuses fewer if that copy fails); then the pin of the reused prefix (:meth:`release` it when
        the request leaves the worker)."""
        keys = request.block_keys
        wid = placement.worker_id
        if first:
            self._record_placement(keys, match, request.input_len, wid, placement.preferred_degree)
        op = self._plan_reconcile(keys, wid, match)
        reuse = match.held_blocks.get(wid, 0)
        if op is None and placement.fetch is not None:
            fetch = placement.fetch
            op = fetch_op(self.trie, self.workers, self.book, self._path(keys, fetch.blocks), wid, reuse, fetch)
            if op is not None:
                self.counters["fetch_ordered"] += 1
        if op is not None:
            if op.src_worker is not None:
                reuse = len(op.keys)
        else:
            priced = placement.cached_tokens // self.cfg.block_tokens
            if priced > reuse and self.book.incoming_at(keys[priced - 1], wid):
                reuse = priced
        pin = None
        if reuse > 0:
            w = self._worker(wid)
            pin = Pin(wid, as_tuple(keys), min(reuse, len(keys)))
            w.add_pin(pin.keys, pin.blocks)
        return CacheCommit(op, reuse, pin)

    def release(self, pin: Pin) -> None:
        """Release one :meth:`commit` pin (a removed worker's pins are already gone)."""
        w = self.workers.by_id.get(pin.worker_id)
        if w is not None and pin.blocks > 0 and not w.drop_pin(pin.keys, pin.blocks):
            self.counters["unmatched_unpins"] += 1

    def _path(self, keys: Sequence[int], n: int) -> np.ndarray:
        last_keys, version, path = self._last
        if last_keys is keys and version == self.trie.version and path.size >= n:
            return path[:n]
        return self.trie.lookup(keys[:n])

    def _record_placement(
        self, keys: Sequence[int], match: PrefixMatch, input_len: int, worker_id: int, preferred_degree: int
    ) -> None:
        """Statistics of one placement: access[z, C_w] += 1 on the blocks ``worker_id`` reuses; missed[z,
        C_pref] += Δ(z) on the matched blocks no degree-``preferred_degree`` worker holds.

        Only blocks some worker holds validly count: ``match.matched_blocks`` also covers blocks that only a
        pending copy has (after split / merge), which no replication could take as its source — missed
        benefit there could never turn into an inter-degree candidate."""
        w = self._worker(worker_id)
        dix_pref = self.workers.dix.get(preferred_degree)
        if dix_pref is None:
            raise ValueError(f"preferred degree {preferred_degree} is not one of {self.degrees}")
        held = match.held_blocks
        valid = max(held.values(), default=0)  # holders are ancestor-closed: the longest valid run
        path = self._path(keys, min(valid, match.matched_blocks))
        reused = min(held.get(worker_id, 0), path.size)
        self._recorder.record(path, reused, w.dix, preferred_degree, dix_pref, input_len)

    def replicate_hot(
        self, keys: Sequence[int], match: PrefixMatch, placement: Placement, loads: WorkerLoads, now: float
    ) -> CacheOp | None:
        """``cache.policy: queue_aware``: a REPLICATE op copying the prefix the request reuses at its worker off
        that queued holder (:mod:`vertumnus.cache.hot_copy`), or None. Call after :meth:`commit` and after the
        job is submitted (a copy never runs ahead of the request that triggered it); ``loads`` at ``now`` is
        read only once the cheap conditions hold."""
        if not self.cfg.replication or self.cfg.policy != "queue_aware":
            return None
        worker_id, queue_before_s = placement.worker_id, placement.queue_s
        h = match.held_blocks.get(worker_id, 0)
        if h < self.cfg.hot_min_blocks or queue_before_s <= self.cfg.copy_gain_s:
            return None  # the cheap part of hot_copy's conditions, before any path work
        path = self._path(keys, h)
        op = hot_copy.plan(self.cfg, self.trie, self.workers, self.book, path, match.held_blocks, worker_id,
                           queue_before_s, placement.predicted_s, loads, now)  # fmt: skip
        if op is not None:
            self.counters["hot_ordered"] += 1
        return op

    def _plan_reconcile(self, keys: Sequence[int], worker_id: int, match: PrefixMatch) -> CacheOp | None:
        """A RECONCILE op when the request placed at ``worker_id`` has pending blocks beyond the worker's valid
        prefix and a source physically has the missing ones; None otherwise (pending blocks without any source
        are cleared: an ordinary miss). The op is confirmed like a replication (STORED with its op id)."""
        w = self.workers.by_id.get(worker_id)
        if w is None:
            return None
        held = match.held_blocks.get(worker_id, 0)
        pending = min(match.pending_blocks.get(worker_id, 0), len(keys))
        if pending <= held:
            return None
        path = self._path(keys, pending)
        pending = min(pending, path.size)
        op, blocks, cleared = reconcile.plan(self.trie, self.workers, self.book, w, keys, path, held, pending)
        if cleared:
            self.counters["reconcile_misses"] += 1
        if op is not None:
            self.counters["reconciliations_ordered"] += 1
            self.counters["reconcile_blocks"] += blocks
        return op

    # -- reports and op outcomes ------------------------------------------------------------------------------
    def apply_report(self, report: CacheReport) -> None:
        """Mirror a worker's cache change; a report carrying ``op_id`` also confirms that op. Reports about
        unknown workers are counted and ignored."""
        w = self.workers.by_id.get(report.worker_id)
        if w is None:
            self.counters["ignored_reports"] += 1
            return
        op = self.book.get(report.op_id)
        if op is not None and op.dst_worker != w.worker_id:
            op = None
        trie = self.trie
        if report.kind == CacheReportKind.STORED:
            if not reports.stored(trie, w, report.keys, report.parent):
                self.counters["unknown_parent_reports"] += 1
            if op is not None and op.kind != CacheOpKind.RECLAIM:
                reports.make_path_valid(trie, w, op.keys)
                self.book.pop(op.op_id, w)
                name = "replications" if op.kind == CacheOpKind.REPLICATE else "reconciliations"
                self.counters[f"{name}_confirmed"] += 1
        elif report.kind == CacheReportKind.REMOVED:
            reports.removed(trie, w, report.keys)
            if op is not None and op.kind == CacheOpKind.RECLAIM:
                reports.removed(trie, w, op.keys[op.first_missing :])
                self.book.pop(op.op_id, w)
                self.counters["reclamations_confirmed"] += 1
        elif report.kind == CacheReportKind.CLEARED:
            reports.cleared(trie, w)
        else:
            self.counters["ignored_reports"] += 1

    def op_failed(self, op_id: int, reason: str) -> CacheOp | None:
        """Forget a failed op (its blocks may be ordered again); returns it, or None if unknown."""
        e = self.book.ops.get(op_id)
        if e is None:
            return None
        self.counters["ops_failed"] += 1
        return self.book.pop(op_id, self.workers.by_id.get(e.op.dst_worker))

    # -- periodic scan ----------------------------------------------------------------------------------------
    def scan(self, now: float, queue_s: Mapping[int, float]) -> list[CacheOp]:
        """The periodic scan: inter-degree, intra-degree and reclaim ops (at most ``max_ops_per_scan`` of each,
        in that order, each list in rank order), then decay and pruning of the statistics. ``queue_s``: q_w
        per worker id (missing: 0). With ``cache.replication`` off it only decays."""
        self.counters["scans"] += 1
        trie = self.trie
        act = cstats.active_rows(trie)
        acc, mis = trie.access.take(act, axis=1), trie.missed.take(act, axis=1)  # (degrees, rows)
        ops: list[CacheOp] = []
        if self.cfg.replication and act.size:
            inter, intra, recl = find(trie, act, acc, mis, self.workers.degree_counts, self.cfg)
            t, wk, bk = self.trie, self.workers, self.book
            ops += self._take(inter, "inter", lambda c: choose.replication(t, wk, bk, c, queue_s, True))
            queue_aware = self.cfg.policy == "queue_aware"
            if not queue_aware:  # queue_aware makes same-degree copies at placement (replicate_hot)
                ops += self._take(intra, "intra", lambda c: choose.replication(t, wk, bk, c, queue_s, False))
            floor = self.cfg.reclaim_pressure if queue_aware else None
            kids = choose.child_marks(t, [c.row for c in recl])
            ops += self._take(recl, "reclamations", lambda c: choose.reclamation(t, wk, bk, c, kids.get(c.row), floor))
        # Rows kept for their surplus replicas alone only matter when a scan can reclaim them.
        cfg = self.cfg
        replicas = cfg.replication and cfg.max_ops_per_scan > 0 and cfg.theta_reclaim > 0
        self.counters["stats_dropped"] += cstats.decay(trie, cfg.decay, cfg.epsilon, act, acc, mis, replicas)
        return ops

    def skip_scans(self, scans: int) -> None:
        """Count ``scans`` scans skipped over an idle stretch (each would have changed nothing; see
        :meth:`idle_state`)."""
        self.counters["scans"] += scans

    def idle_state(self) -> tuple[int, float]:
        """(rows with live statistics, the sum of their statistics): equal before and after a scan period
        without requests means the scans in between only decayed nothing away."""
        trie = self.trie
        act = trie.active.rows()
        stats = float(trie.access[:, act].sum() + trie.missed[:, act].sum()) if act.size else 0.0
        return int(act.size), stats

    def _take(self, cands: list[Candidate], name: str, build: Callable[[Candidate], CacheOp | None]) -> list[CacheOp]:
        out: list[CacheOp] = []
        for c in cands:
            if len(out) >= self.cfg.max_ops_per_scan:
                break
            op = build(c)
            if op is not None:
                out.append(op)
        self.counters[f"{name}_ordered"] += len(out)
        return out

    # -- reconfiguration --------------------------------------------------------------------------------------
    def on_reconfigure(self, plan: ReconfigPlan) -> None:
        """Move cache metadata from ``plan.sources`` to ``plan.targets`` (DESIGN.md §2): targets not yet
        registered are added (capacity: the sources' per-rank capacity × degree); sources are removed."""
        lays = reconfigure.layout(self.trie, self.workers, plan)
        src_ids = {g.worker_id for g in plan.sources}
        for lay in lays:
            g = lay.group
            known = self.workers.by_id.get(g.worker_id)
            if g.worker_id in src_ids or (known is not None and known.degree != g.degree):
                raise ValueError(f"reconfiguration target {g} conflicts with a registered worker")
        freed: list[int] = []
        for g in plan.sources:
            freed.extend(self._retire(self.workers.by_id[g.worker_id]))
        for lay in lays:
            g = lay.group
            if g.worker_id not in self.workers.by_id:
                self.add_worker(g.worker_id, g.degree, g.node, lay.capacity)
            w = self.workers.by_id[g.worker_id]
            marks.make_valid(self.trie, w, lay.valid)
            marks.make_pending(self.trie, w, lay.pending)
            marks.make_present(self.trie, w, lay.present)
            w.displaced.update(lay.displaced)  # after the marks: its rows are physical at w now
            self.counters["pending_blocks_created"] += int(lay.pending.size)
        self.trie.try_free(freed)
        self.counters["reconfigurations"] += 1

    def reconcile_traffic(self, plan: ReconfigPlan) -> float:
        """Expected reconciliation blocks of a candidate split / merge, weighted by recent access (the
        controller's tie-breaker among operations). Changes nothing."""
        return reconfigure.traffic(self.trie, reconfigure.layout(self.trie, self.workers, plan))

    # -- introspection ----------------------------------------------------------------------------------------
    def cached_blocks(self, worker_id: int) -> int:
        """Blocks the worker physically caches, per its reports (valid prefixes plus stray blocks)."""
        return self._worker(worker_id).cached

    def stats(self) -> dict[str, float]:
        """Counters: trie size, active rows, workers, outstanding ops, ops ordered / confirmed / failed,
        reconciliations, ignored reports, and the bytes-per-node estimate."""
        out: dict[str, float] = {
            "nodes": self.trie.n_nodes,
            "active_nodes": len(self.trie.active),
            "workers": len(self.workers.by_id),
            "outstanding_ops": len(self.book),
            "bytes_per_node": cstats.bytes_per_node(self.trie),
        }
        for k in _COUNTERS:
            out[k] = self.counters[k]
        out["replications_ordered"] = out["inter_ordered"] + out["intra_ordered"]
        return out
