"""Per-request statistics (access / missed) and their decay (DESIGN.md §3).

Rows whose statistics are non-zero are kept in ``trie.active``; the periodic scan and the decay touch only
those rows, so their cost grows with live statistics, never with the size of the trie.
"""

from __future__ import annotations

import numpy as np

from vertumnus.cache.trie import Trie
from vertumnus.profiling.cost_model import CostModel


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


class Recorder:
    """Per-placement statistics update over one trie (binds the cost model and the block size)."""

    __slots__ = ("block_tokens", "cost", "trie")

    def __init__(self, trie: Trie, cost: CostModel, block_tokens: int) -> None:
        self.trie = trie
        self.cost = cost
        self.block_tokens = block_tokens

    def record(
        self, path: np.ndarray, reused: int, dix_w: int, pref_degree: int, dix_pref: int, input_len: int
    ) -> None:
        """access[z, C_w] += 1 on the first ``reused`` rows of ``path`` (root→leaf, the matched path);
        missed[z, C_pref] += Δ(z) on the matched rows where no degree-C_pref worker holds z."""
        trie = self.trie
        if reused > 0:
            rows = path[:reused]
            trie.access[rows, dix_w] += 1.0
            trie.active.update(rows.tolist())
        matched = path.size
        if matched == 0:
            return
        # rc is non-increasing along a path (holders are ancestor-closed): rows with rc = 0 form a suffix.
        k0 = int(np.count_nonzero(trie.rc[path, dix_pref]))
        if k0 >= matched:
            return
        delta = marginal_benefit(self.cost, pref_degree, input_len, k0, matched, self.block_tokens)
        rows = path[k0:]
        trie.missed[rows, dix_pref] += delta
        trie.active.update(rows.tolist())


def decay(trie: Trie, factor: float, epsilon: float, act: np.ndarray, acc: np.ndarray, mis: np.ndarray) -> int:
    """Multiply the statistics of the active rows ``act`` (current values ``acc`` / ``mis``) by ``factor``,
    zero entries below ``epsilon`` and drop rows left without statistics from the active set.

    Returns the number of rows dropped.
    """
    if act.size == 0:
        return 0
    acc = acc * factor
    mis = mis * factor
    acc[acc < epsilon] = 0.0
    mis[mis < epsilon] = 0.0
    trie.access[act] = acc
    trie.missed[act] = mis
    dead = act[~(acc.any(axis=1) | mis.any(axis=1))]
    trie.active.difference_update(dead.tolist())
    return int(dead.size)


def active_rows(trie: Trie) -> np.ndarray:
    """The active rows as a sorted int64 array."""
    act = np.fromiter(trie.active, np.int64, len(trie.active))
    act.sort()
    return act
