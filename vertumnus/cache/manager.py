"""The prefix-cache manager: the global trie over all workers' caches (DESIGN.md §3), its statistics, the
periodic replication / reclamation scan, the confirm protocol, and pending reconciliation after split / merge.

Visibility protocol: a replica ordered by :meth:`CacheManager.scan` becomes a holder (visible to ``match``) only
when its destination confirms with a STORED report carrying the op id; a reclaimed replica leaves the holders
only with the REMOVED report carrying the op id. Ordinary STORED / REMOVED reports (the engines' own prefills
and LRU evictions) apply at once. The manager is single-threaded: the pool serialises calls.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from vertumnus.cache import choose, hot_copy, invariants, marks, reconcile, reconfigure, reports
from vertumnus.cache import stats as cstats
from vertumnus.cache.bits import leading_runs
from vertumnus.cache.ops import OpBook
from vertumnus.cache.scan import Candidate, find
from vertumnus.cache.trie import Trie
from vertumnus.cache.workers import WorkerInfo, WorkerTable
from vertumnus.config import CacheConfig
from vertumnus.cost_model import CostModel
from vertumnus.types import CacheOp, CacheOpKind, CacheReport, CacheReportKind, PrefixMatch, ReconfigPlan

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
        self.last_scan_s: float | None = None
        # The last match's path (rows root→leaf), reused by record_placement / plan_reconcile for the same
        # keys object while the trie's rows are unchanged (trie.version).
        self._last: tuple[Sequence[int] | None, int, np.ndarray] = (None, -1, _NO_PATH)

    # -- workers ----------------------------------------------------------------------------------------------
    @property
    def worker_ids(self) -> list[int]:
        """Registered workers, ascending."""
        return sorted(self.workers.by_id)

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

    def cached_blocks(self, worker_id: int) -> int:
        """Blocks the worker physically caches, per its reports (valid prefixes plus stray blocks)."""
        return self._worker(worker_id).cached

    def free_blocks(self, worker_id: int) -> int:
        """capacity_blocks − cached_blocks (never negative)."""
        return self._worker(worker_id).free

    def pressure(self, worker_id: int) -> float:
        """Cache pressure cached / capacity."""
        return self._worker(worker_id).pressure

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
    def match(self, keys: Sequence[int]) -> PrefixMatch:
        """Walk the trie with a request's block keys: MatchedPath length (blocks some worker holds or has
        pending), per-worker valid leading blocks, per-worker held-or-pending leading blocks."""
        trie = self.trie
        path = trie.lookup(keys)
        if path.size == 0:
            self._last = (keys, trie.version, _NO_PATH)
            return PrefixMatch(0, {}, {})
        one = trie.words == 1  # one mask word: 1-D column takes instead of (n, words) row gathers
        held_rows = trie.hold_col[0][path] if one else trie.holders[path]
        wid = self.workers.slot_wid
        held = leading_runs(held_rows, wid)
        if trie.pending_marks == 0:
            matched = max(held.values(), default=0)
            self._last = (keys, trie.version, path[:matched])
            return PrefixMatch(matched, held, dict(held))
        pend_rows = trie.pend_col[0][path] if one else trie.pending[path]
        both = leading_runs(held_rows | pend_rows, wid)
        matched = max(both.values(), default=0)
        self._last = (keys, trie.version, path[:matched])
        return PrefixMatch(matched, held, both)

    def _path(self, keys: Sequence[int], n: int) -> np.ndarray:
        last_keys, version, path = self._last
        if last_keys is keys and version == self.trie.version and path.size >= n:
            return path[:n]
        return self.trie.lookup(keys[:n])

    def record_placement(
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

    def fetchable(self, match: PrefixMatch) -> tuple[int, float, float] | None:
        """``cache.policy: queue_aware``: (V, s, q_max) for :meth:`Scheduler.place` — the longest valid prefix
        an available worker holds, the seconds a block takes over the slower (inter-node) link, and
        ``cache.fetch_max_queue_s``. None when the policy is off or less than ``hot_min_blocks`` is held."""
        if not self.cfg.replication or self.cfg.policy != "queue_aware" or not match.held_blocks:
            return None
        by_id = self.workers.by_id
        v = max((h for wid, h in match.held_blocks.items() if (w := by_id.get(wid)) is not None and w.available),
                default=0)  # fmt: skip
        if v < self.cfg.hot_min_blocks:
            return None
        c = self.cfg
        return v, c.bytes_per_block / (min(c.intra_node_gbps, c.inter_node_gbps) * 1e9), c.fetch_max_queue_s

    def plan_fetch(
        self, keys: Sequence[int], worker_id: int, match: PrefixMatch, blocks: int, queue_of: Callable[[int], float]
    ) -> CacheOp | None:
        """The copy of ``keys[:blocks]`` a request placed at ``worker_id`` runs before its prefill (attached to
        the job like a reconcile; confirmed by STORED with its op id), from an available valid holder: same node
        first, then the least loaded, then the lowest id. None when no holder qualifies."""
        w = self.workers.by_id.get(worker_id)
        if w is None:
            return None
        have = match.held_blocks.get(worker_id, 0)
        srcs = [
            s for wid, h in match.held_blocks.items()
            if h >= blocks and wid != worker_id and (s := self.workers.by_id.get(wid)) is not None and s.available
        ]  # fmt: skip
        if have >= blocks or not srcs:
            return None
        src = min(srcs, key=lambda s: (s.node != w.node, s.degree != w.degree, queue_of(s.worker_id),
                                       s.worker_id))  # fmt: skip
        path = self._path(keys, blocks)
        op = CacheOp(
            op_id=self.book.new_id(),
            kind=CacheOpKind.REPLICATE,
            dst_worker=worker_id,
            keys=self.trie.keys_of(path),
            first_missing=have,
            src_worker=src.worker_id,
            inter_degree=src.degree != w.degree,
            inter_node=src.node != w.node,
        )
        self.book.add(op, w)
        self.counters["fetch_ordered"] += 1
        return op

    def on_placement(
        self,
        keys: Sequence[int],
        match: PrefixMatch,
        worker_id: int,
        queue_before_s: float,
        predicted_s: float,
        queues: Callable[[], Mapping[int, float]],
        waiting: Callable[[int], int],
    ) -> CacheOp | None:
        """``cache.policy: queue_aware``: a REPLICATE op copying the prefix the request reuses at ``worker_id``
        off that queued holder (:mod:`vertumnus.cache.hot_copy`), or None. Call after :meth:`record_placement`."""
        if not self.cfg.replication or self.cfg.policy != "queue_aware":
            return None
        h = match.held_blocks.get(worker_id, 0)
        if h < self.cfg.hot_min_blocks or queue_before_s <= self.cfg.copy_gain_s:
            return None  # the cheap part of hot_copy's conditions, before any path work
        path = self._path(keys, h)
        op = hot_copy.plan(self.cfg, self.trie, self.workers, self.book, path, match.held_blocks, worker_id,
                           queue_before_s, predicted_s, queues, waiting)  # fmt: skip
        if op is not None:
            self.counters["hot_ordered"] += 1
        return op

    def copy_incoming(self, key: int, worker_id: int) -> bool:
        """Whether a copy bringing block ``key`` into ``worker_id`` is in flight (a reconcile or fetch ordered
        for an earlier request there)."""
        return self.book.incoming_at(key, worker_id)

    def pin(self, worker_id: int, keys: Sequence[int], n_blocks: int) -> None:
        """Mark ``keys[:n_blocks]`` in use at the worker (queued / running request): never reclaimed there."""
        w = self._worker(worker_id)
        if n_blocks > 0:
            w.add_pin(keys if type(keys) is tuple else tuple(keys), min(n_blocks, len(keys)))

    def unpin(self, worker_id: int, keys: Sequence[int], n_blocks: int) -> None:
        """Release one :meth:`pin` of the same prefix (a removed worker's pins are already gone)."""
        w = self.workers.by_id.get(worker_id)
        if (
            w is not None
            and n_blocks > 0
            and not w.drop_pin(keys if type(keys) is tuple else tuple(keys), min(n_blocks, len(keys)))
        ):
            self.counters["unmatched_unpins"] += 1

    def plan_reconcile(self, keys: Sequence[int], worker_id: int, match: PrefixMatch) -> CacheOp | None:
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

    def outstanding_ops(self) -> list[CacheOp]:
        """Ops ordered and neither confirmed nor failed, by id."""
        return [self.book.ops[i].op for i in sorted(self.book.ops)]

    # -- periodic scan ----------------------------------------------------------------------------------------
    def next_scan_s(self) -> float:
        """When the next scan is due (``cache.scan_interval_s`` after the last; 0 before the first)."""
        return 0.0 if self.last_scan_s is None else self.last_scan_s + self.cfg.scan_interval_s

    def scan(self, now: float, queue_s: Mapping[int, float]) -> list[CacheOp]:
        """The periodic scan: inter-degree, intra-degree and reclaim ops (at most ``max_ops_per_scan`` of each,
        in that order, each list in rank order), then decay and pruning of the statistics. ``queue_s``: q_w
        per worker id (missing: 0). With ``cache.replication`` off it only decays."""
        self.last_scan_s = now
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
            if not queue_aware:  # queue_aware makes same-degree copies at placement (on_placement)
                ops += self._take(intra, "intra", lambda c: choose.replication(t, wk, bk, c, queue_s, False))
            floor = self.cfg.reclaim_pressure if queue_aware else None
            kids = choose.child_marks(t, [c.row for c in recl])
            ops += self._take(recl, "reclamations", lambda c: choose.reclamation(t, wk, bk, c, kids.get(c.row), floor))
        # Rows kept for their surplus replicas alone only matter when a scan can reclaim them.
        cfg = self.cfg
        replicas = cfg.replication and cfg.max_ops_per_scan > 0 and cfg.theta_reclaim > 0
        self.counters["stats_dropped"] += cstats.decay(trie, cfg.decay, cfg.epsilon, act, acc, mis, replicas)
        return ops

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
    def stats(self) -> dict[str, float]:
        """Counters: trie size, active rows, workers, outstanding ops, ops ordered / confirmed / failed,
        reconciliations, ignored reports, and the bytes-per-node estimate."""
        out: dict[str, float] = {
            "nodes": self.trie.n_nodes,
            "active_nodes": len(self.trie.active),
            "workers": len(self.workers.by_id),
            "outstanding_ops": len(self.book),
            "bytes_per_node": self.bytes_per_node(),
        }
        for k in _COUNTERS:
            out[k] = self.counters[k]
        out["replications_ordered"] = out["inter_ordered"] + out["intra_ordered"]
        return out

    def check_invariants(self) -> None:
        """Assert every trie invariant (O(trie size); tests and debugging)."""
        invariants.check(self.trie, self.workers)

    def node_stats(self, key: int) -> tuple[dict[int, float], dict[int, float]]:
        """(access, missed) per degree of the block ``key`` (empty dicts if the trie has no such block)."""
        row = self.trie.index.get(key)
        if row is None:
            return {}, {}
        acc, mis = self.trie.access[:, row].tolist(), self.trie.missed[:, row].tolist()
        return dict(zip(self.degrees, acc, strict=True)), dict(zip(self.degrees, mis, strict=True))

    def bytes_per_node(self) -> float:
        """Estimated bytes per trie node: node arrays, the key dict and its key objects, the active set.
        (The benchmark measures the real figure with tracemalloc.)"""
        t = self.trie
        n = max(t.n_nodes, 1)
        total = t.nbytes() + sys.getsizeof(t.index) + 36 * t.n_nodes + sys.getsizeof(t.active)
        return total / n
