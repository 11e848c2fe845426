"""Cache manager fast paths: run-by-run path lookup (stale rows of freed nodes), active-row flags, pins keyed by
(last key, length), leading runs, children masks of reclaim candidates, packed key arrays, the scheduler's
idle-pool queue vector, the op book's per-owner key counters. Each is checked against the straightforward
computation it replaces."""

from __future__ import annotations

import numpy as np

from vertumnus.cache.active import ActiveRows
from vertumnus.cache.bits import int64_array, leading_runs
from vertumnus.cache.choose import child_marks
from vertumnus.cache.invariants import check_cache
from vertumnus.cache.manager import CacheManager
from vertumnus.cache.ops import OpBook
from vertumnus.cache.trie import ROOT, Trie
from vertumnus.cache.workers import WorkerTable
from vertumnus.config import CacheConfig
from vertumnus.cost_model import CostModel, CostProfile, DegreeProfile
from vertumnus.scheduler.table import Ticket, WorkerInfo
from vertumnus.scheduler.table import WorkerTable as SchedTable
from vertumnus.types import (
    CacheOp,
    CacheOpKind,
    CacheReport,
    CacheReportKind,
    Placement,
    PrefixMatch,
    Request,
    WorkerState,
)

K = tuple(range(1, 21))  # a 20-block prompt
W = tuple(range(101, 111))  # an unrelated 10-block prompt


def _manager() -> CacheManager:
    prof = CostProfile(degrees={4: DegreeProfile(d=0.1, a=0.001, b=0.0005, c=0.004, alpha=0.0)})
    m = CacheManager(CacheConfig(block_tokens=10), CostModel(prof), [4])
    for wid in (1, 2, 3):
        m.add_worker(wid, 4, 0, 100)
    return m


def _report(m: CacheManager, wid: int, kind: CacheReportKind, keys: tuple[int, ...], parent: int | None = None) -> None:
    m.apply_report(CacheReport(wid, kind, keys, parent))


def test_lookup_skips_freed_rows_whose_stale_keys_match_the_request() -> None:
    m = _manager()
    _report(m, 1, CacheReportKind.STORED, K)  # rows 1-20
    _report(m, 2, CacheReportKind.STORED, K[:10])
    _report(m, 3, CacheReportKind.STORED, W)  # rows 21-30
    _report(m, 1, CacheReportKind.REMOVED, K[:1])  # rows 11-20 lose their last holder: freed, keys left behind
    _report(m, 3, CacheReportKind.REMOVED, W[:1])  # rows 21-30 freed after them: reused first
    _report(m, 2, CacheReportKind.STORED, K[10:], parent=K[9])  # blocks 11-20 land in rows 21-30
    assert sorted(m.trie.free) == list(range(11, 21))
    assert m.trie.key[11:21].tolist() == list(K[10:])  # stale copies right after the live rows 1-10
    keys = (*K, 999)
    rows = m.trie.lookup(keys)
    assert rows.tolist() == [*range(1, 11), *range(21, 31)]
    assert rows.tolist() == [m.trie.index[k] for k in K]
    assert m.lookup(keys) == PrefixMatch(20, {2: 20}, {2: 20})
    check_cache(m)


def test_lookup_of_a_path_built_block_by_block_matches_the_per_key_mapping() -> None:
    m = _manager()
    for j, key in enumerate(K):  # every block its own report: 20 runs of one row, interleaved with W's
        _report(m, 1, CacheReportKind.STORED, (key,), parent=K[j - 1] if j else None)
        if j < len(W):
            _report(m, 2, CacheReportKind.STORED, (W[j],), parent=W[j - 1] if j else None)
    rows = m.trie.lookup((*K, 999))
    assert rows.tolist() == [m.trie.index[k] for k in K]
    assert rows.tolist() == [1, 3, 5, 7, 9, 11, 13, 15, 17, 19, *range(21, 31)]
    assert m.trie.lookup((*K[:5], 555, *K[6:])).tolist() == rows[:5].tolist()  # not chained: stops at 555
    assert m.trie.lookup(K[:3]).tolist() == [1, 3, 5]


def test_active_rows_track_flags_through_removal_and_row_reuse() -> None:
    act = ActiveRows(8)
    act.add(np.array([5, 2, 7], np.int64))
    act.add(np.array([2, 3], np.int64))  # 2 already active
    assert len(act) == 4 and act.rows().tolist() == [2, 3, 5, 7]
    act.remove(np.array([3, 7], np.int64))
    act.discard(5)
    act.discard(5)  # already gone: no change
    assert len(act) == 1 and 2 in act and 5 not in act
    act.grow(12)
    act.add(np.array([5, 11], np.int64))  # 5 flagged again (a reused row): listed once
    assert act.rows().tolist() == [2, 5, 11] and list(act) == [2, 5, 11]


