"""Worker slots of the cache manager: bit positions in the trie's masks plus per-worker cache bookkeeping.

Worker ids are never reused by the pool, but slots are: a removed worker's slot returns to a free heap after
all its marks were cleared, so masks stay as narrow as the number of live workers.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(slots=True)
class WorkerInfo:
    """One worker as the cache manager sees it. Counters are maintained incrementally by :mod:`.marks`."""

    worker_id: int
    slot: int
    degree: int
    dix: int  # index of ``degree`` in the manager's degree list (column of rc / access / missed)
    node: int
    capacity: int  # cache blocks
    word: int
    bit: np.uint64
    available: bool = True  # may be chosen as destination / source / victim of cache ops
    n_valid: int = 0  # nodes in holders
    n_pending: int = 0  # nodes in pending
    n_present: int = 0  # nodes in present (physical, not valid)
    reserved: int = 0  # blocks of outstanding copies into this worker
    # Rank inside the worker of each physical block (row) not on its canonical rank (depth−1) mod degree —
    # blocks a merge kept where a smaller worker had computed them (see :mod:`.reconfigure`). Keys ⊆ the rows
    # where the worker has a holders / present mark (:func:`.marks.drop` forgets a row's rank with the block).
    displaced: dict[int, int] = field(default_factory=dict)
    # Prefixes in use (queued / running requests): (last key, length) -> [[keys, count], ...], the prefix being
    # keys[:length]. Chained keys make (last key, length) identify a prefix without hashing all its keys; a
    # bucket still tells different prefixes apart by comparing them, so any key sequence is handled exactly.
    pin_index: dict[tuple[int | None, int], list[list[Any]]] = field(default_factory=dict)

    @property
    def cached(self) -> int:
        """Blocks physically cached (valid holdings plus physically present blocks)."""
        return self.n_valid + self.n_present

    @property
    def free(self) -> int:
        return max(0, self.capacity - self.cached)

    @property
    def pressure(self) -> float:
        return self.cached / self.capacity

    @property
    def pins(self) -> dict[tuple[int, ...], int]:
        """Prefix in use -> count (built for inspection)."""
        return {tuple(keys[:n]): c for (_, n), bucket in self.pin_index.items() for keys, c in bucket}

    def add_pin(self, keys: tuple[int, ...], n: int) -> None:
        """One more use of the prefix ``keys[:n]``."""
        bucket = self.pin_index.setdefault((keys[n - 1] if n else None, n), [])
        for entry in bucket:
            if _same_prefix(entry[0], keys, n):
                entry[1] += 1
                return
        bucket.append([keys, 1])

    def drop_pin(self, keys: tuple[int, ...], n: int) -> bool:
        """Release one use of the prefix ``keys[:n]``; False if it was not pinned."""
        at = (keys[n - 1] if n else None, n)
        bucket = self.pin_index.get(at)
        if bucket is None:
            return False
        for i, entry in enumerate(bucket):
            if _same_prefix(entry[0], keys, n):
                entry[1] -= 1
                if entry[1] == 0:
                    del bucket[i]
                    if not bucket:
                        del self.pin_index[at]
                return True
        return False

    def pinned(self, key: int, depth: int) -> bool:
        """Whether the prefix ending at the block ``key`` at ``depth`` is part of a prefix in use here."""
        return any(
            n >= depth and keys[depth - 1] == key for (_, n), bucket in self.pin_index.items() for keys, _ in bucket
        )


def _same_prefix(a: tuple[int, ...], b: tuple[int, ...], n: int) -> bool:
    return a is b or a[:n] == b[:n]


class WorkerTable:
    """Slot allocation and lookup."""

    __slots__ = (
        "_free_slots",
        "_next_slot",
        "available_bits",
        "by_id",
        "by_slot",
        "degree_bits",
        "degree_counts",
        "degrees",
        "dix",
        "slot_wid",
    )

    def __init__(self, degrees: list[int]) -> None:
        self.degrees = degrees
        self.dix = {c: i for i, c in enumerate(degrees)}
        self.by_id: dict[int, WorkerInfo] = {}
        self.by_slot: dict[int, WorkerInfo] = {}
        self.degree_counts = np.zeros(len(degrees), np.int64)  # live workers per degree index
        self.slot_wid: list[int] = []  # slot -> worker id (-1: free)
        self._free_slots: list[int] = []
        self._next_slot = 0
        # Masks as Python ints (bit s = slot s): available workers, workers per degree index.
        self.available_bits = 0
        self.degree_bits = [0 for _ in degrees]

    def add(self, worker_id: int, degree: int, node: int, capacity: int) -> WorkerInfo:
        """Register a worker; raises ValueError for a duplicate id, an unknown degree or a bad capacity."""
        if worker_id in self.by_id:
            raise ValueError(f"worker {worker_id} is already registered with the cache manager")
        if degree not in self.dix:
            raise ValueError(f"worker {worker_id}: degree {degree} is not one of {self.degrees}")
        if capacity < 1:
            raise ValueError(f"worker {worker_id}: capacity_blocks must be ≥ 1, got {capacity}")
        if self._free_slots:
            slot = heapq.heappop(self._free_slots)
        else:
            slot = self._next_slot
            self._next_slot += 1
        info = WorkerInfo(
            worker_id, slot, degree, self.dix[degree], node, capacity, slot >> 6, np.uint64(1 << (slot & 63))
        )
        self.by_id[worker_id] = info
        self.by_slot[slot] = info
        if slot >= len(self.slot_wid):
            self.slot_wid.append(-1)
        self.slot_wid[slot] = worker_id
        self.degree_counts[info.dix] += 1
        self.available_bits |= 1 << slot
        self.degree_bits[info.dix] |= 1 << slot
        return info

    def remove(self, info: WorkerInfo) -> None:
        """Forget a worker whose marks have all been cleared; its slot becomes reusable."""
        assert info.n_valid == info.n_pending == info.n_present == 0, "clear a worker's marks before removal"
        del self.by_id[info.worker_id]
        del self.by_slot[info.slot]
        self.slot_wid[info.slot] = -1
        self.degree_counts[info.dix] -= 1
        heapq.heappush(self._free_slots, info.slot)
        self.available_bits &= ~(1 << info.slot)
        self.degree_bits[info.dix] &= ~(1 << info.slot)

    @property
    def slots_needed(self) -> int:
        """Slots handed out so far (masks need ``ceil(slots_needed / 64)`` words)."""
        return self._next_slot

    def set_available(self, info: WorkerInfo, available: bool) -> None:
        info.available = available
        if available:
            self.available_bits |= 1 << info.slot
        else:
            self.available_bits &= ~(1 << info.slot)

    def in_mask(self, bits: int) -> list[WorkerInfo]:
        """Workers whose slot bit is set in ``bits``, by slot."""
        out = []
        by_slot = self.by_slot
        while bits:
            low = bits & -bits
            info = by_slot.get(low.bit_length() - 1)
            if info is not None:
                out.append(info)
            bits ^= low
        return out
