"""Mapping a request's block keys to the rows of its matched path (DESIGN.md §3: hash once, match by walk).

Chained keys make presence prefix-closed (a present key's parent is present), so the matched length m is found
by binary search — O(log n) dict probes. A chain created by one :meth:`Trie.extend` lies in consecutive rows,
so ``keys[:m]`` are then read run by run: one dict probe for a run's first key, then a compare of the keys with
``key[r : r + span]`` (contiguous memory; a live row holding a key *is* that key's node, the index being a
bijection). Short matches, and paths that continue in short runs (assembled piece by piece), are mapped one
dict probe per key instead. Both give the rows of the leading run of present keys, exactly.
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import itemgetter
from typing import TYPE_CHECKING

import numpy as np

from vertumnus.cache.bits import int64_array

if TYPE_CHECKING:
    from vertumnus.cache.trie import Trie

RUN_MIN = 16  # shorter key sequences / runs are mapped one dict probe per key
NO_ROWS = np.zeros(0, np.int64)


def lookup_rows(trie: Trie, keys: Sequence[int]) -> np.ndarray:
    """Rows (int64) of the longest leading run of ``keys`` present in ``trie`` (see the module docstring)."""
    index = trie.index
    m = _present_prefix(trie, keys)
    if m < RUN_MIN:
        return map_keys(trie, keys, m)
    r = index[keys[0]]
    want = int64_array(keys[:m])
    key, depth, size = trie.key, trie.depth, trie.size
    stale = bool(trie.free)  # freed rows keep their keys; with none waiting for reuse, all of [1, size) live
    parts: list[np.ndarray] = []
    j = 0
    while True:
        span = min(m - j, size - r)
        ok = key[r : r + span] == want[j : j + span]
        if stale:
            ok &= depth[r : r + span] > 0
        run = int(ok.argmin())  # first False; 0 when all True (ok[0] always holds: r is keys[j]'s row)
        if ok[run]:
            run = span
        parts.append(np.arange(r, r + run, dtype=np.int64))
        j += run
        if j == m:
            break
        if run < RUN_MIN:  # fragmented: the rest key by key
            parts.append(map_keys(trie, keys[j:], m - j))
            break
        got = index.get(keys[j])
        if got is None:  # an inconsistent (non-chained) key sequence: stop at the first absent key
            break
        r = got
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def _present_prefix(trie: Trie, keys: Sequence[int]) -> int:
    """Length m of the leading present run of ``keys`` by binary search, assuming presence is
    prefix-closed (``keys[m]`` is absent or m = len(keys); for a non-chained sequence, some key before
    m may be absent too)."""
    index = trie.index
    n = len(keys)
    if n == 0 or keys[n - 1] in index:
        return n
    if keys[0] not in index:  # nothing matches (an engine's report of blocks it has just computed)
        return 0
    lo, hi = 1, n - 1  # keys[0] is present, keys[hi] absent: find the first absent position
    while lo < hi:
        mid = (lo + hi) // 2
        if keys[mid] in index:
            lo = mid + 1
        else:
            hi = mid
    return lo


def map_keys(trie: Trie, keys: Sequence[int], m: int) -> np.ndarray:
    """Rows of ``keys[:m]`` (cut at the first absent key), one C-level dict pass (``itemgetter``)."""
    index = trie.index
    if m == 0:
        return NO_ROWS
    if m == 1:
        got = index.get(keys[0])
        return NO_ROWS if got is None else int64_array((got,))
    try:
        return int64_array(itemgetter(*keys[:m])(index))
    except KeyError:  # only for an inconsistent (non-chained) key sequence: stop at the first absent key
        rows = list(map(index.get, keys[:m]))
        rows = rows[: rows.index(None)]
        return int64_array(rows) if rows else NO_ROWS  # type: ignore[arg-type]