def test_pins_keep_different_prefixes_with_the_same_last_key_and_length_apart() -> None:
    w = WorkerTable([4]).add(1, 4, 0, 10)
    w.add_pin((1, 2, 3), 2)
    w.add_pin((9, 2, 3), 2)  # same (last key, length) = (2, 2), another prefix
    w.add_pin((1, 2, 8), 2)  # the first prefix again
    w.add_pin((), 0)
    assert w.pins == {(1, 2): 2, (9, 2): 1, (): 1}
    assert w.pinned(9, 1) and w.pinned(2, 2) and not w.pinned(3, 3)
    assert w.drop_pin((9, 2), 2) and not w.drop_pin((9, 2), 2) and not w.drop_pin((4, 2), 2)
    assert w.drop_pin((1, 2), 2) and w.drop_pin((), 0)
    assert w.pins == {(1, 2): 1} and not w.pinned(9, 1)


def test_leading_runs_with_and_without_changes_along_the_path() -> None:
    col = np.array([0b111, 0b111, 0b011, 0b011, 0b001], np.uint64)
    assert leading_runs(col) == {2: 2, 1: 4, 0: 5}
    assert leading_runs(col, [10, 11, 12]) == {12: 2, 11: 4, 10: 5}
    assert leading_runs(np.full(4, 0b101, np.uint64)) == {0: 4, 2: 4}  # equal ends: no change inside
    assert leading_runs(np.zeros(3, np.uint64)) == {}
    assert leading_runs(col[:, None]) == {2: 2, 1: 4, 0: 5}  # (n, 1) masks as (n,)


def test_child_marks_or_the_holders_and_pending_of_all_children() -> None:
    t = Trie(1)
    a = int(t.extend(ROOT, (1,))[0])
    kids = [int(t.extend(a, (k,))[0]) for k in (2, 3, 4)]
    leaf = int(t.extend(kids[0], (5,))[0])
    t.holders[kids, 0] = np.array([0b0001, 0b0100, 0], np.uint64)
    t.pending[kids[2], 0] = np.uint64(0b1000)
    t.holders[leaf, 0] = np.uint64(0b0001)
    assert child_marks(t, [a, kids[0], kids[1], leaf]) == {a: 0b1101, kids[0]: 0b0001, kids[1]: 0, leaf: 0}


def test_int64_array_packs_63_bit_keys_exactly() -> None:
    vals = (0, 1, 2**62 + 12345, 2**63 - 1, 987654321987)
    arr = int64_array(vals)
    assert arr.dtype == np.int64 and arr.tolist() == list(vals)
    assert int64_array(()).size == 0


def test_queue_vector_of_an_idle_pool_and_of_running_workers() -> None:
    t = SchedTable()
    t.add(WorkerInfo(1, 4, 0, 100, 1), WorkerState.ACTIVE)
    t.add(WorkerInfo(2, 4, 0, 100, 1), WorkerState.ACTIVE)

    def ticket(rid: str, wid: int, est: float) -> Ticket:
        p = Placement(rid, wid, 4, 0, 10, est, 0.0, est, 4, 1)
        return Ticket(Request(rid, 0.0, 10, ()), p, 1, 1)

    a, b = ticket("a", 1, 0.75), ticket("b", 2, 0.5)
    t.reserve(a)
    t.reserve(b)
    assert not t.busy and t.queue_vector(3.0).tolist() == [0.75, 0.5]
    t.start(a, 1.0)
    assert t.busy == {0}
    assert t.queue_vector(1.25).tolist() == [0.5, 0.5] and t.queue_s(1, 1.25) == 0.5
    assert t.queue_vector(9.0).tolist() == [0.0, 0.5]  # elapsed capped at the estimate
    t.release(a)
    assert not t.busy and t.queue_vector(9.0).tolist() == [0.0, 0.5]
    assert t.free_blocks.tolist() == [100, 99] and t.outstanding.tolist() == [0, 1]


