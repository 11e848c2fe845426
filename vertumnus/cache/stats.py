"""Per-request statistics (access / missed) and their decay (DESIGN.md §3).

Rows whose statistics are non-zero are kept in ``trie.active``, and so are rows with two or more valid copies
(flagged by :mod:`.marks`: reclamation candidates even without statistics) until the scan finds that none of
their holders could give one up; the periodic scan and the decay touch only those rows, so their cost grows
with live statistics and surplus replicas, never with the size of the trie.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import numpy as np

from vertumnus.cache.trie import Trie
from vertumnus.cost_model import CostModel


def marginal_benefit(
    cost: CostModel, degree: int, input_len: int, first: int, last: int, block_tokens: int
) -> np.ndarray:
    """Δ(z) for the path positions ``first..last-1`` (node at position j has depth j+1):

        Δ(z) = E_C(L − ℓ_{k−1}, ℓ_{k−1}) − E_C(L − ℓ_k, ℓ_k),   ℓ_k = min(k·block_tokens, L − 1)

    (the cap keeps R ≥ 1: a fully cached prompt still computes its last token). Negative benefits — a prefix
    read that costs more than it saves — count as 0.
    """
    cap = max(input_len - 1, 0)
    ell = np.minimum(np.arange(first, last + 1, dtype=np.float64) * block_tokens, cap)
    e = cost.predict_degree(degree, input_len - ell, ell)
    return np.maximum(e[:-1] - e[1:], 0.0)


_BENEFIT_CACHE = 64  # (degree, input length) pairs whose Δ vector is kept (a bench / burst of equal prompts)


class Recorder:
    """Per-placement statistics update over one trie (binds the cost model and the block size)."""

    __slots__ = ("_benefit", "block_tokens", "cost", "trie")

    def __init__(self, trie: Trie, cost: CostModel, block_tokens: int) -> None:
        self.trie = trie
        self.cost = cost
        self.block_tokens = block_tokens
        # (C, L) -> Δ(z) for path positions 0..⌈L/B⌉-1: element j is the same float marginal_benefit computes
        # for any range containing j (elementwise arithmetic), so slices of it serve every placement of (C, L).
        self._benefit: dict[tuple[int, int], np.ndarray] = {}

    def benefit(self, degree: int, input_len: int, first: int, last: int) -> np.ndarray:
        """``marginal_benefit(cost, degree, input_len, first, last, block_tokens)``, cached per (C, L)."""
        key = (degree, input_len)
        full = self._benefit.get(key)
        if full is None or full.size < last:
            n = max(last, -(-input_len // self.block_tokens))
            full = marginal_benefit(self.cost, degree, input_len, 0, n, self.block_tokens)
            if len(self._benefit) >= _BENEFIT_CACHE:
                del self._benefit[next(iter(self._benefit))]  # oldest entry
            self._benefit[key] = full
        return full[first:last]

    def record(
        self, path: np.ndarray, reused: int, dix_w: int, pref_degree: int, dix_pref: int, input_len: int
    ) -> None:
        """access[z, C_w] += 1 on the first ``reused`` rows of ``path`` (root→leaf, the matched path);
        missed[z, C_pref] += Δ(z) on the matched rows where no degree-C_pref worker holds z."""
        trie = self.trie
        matched = path.size
        if matched == 0:
            return
        if reused > 0:
            trie.acc_col[dix_w][path[:reused]] += 1.0
        # rc is non-increasing along a path (holders are ancestor-closed): rows with rc = 0 form a suffix, and
        # the whole path is held at C_pref when its last row is.
        rcp = trie.rc_col[dix_pref][path]
        k0 = matched if rcp[matched - 1] else int(np.count_nonzero(rcp))
        if k0 >= matched:
            if reused > 0:
                trie.active.add(path[:reused])
            return
        trie.mis_col[dix_pref][path[k0:]] += self.benefit(pref_degree, input_len, k0, matched)
        if reused >= k0:  # the two row sets cover the whole path
            trie.active.add(path)
        else:
            trie.active.add(path[:reused])
            trie.active.add(path[k0:])


def decay(
    trie: Trie,
    factor: float,
    epsilon: float,
    act: np.ndarray,
    acc: np.ndarray,
    mis: np.ndarray,
    replicas: bool = True,
) -> int:
    """Multiply the statistics of the active rows ``act`` (current values ``acc`` / ``mis``, laid out per
    degree: shape (degrees, rows)) by ``factor``, zero entries below ``epsilon`` and drop rows left without
    statistics from the active set — except, with ``replicas``, rows with two or more valid copies that are
    not stuck (see :mod:`.active`: no reclamation victim until a holder loses its blocks below, which flags
    the row again).

    Returns the number of rows dropped.
    """
    if act.size == 0:
        return 0
    acc = acc * factor
    mis = mis * factor
    np.putmask(acc, acc < epsilon, 0.0)
    np.putmask(mis, mis < epsilon, 0.0)
    for d in range(acc.shape[0]):  # 1-D scatters per degree column (a 2-D row scatter is several times slower)
        trie.acc_col[d][act] = acc[d]
        trie.mis_col[d][act] = mis[d]
    dead = act[~(acc.any(axis=0) | mis.any(axis=0))]
    if replicas and dead.size:
        keep = (trie.rc[:, dead].sum(axis=0) >= 2) & ~trie.active.stuck[dead]
        dead = dead[~keep]
    trie.active.remove(dead)
    return int(dead.size)


def active_rows(trie: Trie) -> np.ndarray:
    """The active rows as a sorted int64 array."""
    return trie.active.rows()


def node_stats(trie: Trie, degrees: Sequence[int], key: int) -> tuple[dict[int, float], dict[int, float]]:
    """(access, missed) per degree of the block ``key`` (empty dicts if the trie has no such block)."""
    row = trie.index.get(key)
    if row is None:
        return {}, {}
    acc, mis = trie.access[:, row].tolist(), trie.missed[:, row].tolist()
    return dict(zip(degrees, acc, strict=True)), dict(zip(degrees, mis, strict=True))


def bytes_per_node(trie: Trie) -> float:
    """Estimated bytes per trie node: node arrays, the key dict and its key objects, the active set.
    (The benchmark measures the real figure with tracemalloc.)"""
    n = max(trie.n_nodes, 1)
    total = trie.nbytes() + sys.getsizeof(trie.index) + 36 * trie.n_nodes + sys.getsizeof(trie.active)
    return total / n
