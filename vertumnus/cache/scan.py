"""Candidate lists of the periodic scan (DESIGN.md §3), vectorised over the active rows only.

For each active row z and degree C with r = ReplicaCount(z, C):
  inter:   r = 0 and missed[z,C] > θ_inter   (z has a valid holder somewhere; some degree-C worker exists)
  intra:   r > 0 and access[z,C] > r·θ_intra (some degree-C worker lacks z)
  reclaim: r > 0 and access[z,C] < r·θ_reclaim
Ranking: inter by missed per copied block (desc); intra by access/r (desc), smaller footprint first among
near-ties (within ``NEAR_TIE`` of the group's best); reclaim by access/r (asc), deeper rows first on ties.

Chains: a copy of z carries every block of root→z the destination lacks, so in the inter and intra lists a
candidate whose child is a candidate of the same list at the same degree, with the same degree-C holders, is
subsumed by it and dropped — one op per hot chain, not one per block.

Reclaim candidates that can never yield an op are left out before the cut, so they take no attempt slot: z
with a single valid copy in the pool (reclamation never takes the last copy), and z where every holder keeps a
marked block below it (the victim must keep no descendant). The scan marks the latter *stuck*
(:mod:`vertumnus.cache.active`) and skips them until a holder loses its blocks below or z gains a holder
(:mod:`vertumnus.cache.marks` clears the mark); without statistics they leave the active set meanwhile
(:func:`vertumnus.cache.stats.decay`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vertumnus.cache.bits import distinct
from vertumnus.cache.trie import NONE, ROOT, Trie
from vertumnus.config import CacheConfig

NEAR_TIE = 0.05  # relative gap of access/r under which intra candidates count as tied
ATTEMPTS_PER_OP = 16  # candidates per list considered per op slot (a bound on the per-scan Python work)


@dataclass(slots=True, frozen=True)
class Candidate:
    """One (z, C) entry of a candidate list."""

    row: int
    dix: int
    r: int  # ReplicaCount(z, C)
    score: float  # inter: missed per copied block; intra / reclaim: access / r
    footprint: int  # inter / intra: fewest blocks a degree-C destination lacks on root→z; reclaim: 0


def footprints(trie: Trie, rows: np.ndarray, dix: np.ndarray, r: np.ndarray) -> np.ndarray:
    """Fewest blocks some degree-C worker without z lacks along root→z, for many (z, C) at once.

    Holders are ancestor-closed, so a degree-C worker lacking z holds the prefix up to the deepest ancestor
    a with rc[C, a] > rc[C, z] (the root counts as held by all): footprint = depth(z) − depth(a).
    """
    out = trie.depth[rows].astype(np.int64)
    cur = trie.parent[rows].astype(np.int64)
    todo = np.arange(rows.size)
    while todo.size:
        c = cur[todo]
        ok = (c == ROOT) | (trie.rc[dix[todo], c] > r[todo])
        done = todo[ok]
        out[done] -= trie.depth[c[ok]]
        todo = todo[~ok]
        cur[todo] = trie.parent[cur[todo]]
    return out


def _collapse(trie: Trie, rows: np.ndarray, dix: np.ndarray, n_deg: int) -> np.ndarray:
    """Mask of the candidates not subsumed by a child candidate at the same degree. The parent is subsumed
    when it has the same degree-C holders as the child (equal rc): every destination lacking the child then
    lacks the parent, so the child's copy adds a replica of both."""
    parents = trie.parent[rows].astype(np.int64)
    same = trie.rc[dix, parents] == trie.rc[dix, rows]
    return ~np.isin(rows * n_deg + dix, parents[same] * n_deg + dix[same])


def _cands(rows, dix, r, score, fp) -> list[Candidate]:  # type: ignore[no-untyped-def]
    return [
        Candidate(*t) for t in zip(rows.tolist(), dix.tolist(), r.tolist(), score.tolist(), fp.tolist(), strict=True)
    ]


def find(
    trie: Trie,
    act: np.ndarray,
    acc: np.ndarray,
    mis: np.ndarray,
    degree_counts: np.ndarray,
    cfg: CacheConfig,
) -> tuple[list[Candidate], list[Candidate], list[Candidate]]:
    """Ranked (inter, intra, reclaim) lists, each cut to ``ATTEMPTS_PER_OP × max_ops_per_scan`` entries
    (filling the reclaim list marks the stuck rows it meets; see the module docstring).

    ``acc`` / ``mis``: the statistics of the rows ``act`` laid out per degree, shape (degrees, rows): the
    element-wise tests then run along rows (numpy loops over a short inner axis of degrees several times
    slower).
    """
    limit = ATTEMPTS_PER_OP * cfg.max_ops_per_scan
    if act.size == 0 or limit == 0:
        return [], [], []
    rc = trie.rc.take(act, axis=1)  # (degrees, rows)
    rcf = rc.astype(np.float64)  # r·θ without mixed-type loops (same values as rc * θ)
    return (
        _inter(trie, act, rc, mis, degree_counts, cfg.theta_inter, limit),
        _intra(trie, act, rc, rcf, acc, degree_counts, cfg.theta_intra, limit),
        _reclaim(trie, act, rc, rcf, acc, cfg.theta_reclaim, limit),
    )