def _trie_state(m: CacheManager) -> tuple[object, ...]:
    t = m.trie
    n = t.size
    ws = sorted((w.worker_id, w.n_valid, w.n_pending, w.n_present) for w in m.workers.by_id.values())
    return (
        t.holders[:n].tolist(), t.pending[:n].tolist(), t.present[:n].tolist(), t.rc[:, :n].tolist(),
        t.active.rows().tolist(), t.active.stuck[:n].tolist(), sorted(t.free), t.pending_marks, ws,
    )  # fmt: skip


def test_single_row_drop_matches_the_array_drop_on_random_report_sequences(monkeypatch: object) -> None:
    """A one-row drop (REMOVED of a leaf) takes marks._drop_one (scalars); the array path (marks._drop_rows of a
    one-row array) must leave every mask, replica count, counter, active flag and free row the same, step by
    step."""
    import vertumnus.cache.marks as marks

    rng = np.random.default_rng(7)
    prompts = [tuple(range(1000 * p + 1, 1000 * p + 1 + int(rng.integers(3, 12)))) for p in range(6)]
    steps: list[tuple[str, int, tuple[int, ...], int | None, list[int]]] = []
    for _ in range(400):
        kind = rng.choice(["stored", "removed", "pending", "present", "prune"], p=[0.4, 0.35, 0.1, 0.1, 0.05])
        wid = int(rng.integers(1, 4))
        p = prompts[int(rng.integers(len(prompts)))]
        cut = int(rng.integers(1, len(p) + 1))
        start = int(rng.integers(0, cut))
        rows = sorted({int(x) for x in rng.integers(1, 60, 3)})
        steps.append((str(kind), wid, p[start:cut], p[start - 1] if start else None, rows))

    def run(fast: bool) -> list[tuple[object, ...]]:
        m = _manager()
        states = []
        for kind, wid, keys, parent, rows in steps:
            w = m.workers.by_id[wid]
            if kind == "stored":
                if parent is None or parent in m.trie.index:
                    _report(m, wid, CacheReportKind.STORED, keys, parent)
            elif kind == "removed":
                _report(m, wid, CacheReportKind.REMOVED, keys)
            elif kind == "prune":  # as the scan does with rows it can do nothing for: inactive and stuck
                pruned = m.trie.active.rows()
                m.trie.active.remove(pruned)
                m.trie.active.stuck[pruned] = True
            else:
                live = [r for r in rows if m.trie.is_live(r)]
                (marks.make_pending if kind == "pending" else marks.make_present)(m.trie, w, live)
            states.append(_trie_state(m))
        return states

    fast = run(True)
    array_path = marks._drop_rows
    monkeypatch.setattr(marks, "_drop_one", lambda trie, w, row: array_path(trie, w, np.array([row], np.int64)))  # type: ignore[attr-defined]
    assert run(False) == fast


def test_op_book_counts_each_key_per_owner_and_forgets_owners_left_empty() -> None:
    # Two copies of overlapping paths into worker 2 (degree index 1) from worker 1, a reclaim at worker 1: the
    # indexes answer per (key, owner) exactly as a counter of (key, owner) pairs would, and empty owners go.
    wt = WorkerTable([4, 8])
    dst = wt.add(2, 8, 0, 1024)
    book = OpBook()
    a = CacheOp(book.new_id(), CacheOpKind.REPLICATE, 2, K[:10], 4, src_worker=1)
    b = CacheOp(book.new_id(), CacheOpKind.REPLICATE, 2, K[:8], 6, src_worker=1)
    r = CacheOp(book.new_id(), CacheOpKind.RECLAIM, 1, W, 7)
    book.add(a, dst)
    book.add(b, dst)
    book.add(r, wt.add(1, 4, 0, 1024))
    assert dst.reserved == 6 + 2
    for k in K[:10]:
        copies = (k in K[4:10]) + (k in K[6:8])
        assert book.adding_at(k, 1) == book.incoming_at(k, 2) == book.busy(k, 1) == (copies > 0)
        assert not book.adding_at(k, 0) and not book.incoming_at(k, 1) and not book.busy(k, 2)
    assert [book.removing_count(k) for k in W] == [0] * 7 + [1] * 3
    assert book.busy(W[-1], 1) and not book.busy(W[0], 1)
    assert book.pop(a.op_id, dst) is a
    assert book.adding_at(K[6], 1) and not book.adding_at(K[4], 1) and not book.adding_at(K[8], 1)
    assert dst.reserved == 2
    book.pop(b.op_id, dst)
    book.pop(r.op_id, None)
    assert dst.reserved == 0 and len(book) == 0
    assert not book.adding and not book.incoming and not book.reading and not book.removing
    assert not book.removing_key
