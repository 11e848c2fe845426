"""Outstanding cache operations: what is in flight, so nothing is ordered twice.

Every op is indexed by block keys (never by trie rows: rows are recycled once freed). Invariants while an op
is outstanding:
  * REPLICATE / RECONCILE: each key of ``keys[first_missing:]`` is counted in ``adding[dst degree]``,
    ``incoming[dst]`` and ``reading[src]``; ``num_blocks`` is reserved on the destination's capacity;
  * RECLAIM: each key of ``keys[first_missing:]`` is counted in ``removing[dst]`` and ``removing_key``.
The indexes are one key counter per degree / worker (absent when empty), not one counter of (key, owner)
pairs: ordering a copy counts its keys with three C-level updates (no tuple per block), which keeps a
128-block fetch on the placement path at a few µs.
An op leaves the book when it is confirmed (a CacheReport with its ``op_id``), fails (``op_failed``), or one
of its workers goes away.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass

from vertumnus.cache.workers import WorkerInfo
from vertumnus.types import CacheOp, CacheOpKind


@dataclass(slots=True)
class _Entry:
    op: CacheOp
    dst_dix: int
    reserved: int


class OpBook:
    """The set of outstanding ops and the indexes derived from it."""

    __slots__ = ("_next_id", "adding", "incoming", "ops", "reading", "removing", "removing_key")

    def __init__(self) -> None:
        self.ops: dict[int, _Entry] = {}
        self.adding: dict[int, Counter[int]] = {}  # degree index -> key -> copies in flight
        self.incoming: dict[int, Counter[int]] = {}  # dst worker id -> key -> copies in flight
        self.reading: dict[int, Counter[int]] = {}  # src worker id -> key -> copies reading it
        self.removing: dict[int, Counter[int]] = {}  # worker id -> key -> reclaims in flight
        self.removing_key: Counter[int] = Counter()  # key -> reclaims in flight over all workers
        self._next_id = 1

    def __len__(self) -> int:
        return len(self.ops)

    def new_id(self) -> int:
        op_id = self._next_id
        self._next_id += 1
        return op_id

    def get(self, op_id: int | None) -> CacheOp | None:
        e = self.ops.get(op_id) if op_id is not None else None
        return e.op if e is not None else None

    def add(self, op: CacheOp, dst: WorkerInfo) -> None:
        """Record a freshly ordered op; reserves capacity on the destination of a copy."""
        moved = op.keys[op.first_missing :]
        reserved = 0
        if op.kind == CacheOpKind.RECLAIM:
            _count(self.removing, op.dst_worker, moved)
            self.removing_key.update(moved)
        else:
            _count(self.adding, dst.dix, moved)
            _count(self.incoming, op.dst_worker, moved)
            if op.src_worker is not None:
                _count(self.reading, op.src_worker, moved)
            reserved = len(moved)
            dst.reserved += reserved
        self.ops[op.op_id] = _Entry(op, dst.dix, reserved)

    def pop(self, op_id: int | None, dst: WorkerInfo | None) -> CacheOp | None:
        """Forget an op (confirmed or failed); returns it, or None if unknown. ``dst``: its destination's
        record if the worker is still registered (to release the reservation)."""
        e = self.ops.pop(op_id, None) if op_id is not None else None
        if e is None:
            return None
        op = e.op
        moved = op.keys[op.first_missing :]
        if op.kind == CacheOpKind.RECLAIM:
            _uncount(self.removing, op.dst_worker, moved)
            _release(self.removing_key, moved)
        else:
            _uncount(self.adding, e.dst_dix, moved)
            _uncount(self.incoming, op.dst_worker, moved)
            if op.src_worker is not None:
                _uncount(self.reading, op.src_worker, moved)
        if dst is not None:
            dst.reserved -= e.reserved
        return op

    def outstanding(self) -> list[CacheOp]:
        """Ops ordered and neither confirmed nor failed, by id."""
        return [self.ops[i].op for i in sorted(self.ops)]

    def involving(self, worker_id: int) -> list[int]:
        """Ids of ops whose source or destination is ``worker_id``."""
        return [i for i, e in self.ops.items() if worker_id in (e.op.dst_worker, e.op.src_worker)]

    def adding_at(self, key: int, dix: int) -> bool:
        return _has(self.adding, dix, key)

    def incoming_at(self, key: int, worker_id: int) -> bool:
        """Whether a copy of block ``key`` into ``worker_id`` is in flight."""
        return _has(self.incoming, worker_id, key)

    def busy(self, key: int, worker_id: int) -> bool:
        """Whether ``worker_id``'s copy of block ``key`` is being read by a copy or deleted by a reclaim."""
        return _has(self.reading, worker_id, key) or _has(self.removing, worker_id, key)

    def removing_count(self, key: int) -> int:
        """Reclaims in flight on block ``key``, over all workers."""
        return self.removing_key.get(key, 0)


def _release(counter: Counter, items: Sequence[Hashable]) -> None:  # type: ignore[type-arg]
    """Decrement each item once; entries reaching zero are deleted (membership tests stay exact)."""
    for it in items:
        n = counter[it] - 1
        if n > 0:
            counter[it] = n
        else:
            del counter[it]


def _count(index: dict[int, Counter[int]], owner: int, keys: Iterable[int]) -> None:
    """Count ``keys`` once more under ``owner``."""
    c = index.get(owner)
    if c is None:
        index[owner] = c = Counter()
    c.update(keys)


def _uncount(index: dict[int, Counter[int]], owner: int, keys: Sequence[int]) -> None:
    """Count ``keys`` once less under ``owner``; an owner left with no key leaves the index."""
    c = index.get(owner)
    if c is None:
        return
    _release(c, keys)
    if not c:
        del index[owner]


def _has(index: dict[int, Counter[int]], owner: int, key: int) -> bool:
    c = index.get(owner)
    return c is not None and c.get(key, 0) > 0