def _inter(
    trie: Trie, act: np.ndarray, rc: np.ndarray, mis: np.ndarray, counts: np.ndarray, theta: float, limit: int
) -> list[Candidate]:
    exists = counts > 0
    if np.count_nonzero(exists) < 2:  # rc = 0 at C next to a holder of another degree needs two degrees
        return []
    held = np.asarray(rc.any(axis=0))  # some holder of any degree
    d, i = np.nonzero((rc == 0) & (mis > theta) & held[None, :] & exists[:, None])
    if i.size == 0:
        return []
    keep = _collapse(trie, act[i], d, rc.shape[0])
    i, d = i[keep], d[keep]
    rows, zero = act[i], np.zeros(i.size, np.int64)
    fp = footprints(trie, rows, d, zero)
    score = mis[d, i] / fp
    if score.size > limit:  # only the `limit` best can be taken: sort just those (and ties at the cut)
        keep = np.flatnonzero(score >= -np.partition(-score, limit - 1)[limit - 1])
        rows, d, zero, score, fp = rows[keep], d[keep], zero[keep], score[keep], fp[keep]
    order = np.lexsort((d, rows, fp, -score))[:limit]  # unique (row, degree) keys: a total order
    return _cands(rows[order], d[order], zero[order], score[order], fp[order])


def _intra(
    trie: Trie,
    act: np.ndarray,
    rc: np.ndarray,
    rcf: np.ndarray,
    acc: np.ndarray,
    counts: np.ndarray,
    theta: float,
    limit: int,
) -> list[Candidate]:
    d, i = np.nonzero((rc > 0) & (acc > rcf * theta) & (rc < counts.astype(rc.dtype)[:, None]))
    if i.size == 0:
        return []
    keep = _collapse(trie, act[i], d, rc.shape[0])
    i, d = i[keep], d[keep]
    rows, r = act[i], rc[d, i].astype(np.int64)
    score = acc[d, i] / r
    fp = footprints(trie, rows, d, r)
    order = np.lexsort((d, rows, fp, -score))
    return _near_tie_order(_cands(rows[order], d[order], r[order], score[order], fp[order]), limit)


def _reclaim(
    trie: Trie, act: np.ndarray, rc: np.ndarray, rcf: np.ndarray, acc: np.ndarray, theta: float, limit: int
) -> list[Candidate]:
    # Flat positions f = d·n + i of the (degree, row) hits, in np.nonzero's order; values by 1-D takes.
    n = act.size
    stuck = trie.active.stuck
    f = np.flatnonzero((rc > 0) & (acc < rcf * theta))
    if f.size:
        # Σ_C rc[z, C] = valid copies of z over all degrees: never the last one; stuck rows yield no victim.
        f = f[((rc.sum(axis=0) > 1) & ~stuck[act])[f % n]]
    if f.size == 0:
        return []
    score = acc.ravel()[f] / rcf.ravel()[f]  # access / r
    # Best first, in chunks (the `k` best remaining and ties at the cut, k doubling): only rows of a chunk
    # have their children looked at, and the stuck ones are marked and passed over, until `limit` are found.
    taken: list[np.ndarray] = []
    want, k = limit, limit
    while f.size and want > 0:
        if f.size > k:
            sel = score <= np.partition(score, k - 1)[k - 1]
            cf, cs, f, score = f[sel], score[sel], f[~sel], score[~sel]
        else:
            cf, cs, f, score = f, score, f[:0], score[:0]
        rows = act[cf % n]
        order = np.lexsort((cf // n, rows, -trie.depth[rows], cs))
        cf, rows = cf[order], rows[order]
        uniq = distinct(rows)
        free = _has_free_holder(trie, uniq)
        stuck[uniq[~free]] = True
        ok = np.flatnonzero(free[np.searchsorted(uniq, rows)])[:want]
        taken.append(cf[ok])
        want -= ok.size
        k *= 2
    f = np.concatenate(taken)
    d, i = np.divmod(f, n)
    score = acc.ravel()[f] / rcf.ravel()[f]
    r = rc.ravel()[f].astype(np.int64)
    return _cands(act[i], d, r, score, np.zeros(f.size, np.int64))


def _has_free_holder(trie: Trie, rows: np.ndarray) -> np.ndarray:
    """Per row of ``rows`` (distinct): some holder of z keeps no valid or pending mark on a child of z — a
    possible reclamation victim. All rows' sibling lists are walked together, one vector step per sibling
    rank; a row leaves the walk as soon as every holder was seen below it."""
    one = trie.words == 1
    free = trie.hold_col[0][rows] if one else trie.holders[rows]  # fancy indexing: copies
    c = trie.first_child[rows].astype(np.int64)
    live = free != 0 if one else (free != 0).any(axis=1)
    todo = np.flatnonzero((c != NONE) & live)
    nxt = trie.next_sib
    while todo.size:
        kid = c[todo]
        if one:
            free[todo] &= ~(trie.hold_col[0][kid] | trie.pend_col[0][kid])
            live = free[todo] != 0
        else:
            free[todo] &= ~(trie.holders[kid] | trie.pending[kid])
            live = (free[todo] != 0).any(axis=1)
        c[todo] = nxt[kid]
        todo = todo[(c[todo] != NONE) & live]
    return free != 0 if one else (free != 0).any(axis=1)


def _near_tie_order(ranked: list[Candidate], limit: int) -> list[Candidate]:
    """Regroup a list sorted by access/r (desc): a group starts at its best score and takes every following
    entry within NEAR_TIE of it; inside a group, smaller footprint first."""
    out: list[Candidate] = []
    i, n = 0, len(ranked)
    while i < n and len(out) < limit:
        lead = ranked[i].score
        j = i + 1
        while j < n and ranked[j].score >= lead * (1.0 - NEAR_TIE):
            j += 1
        out.extend(sorted(ranked[i:j], key=lambda c: (c.footprint, -c.score, c.row, c.dix)))
        i = j
    return out[:limit]
