"""Outstanding cache operations: what is in flight, so nothing is ordered twice.

Every op is indexed by block keys (never by trie rows: rows are recycled once freed). Invariants while an op
is outstanding:
  * REPLICATE / RECONCILE: each key of ``keys[first_missing:]`` is in ``adding`` under (key, dst degree), in
    ``incoming`` under (key, dst) and in ``reading`` under (key, src); ``num_blocks`` is reserved on the
    destination's capacity;
  * RECLAIM: each key of ``keys[first_missing:]`` is in ``removing`` under (key, dst).
An op leaves the book when it is confirmed (a CacheReport with its ``op_id``), fails (``op_failed``), or one
of its workers goes away.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Sequence
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
        self.adding: Counter[tuple[int, int]] = Counter()  # (key, degree index) -> copies in flight
        self.incoming: Counter[tuple[int, int]] = Counter()  # (key, dst worker id) -> copies in flight
        self.reading: Counter[tuple[int, int]] = Counter()  # (key, src worker id) -> copies reading it
        self.removing: Counter[tuple[int, int]] = Counter()  # (key, worker id) -> reclaims in flight
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
            self.removing.update((k, op.dst_worker) for k in moved)
            self.removing_key.update(moved)
        else:
            self.adding.update((k, dst.dix) for k in moved)
            self.incoming.update((k, op.dst_worker) for k in moved)
            if op.src_worker is not None:
                self.reading.update((k, op.src_worker) for k in moved)
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
            _release(self.removing, [(k, op.dst_worker) for k in moved])
            _release(self.removing_key, moved)
        else:
            _release(self.adding, [(k, e.dst_dix) for k in moved])
            _release(self.incoming, [(k, op.dst_worker) for k in moved])
            if op.src_worker is not None:
                _release(self.reading, [(k, op.src_worker) for k in moved])
        if dst is not None:
            dst.reserved -= e.reserved
        return op

    def involving(self, worker_id: int) -> list[int]:
        """Ids of ops whose source or destination is ``worker_id``."""
        return [i for i, e in self.ops.items() if worker_id in (e.op.dst_worker, e.op.src_worker)]

    def adding_at(self, key: int, dix: int) -> bool:
        return self.adding.get((key, dix), 0) > 0

    def incoming_at(self, key: int, worker_id: int) -> bool:
        """Whether a copy of block ``key`` into ``worker_id`` is in flight."""
        return self.incoming.get((key, worker_id), 0) > 0

    def busy(self, key: int, worker_id: int) -> bool:
        """Whether ``worker_id``'s copy of block ``key`` is being read by a copy or deleted by a reclaim."""
        return self.reading.get((key, worker_id), 0) > 0 or self.removing.get((key, worker_id), 0) > 0

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
