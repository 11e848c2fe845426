"""Full consistency check of a cache manager's trie (O(trie size); for tests and debugging, not hot paths)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from vertumnus.cache.trie import NONE, ROOT, Trie
from vertumnus.cache.workers import WorkerTable

if TYPE_CHECKING:
    from vertumnus.cache.manager import CacheManager


def check(trie: Trie, workers: WorkerTable) -> None:
    """Raise AssertionError when an invariant of :mod:`vertumnus.cache.trie` does not hold."""
    rows = np.fromiter(trie.index.values(), np.int64, len(trie.index))
    assert rows.size == trie.n_nodes, "index size != live node count"
    assert (trie.key[rows] == np.fromiter(trie.index.keys(), np.int64, rows.size)).all(), "key array != index"
    if rows.size == 0:
        assert trie.pending_marks == 0
        return
    par = trie.parent[rows].astype(np.int64)
    assert (trie.depth[rows] == trie.depth[par] + 1).all(), "depth != parent depth + 1"
    for r in rows.tolist():  # sibling links: every live row is among its parent's children
        assert r in trie.children(int(trie.parent[r])), f"row {r} unlinked from its parent"
    inner = par != ROOT
    h, p, s = trie.holders[rows], trie.pending[rows], trie.present[rows]
    hp, pp = trie.holders[par], trie.pending[par]
    assert not (h & ~hp)[inner].any(), "holders not ancestor-closed"
    assert not ((h | p) & ~(hp | pp))[inner].any(), "holders|pending not ancestor-closed"
    assert not (h & p).any() and not (h & s).any(), "holders overlap pending / present"
    assert trie.pending_marks == sum(int(v).bit_count() for v in p.ravel().tolist()), "pending_marks drifted"
    rc = np.zeros((rows.size, len(workers.degrees)), np.int64)
    for w in workers.by_id.values():
        has = (h[:, w.word] & w.bit) != 0
        rc[:, w.dix] += has
        assert int(has.sum()) == w.n_valid, f"worker {w.worker_id}: n_valid drifted"
        assert int(((p[:, w.word] & w.bit) != 0).sum()) == w.n_pending, f"worker {w.worker_id}: n_pending"
        assert int(((s[:, w.word] & w.bit) != 0).sum()) == w.n_present, f"worker {w.worker_id}: n_present"
        if w.displaced:  # ranks kept only for physical blocks, and only off the canonical rank
            d_rows = np.fromiter(w.displaced.keys(), np.int64, len(w.displaced))
            d_rank = np.fromiter(w.displaced.values(), np.int64, len(w.displaced))
            phys = (trie.holders[d_rows, w.word] | trie.present[d_rows, w.word]) & w.bit
            assert (phys != 0).all(), f"worker {w.worker_id}: rank kept for a block it does not have"
            canon = (trie.depth[d_rows].astype(np.int64) - 1) % w.degree
            assert ((d_rank >= 0) & (d_rank < w.degree) & (d_rank != canon)).all(), f"worker {w.worker_id}: rank"
    assert (rc == trie.rc[:, rows].T).all(), "replica counts drifted"
    live_stats = rows[(trie.access[:, rows] != 0).any(axis=0) | (trie.missed[:, rows] != 0).any(axis=0)]
    assert trie.active.flag[live_stats].all(), "a row with statistics is missing from the active set"
    assert all(trie.depth[r] != NONE for r in trie.active), "a freed row is active"


def check_cache(manager: CacheManager) -> None:
    """:func:`check` on a cache manager's trie and workers (O(trie size); tests and debugging)."""
    check(manager.trie, manager.workers)
