"""Cache-aware placement (DESIGN.md §1): eligibility, Ê, placement cost J, reservation, preferred degree.

One placement, for request i with L tokens and the trie's match:

1. eligible = ACTIVE ∧ L ≤ max_model_len ∧ free KV blocks ≥ ⌈L/B⌉ − held_w (the blocks of the prompt the
   worker does not already hold validly; the whole prompt must still fit its capacity). A cache miss never
   excludes;
2. P_w = min(held_w·B, L − 1), R_w = L − P_w, Ê_w = E_{C_w}(R_w, P_w) (CostModel.predict);
3. J_w = q_w(now) + Ê_w·(β + λ·(C_w − C_min)/C_min); argmin, ties to the lower C, then the shorter q_w, then the
   lower worker id
   (q_w for all workers is one vector expression; Ê is computed once per degree for the workers holding
   nothing of the prompt and once per holder — see ``_choose_fast``);
4. reserve Ê_w in q_w at once (so a concurrent arrival sees it), reserve the ⌈L/B⌉ − held_w KV blocks the
   worker must allocate (its held prefix is resident already);
5. C_pref = degree of argmin_w Ê_w·(β + λ·(C_w − C_min)/C_min) — J without q — for the cache statistics.

With a fetch offered (``PrefixMatch.fetch``, ``cache.policy: queue_aware``) a worker may also be priced with the
offered prefix copied in before its prefill; the placement then carries the copy as ``Placement.fetch`` (source:
an offered holder, same node first, then the same degree, then the shorter queue, then the lower id).

Admission (:meth:`Scheduler.check_admissible`: could any worker ever serve the request) is the caller's, once per
placement attempt; :meth:`Scheduler.place` assumes it. "Nothing schedulable right now" returns None (the pool keeps
the request in its backlog).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from vertumnus.config import VertumnusConfig
from vertumnus.cost_model import CostModel
from vertumnus.scheduler.admission import RequestRejected, admission_check
from vertumnus.scheduler.policy import PlacementCostPolicy, RoutingPolicy
from vertumnus.scheduler.table import Ticket, WorkerInfo, WorkerTable
from vertumnus.scheduler.views import choose as choose_by_views
from vertumnus.types import FetchOffer, FetchPlan, Placement, PrefixMatch, Request, WorkerState

__all__ = ["RequestRejected", "Scheduler"]

# How a candidate's Ê was priced: its valid prefix only, a pending prefix reconciled first, or a fetched prefix.
_HELD, _PENDING, _FETCHED = 0, 1, 2


@dataclass(slots=True)
class _Choice:
    """The chosen row and what placement needs from it."""

    row: int
    held: int  # blocks the worker holds validly (leading)
    cached: int  # P (with a fetch: the fetched prefix too)
    est: float  # Ê
    queue: float  # q_w(now)
    pref_degree: int
    priced: int = _HELD  # _HELD / _PENDING / _FETCHED: what ``cached`` counts beyond the valid prefix


class Scheduler:
    """Placement over a :class:`WorkerTable`. Callers serialise calls (no internal locking)."""

    def __init__(self, cfg: VertumnusConfig, cost: CostModel, router: RoutingPolicy | None = None) -> None:
        self.cost = cost
        self.block_tokens = cfg.cache.block_tokens
        self.max_model_len = cfg.pool.max_model_len
        self.kv_per_rank = cfg.pool.kv_capacity_blocks_per_rank
        # seconds per pending block to reconcile (from the sibling, same node), None: pending is not priced
        cc = cfg.cache
        self.pending_block_s = cc.bytes_per_block / (cc.intra_node_gbps * 1e9) if cc.price_pending else None
        self.beta = cfg.scheduler.beta
        self.lam = cfg.scheduler.lam
        self.table = WorkerTable()
        self.tickets: dict[str, Ticket] = {}
        self.router: RoutingPolicy = router or PlacementCostPolicy(self.beta, self.lam)
        # Chosen once: the default J runs on the columns directly; other policies see WorkerViews.
        self._vectorised = type(self.router) is PlacementCostPolicy
        if isinstance(self.router, PlacementCostPolicy):  # its β, λ rule placement and C_pref
            self.beta, self.lam = self.router.beta, self.router.lam
        self._slices: list[tuple[int, int, int]] = []  # (degree, lo, hi) row ranges
        self._ids: list[int] = []
        self._degs: list[int] = []
        self._max_capacity = 0
        for c in sorted(set(cfg.pool.degrees)):
            cost.predict(c, 1, 0)  # fail at construction, not at the first request, if a degree is missing

    # -- workers ------------------------------------------------------------------------------------------
    def add_worker(self, worker_id: int, degree: int, node: int, state: WorkerState, epoch: int) -> None:
        """Register a worker (capacity = kv_capacity_blocks_per_rank × degree)."""
        cap = self.kv_per_rank * degree
        self.table.add(WorkerInfo(worker_id, degree, node, cap, epoch), state)
        self._reindex()

    def remove_worker(self, worker_id: int) -> list[Ticket]:
        """Unregister a worker; returns tickets still attached to it (they stay known to the scheduler)."""
        info = self.table.remove(worker_id)
        self._reindex()
        return list(info.tickets.values())

    def _reindex(self) -> None:
        self._ids = [inf.worker_id for inf in self.table.infos]  # row -> id / degree as Python lists
        self._degs = [inf.degree for inf in self.table.infos]
        deg = self.table.degree
        self._slices = []
        lo = 0
        while lo < len(deg):
            c = int(deg[lo])
            hi = int(np.searchsorted(deg, c, side="right"))
            self._slices.append((c, lo, hi))
            lo = hi
        self._max_capacity = max((inf.capacity_blocks for inf in self.table.infos), default=0)

    def set_state(self, worker_id: int, state: WorkerState) -> None:
        self.table.set_state(worker_id, state)

    def set_epoch(self, worker_id: int, epoch: int) -> None:
        self.table.info(worker_id).epoch = epoch

    def state(self, worker_id: int) -> WorkerState:
        return self.table.state_of(worker_id)

    def worker_ids(self) -> list[int]:
        return [inf.worker_id for inf in self.table.infos]

    def queue_s(self, worker_id: int, now: float) -> float:
        return self.table.queue_s(worker_id, now)

    def queue_map(self, now: float) -> dict[int, float]:
        """q_w(now) for every registered worker (cache scans, snapshots)."""
        q = self.table.queue_vector(now)
        return {inf.worker_id: float(q[i]) for i, inf in enumerate(self.table.infos)}

    def waiting_at(self, worker_id: int) -> int:
        """Requests placed at the worker and not started yet (0 for an unknown worker)."""
        if worker_id not in self.table.index:
            return 0
        return sum(not t.running for t in self.table.info(worker_id).tickets.values())

    def tickets_at(self, worker_id: int) -> list[Ticket]:
        """Queued and running tickets at a worker, FCFS order."""
        return list(self.table.info(worker_id).tickets.values())

    # -- requests -----------------------------------------------------------------------------------------
    def blocks_needed(self, request: Request) -> int:
        return -(-request.input_len // self.block_tokens)

    def check_admissible(self, request: Request) -> None:
        """Raise :class:`RequestRejected` if no worker of this pool could ever serve the request."""
        admission_check(request, self.max_model_len, self._max_capacity, self.block_tokens)

    def place(self, request: Request, match: PrefixMatch, now: float, first: bool = True) -> Placement | None:
        """Choose a worker and reserve; None when no worker is eligible right now.

        Precondition: the request is admissible (:meth:`check_admissible`, the caller's). ``first``: False for a
        re-placement (drain / failure), recorded on the ticket so window demand counts each request once.
        ``match.fetch`` = (V, s, q_max, sources): a worker with q_w ≤ q_max may copy the first V blocks from a
        valid holder at s seconds a block before its prefill (``cache.policy: queue_aware``): holding h < V
        blocks, it is priced at the better of E_C(L − hB, hB) and E_C(L − VB, VB) + (V − h)·s. q_max bounds how
        long the source must keep the blocks until the prefill starts. Placement-cost routing only.
        ``Placement.fetch`` is the copy when the chosen price counts blocks beyond the worker's valid prefix
        (fetched, or pending: then the cache runs it only if no reconcile brings them) and a source exists.
        """
        if request.request_id in self.tickets:
            raise ValueError(f"request {request.request_id!r} is already placed")
        t = self.table
        need = self.blocks_needed(request)
        if not self._ids:
            return None
        eligible = t.active & (t.free_blocks >= need)
        if match.held_blocks and not eligible.all():
            self._credit_holders(eligible, match, need)
        first_row = int(eligible.argmax())  # rows sorted by degree: the first eligible row has C_min
        if not eligible[first_row]:
            return None
        c_min = self._degs[first_row]
        if self._vectorised:
            ch = self._choose_fast(request.input_len, match, eligible, c_min, now)
        else:
            ch = self._choose_views(request, match, eligible, c_min, now)
        k = ch.row
        info = t.infos[k]
        placement = Placement(
            request_id=request.request_id,
            worker_id=info.worker_id,
            degree=info.degree,
            cached_tokens=ch.cached,
            uncached_tokens=request.input_len - ch.cached,
            predicted_s=ch.est,
            queue_s=ch.queue,
            cost=ch.queue + ch.est * self._factor(info.degree, c_min),
            preferred_degree=ch.pref_degree,
            epoch=info.epoch,
            fetch=self._fetch_plan(match.fetch, info, ch, now) if ch.priced != _HELD else None,
        )
        missing = need - min(ch.held, need)  # the held prefix is resident: only these blocks are allocated
        ticket = Ticket(request, placement, missing, missing, first_placement=first)
        t.reserve(ticket)
        self.tickets[request.request_id] = ticket
        return placement

    def _fetch_plan(self, offer: FetchOffer | None, dst: WorkerInfo, ch: _Choice, now: float) -> FetchPlan | None:
        """The copy of the offered prefix to ``dst`` (None: nothing offered, ``dst`` holds it, or no other holder).

        Source: an offered holder other than ``dst``, on the same node first, then of the same degree, then with
        the shorter queue, then the lower id. A source's q_w is the same before and after ``dst``'s reservation."""
        if offer is None or ch.held >= offer.blocks:
            return None
        t = self.table
        best: tuple[bool, bool, float, int] | None = None
        for wid in offer.sources:
            if wid == dst.worker_id:
                continue
            s = t.infos[t.index[wid]]
            key = (s.node != dst.node, s.degree != dst.degree, t.queue_s(wid, now), wid)
            if best is None or key < best:
                best = key
        return None if best is None else FetchPlan(best[3], offer.blocks)

    def _credit_holders(self, eligible: np.ndarray, match: PrefixMatch, need: int) -> None:
        """Make eligible (in place) the ACTIVE holders of the prompt's prefix that lack free KV for the whole
        prompt but have it for the blocks they do not hold; the prompt must still fit their capacity.

        Only the rows ``free < need`` can change, so callers skip this when every row is already eligible;
        the loop runs over the match's holders, never over all workers.
        """
        t = self.table
        index, infos = t.index, t.infos
        ev, act, free = eligible.data, t.active.data, t.free_blocks.data
        for wid, h in match.held_blocks.items():
            k = index.get(wid)
            if k is None or h <= 0 or ev[k] or not act[k]:
                continue
            if free[k] >= need - min(h, need) and infos[k].capacity_blocks >= need:
                ev[k] = True

    def _factor(self, degree: int, c_min: int) -> float:
        """β + λ·(C − C_min)/C_min (same operation order as the vectorised and view paths)."""
        return self.beta + self.lam * (degree - c_min) / c_min

    def _choose_fast(
        self,
        L: int,
        match: PrefixMatch,
        eligible: np.ndarray,
        c_min: int,
        now: float,
    ) -> _Choice:
        """argmin J without per-worker Ê for non-holders.

        A worker holding none of the prompt has Ê = E_C(L, 0), the same for its whole degree, so among the
        non-holders of a degree the one with the least q_w (lower id on ties) is the only candidate (J is monotone
        in q_w for one Ê, also in floating point, and the tie rule prefers the shorter queue); holders
        (few) are evaluated one by one. Result identical to the row-wise argmin with the (C, q_w, id) tie rule.
        With a fetch offered a non-holder's Ê depends on q_w (the copy overlaps the wait), and for a degree with a
        factor above 1 two more non-holders per degree are candidates (see the sketch below); the choice
        attains the least J of all eligible rows (to rounding: where the factor is exactly 1, J is flat in q_w
        up to the copy time in exact arithmetic and the shortest queue is taken).
        """
        t = self.table
        qm = t.queue_vector(now)  # a new array: masked in place below
        qv, ev = qm.data, eligible.data  # single rows as Python float / bool
        index = t.index
        holders: list[tuple[int, int, float]] = []  # eligible holders: (row, held blocks, q)
        for wid, h in match.held_blocks.items():
            k = index.get(wid)
            if k is not None and h > 0 and ev[k]:
                holders.append((k, h, qv[k]))
        pend = match.pending_blocks if self.pending_block_s is not None else None
        if pend:  # workers with a pending prefix longer than their valid one are evaluated like holders
            for wid, p in pend.items():
                k = index.get(wid)
                if k is not None and p > 0 and ev[k] and match.held_blocks.get(wid, 0) == 0:
                    holders.append((k, 0, qv[k]))
        qm[~eligible] = np.inf
        for k, _, _ in holders:
            qm[k] = np.inf  # evaluated individually below
        predict = self.cost.predict
        ids = self._ids
        B = self.block_tokens
        offer = match.fetch
        if offer is not None and offer.blocks > 0:
            fv, fs, fq = offer.blocks, offer.block_s, offer.max_queue_s
        else:
            fv, fs, fq = 0, 0.0, 0.0
        f_cached = min(fv * B, L - 1)
        # Candidates as (J, degree, q, worker id, row, held, P, Ê, priced): tuple order is the tie rule (rows are
        # distinct, so nothing after the row is ever compared).
        best: tuple[float, int, float, int, int, int, int, float, int] | None = None
        pref: tuple[float, int] | None = None  # (β·Ê + λ-term, degree)
        factors: dict[int, float] = {}
        copy_s = fv * fs
        for c, lo, hi in self._slices:
            f = factors[c] = self._factor(c, c_min)
            seg = qm[lo:hi]
            j = lo + int(seg.argmin())
            q_least = float(seg[j - lo])
            if q_least == np.inf:
                continue
            rows = [j]
            if fv and f > 1.0:
                # The fetch option's J = q + f·(E_f + max(0, copy − q)) charges the wait at 1 and the copy's
                # unhidden rest at f, so with f > 1 it falls while q < copy and rises after:
                #
                #   J ▲ ╲          ╱     slope 1 − f < 0 below the copy time, 1 above it
                #     │   ╲      ╱
                #     │     ╲  ╱
                #     └──────┴──────▶ q_w
                #          copy
                #
                # so besides the shortest queue (no fetch, or the fetch with q ≥ copy), the longest queue
                # ≤ min(copy, q_max) and the shortest in [copy, q_max] are the degree's only other candidates.
                # One pass over the degree's rows in Python: at tens of workers a degree it costs less than the
                # half-dozen numpy calls of masks and reductions would (masked rows are inf: in neither range).
                lim = min(copy_s, fq)
                if q_least < lim or q_least < copy_s <= fq:
                    kb, qb, ka, qa = -1, -np.inf, -1, np.inf
                    for k in range(lo, hi):
                        q = qv[k]
                        if q <= lim:
                            if q > qb:
                                kb, qb = k, q
                        elif copy_s <= q <= fq and q < qa:
                            ka, qa = k, q
                    rows += [k for k in (kb, ka) if k >= 0 and k != j]
            for j in rows:
                qj = float(qm[j])
                e, p, how = predict(c, L, 0), 0, _HELD
                if fv and qj <= fq:
                    e_f = predict(c, L - f_cached, f_cached) + max(0.0, copy_s - qj)
                    if e_f < e:
                        e, p, how = e_f, f_cached, _FETCHED
                cand = (qj + e * f, c, qj, ids[j], j, 0, p, e, how)
                if best is None or cand < best:
                    best = cand
                if pref is None or (e * f, c) < pref:
                    pref = (e * f, c)
        if holders:
            degs = self._degs
            for k, h, qk in holders:
                c = degs[k]
                f = factors[c]
                cached = min(h * B, L - 1)
                e = predict(c, L - cached, cached)
                how = _HELD
                p = pend.get(ids[k], 0) if pend else 0
                if p > h:  # reconcile the pending blocks before the prefill (an upper bound: some are present)
                    assert self.pending_block_s is not None
                    p_cached = min(p * B, L - 1)
                    e_p = predict(c, L - p_cached, p_cached) + max(0.0, (p - h) * self.pending_block_s - qk)
                    if e_p < e:
                        e, cached, how = e_p, p_cached, _PENDING
                if fv > h and qk <= fq:
                    e_f = predict(c, L - f_cached, f_cached) + max(0.0, (fv - h) * fs - qk)
                    if e_f < e:
                        e, cached, how = e_f, f_cached, _FETCHED
                cand = (qk + e * f, c, qk, ids[k], k, h, cached, e, how)
                if best is None or cand < best:
                    best = cand
                if pref is None or (e * f, c) < pref:
                    pref = (e * f, c)
        assert best is not None and pref is not None
        _, _, qk, _, row, held, cached, est, how = best
        return _Choice(row, held, cached, est, qk, pref[1], how)

    def _choose_views(
        self, request: Request, match: PrefixMatch, eligible: np.ndarray, c_min: int, now: float
    ) -> _Choice:
        """A custom routing policy's choice (:func:`vertumnus.scheduler.views.choose`)."""
        args = (self.table, self._slices, self.cost, self.router, self.block_tokens, self.beta, self.lam)
        return _Choice(*choose_by_views(*args, request, match, eligible, c_min, now))

    def started(self, request_id: str, worker_id: int, now: float) -> bool:
        """The engine began the prefill; False if the report is stale (request re-placed or unknown)."""
        ticket = self.tickets.get(request_id)
        if ticket is None or ticket.worker_id != worker_id:
            return False
        self.table.start(ticket, now)
        return True

    def release(self, request_id: str) -> Ticket:
        """Remove a request (done, withdrawn, or re-placed next) and free its reservation."""
        ticket = self.tickets.pop(request_id)
        self.table.release(ticket)
        return ticket

    def ticket(self, request_id: str) -> Ticket | None:
        return self.tickets.get(request_id)

    def __iter__(self) -> Iterator[WorkerInfo]:
        return iter(self.table.infos)
