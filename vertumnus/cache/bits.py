"""Bit-mask and key-array helpers of the cache manager (no trie state here).

Worker-slot masks are ``(words,)`` uint64 rows (bit ``s`` of word ``s // 64`` = slot ``s``) or Python ints with
the same bit layout; block keys and row numbers travel as int64 arrays.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import numpy as np


def mask_int(mask: np.ndarray) -> int:
    """A ``(words,)`` uint64 mask as one Python int (bit s = slot s)."""
    return int.from_bytes(np.ascontiguousarray(mask, dtype="<u8").tobytes(), "little")


def row_bits(masks: np.ndarray, row: int) -> int:
    """Row ``row`` of a ``(rows, words)`` mask array as one Python int (bit s = slot s)."""
    if masks.shape[1] == 1:
        return int(masks[row, 0])
    return mask_int(masks[row])


def int_mask(bits: int, words: int) -> np.ndarray:
    """Inverse of :func:`mask_int`."""
    return np.frombuffer(bits.to_bytes(8 * words, "little"), dtype="<u8").astype(np.uint64)


_PACKERS: dict[int, struct.Struct] = {}  # per length: one entry per distinct path length (≤ blocks per prompt)


# Native "l" where it is 8 bytes: CPython converts multi-digit ints (63-bit keys) to C long by a digit loop,
# to long long through a generic byte-array routine about twice as slow.
_INT64 = "l" if struct.calcsize("l") == 8 else "q"


def int64_array(values: Sequence[int]) -> np.ndarray:
    """Python ints as a read-only int64 array: packing with a precompiled ``struct`` costs a fraction of
    numpy's per-element conversion (``np.array`` / ``np.fromiter``) of Python ints."""
    n = len(values)
    packer = _PACKERS.get(n)
    if packer is None:
        packer = _PACKERS[n] = struct.Struct(f"{n}{_INT64}")
    return np.frombuffer(packer.pack(*values), np.int64)


def distinct(rows: np.ndarray) -> np.ndarray:
    """The distinct values of an int64 array, ascending (``np.unique`` without its first-use import of
    numpy.ma)."""
    if rows.size < 2:
        return rows
    out = np.sort(rows)
    keep = np.empty(out.size, bool)
    keep[0] = True
    np.not_equal(out[1:], out[:-1], out=keep[1:])
    return out[keep]


def leading_runs(rows: np.ndarray, names: Sequence[int] | None = None) -> dict[int, int]:
    """Per worker slot with a non-empty run, the number of leading rows of ``rows`` (``(n, words)`` uint64
    masks along a root→z path, or ``(n,)`` for one word) that have the slot's bit: the blocks each worker
    holds at the head of the path. With ``names`` the result is keyed by ``names[slot]`` instead.

    Masks are ancestor-closed, so a slot's rows form a leading run and each slot leaves it at most once: only
    rows where the mask changes are looked at — O(n) vector work plus O(changes + slots) Python.
    """
    n = rows.shape[0]
    if n == 0:
        return {}
    if rows.ndim == 1 or rows.shape[1] == 1:
        col = rows if rows.ndim == 1 else rows[:, 0]
        last = int(col[n - 1])
        at: list[int] = []
        before: list[int] = []
        if int(col[0]) != last:  # masks only shrink along the path: equal ends mean no change at all
            nz = (col[1:] != col[:-1]).nonzero()[0]
            # The mask is constant between two change positions, so the value after change i is the value at
            # change i + 1 (and after the last change, the last row's): one gather gives both sides.
            at = nz.tolist()
            before = col[nz].tolist()
    else:
        at = np.flatnonzero((rows[1:] != rows[:-1]).any(axis=1)).tolist()
        before = [mask_int(rows[i]) for i in at]
        last = mask_int(rows[n - 1])
    after = before[1:]
    if before:
        after.append(last)
    out: dict[int, int] = {}
    for i, a, b in zip(at, before, after, strict=True):
        gone = a & ~b  # slots holding exactly rows [0, i]
        while gone:
            low = gone & -gone
            s = low.bit_length() - 1
            out[s if names is None else names[s]] = i + 1
            gone ^= low
    while last:
        low = last & -last
        s = low.bit_length() - 1
        out[s if names is None else names[s]] = n
        last ^= low
    return out
