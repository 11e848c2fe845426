"""Baseline routing policies for fixed compositions, behind the scheduler's ``RoutingPolicy`` protocol.

All of them see the same eligible candidates (:class:`~vertumnus.scheduler.policy.WorkerView`) and the same trie
match as Vertumnus' own placement cost, in the same simulator with the same cost model (DESIGN.md §6). Ties break
towards the lower worker id so every choice is deterministic.
"""

from __future__ import annotations

from collections.abc import Sequence

from vertumnus.scheduler.policy import WorkerView
from vertumnus.types import Placement, PrefillResult, PrefixMatch, Request


class RoundRobinPolicy:
    """Cycle through the candidates in worker-id order, ignoring load and cache."""

    __slots__ = ("_next",)

    def __init__(self) -> None:
        self._next = 0

    def choose(self, request: Request, match: PrefixMatch, candidates: Sequence[WorkerView], now: float) -> int:
        ids = sorted(v.worker_id for v in candidates)
        wid = ids[self._next % len(ids)]
        self._next += 1
        return wid


class LeastWorkPolicy:
    """Least outstanding work: argmin q_w (seconds), ignoring the cache."""

    __slots__ = ()

    def choose(self, request: Request, match: PrefixMatch, candidates: Sequence[WorkerView], now: float) -> int:
        return min(candidates, key=lambda v: (v.queue_s, v.worker_id)).worker_id


class LengthThresholdPolicy:
    """Long requests (> ``threshold_tokens``) go to the largest degree, short ones to the smaller degrees;
    least outstanding work within the chosen class (all candidates if the class is empty)."""

    __slots__ = ("threshold_tokens",)

    def __init__(self, threshold_tokens: int) -> None:
        self.threshold_tokens = threshold_tokens

    def choose(self, request: Request, match: PrefixMatch, candidates: Sequence[WorkerView], now: float) -> int:
        top = max(v.degree for v in candidates)
        if request.input_len > self.threshold_tokens:
            pool = [v for v in candidates if v.degree == top]
        else:
            pool = [v for v in candidates if v.degree < top] or list(candidates)
        return min(pool, key=lambda v: (v.queue_s, v.worker_id)).worker_id


class SGLangCacheAwarePolicy:
    """SGLang router's cache-aware policy, over the same trie the other policies see.

    Load = number of requests routed to a worker and not finished yet (the SGLang router's own counter; the
    simulator registers this policy as a pool listener so completions decrement it). The system is *imbalanced*
    when ``max − min > balance_abs_threshold`` and ``max > balance_rel_threshold × min`` over the candidates;
    then the least-loaded worker wins. Otherwise, if the best match ratio (held prefix tokens / input tokens)
    is ≥ ``cache_threshold`` the best-matching worker wins (ties: lower load), else the least-loaded worker.
    Defaults mirror sglang-router: cache_threshold 0.5, balance_abs_threshold 32 (requests),
    balance_rel_threshold 1.0001.
    """

    __slots__ = ("_load", "_where", "balance_abs", "balance_rel", "block_tokens", "cache_threshold")

    def __init__(
        self,
        block_tokens: int,
        cache_threshold: float = 0.5,
        balance_abs_threshold: int = 32,
        balance_rel_threshold: float = 1.0001,
    ) -> None:
        self.block_tokens = block_tokens
        self.cache_threshold = cache_threshold
        self.balance_abs = balance_abs_threshold
        self.balance_rel = balance_rel_threshold
        self._load: dict[int, int] = {}
        self._where: dict[str, int] = {}  # request id -> worker it was routed to (re-placement moves it)

    def load(self, worker_id: int) -> int:
        """Requests routed to ``worker_id`` and not finished."""
        return self._load.get(worker_id, 0)

    def choose(self, request: Request, match: PrefixMatch, candidates: Sequence[WorkerView], now: float) -> int:
        load = self._load
        loads = [load.get(v.worker_id, 0) for v in candidates]
        hi, lo = max(loads), min(loads)
        by_load = min(candidates, key=lambda v: (load.get(v.worker_id, 0), v.worker_id))
        if hi - lo > self.balance_abs and hi > self.balance_rel * lo:
            wid = by_load.worker_id
        else:
            best = min(candidates, key=lambda v: (-v.held_blocks, load.get(v.worker_id, 0), v.worker_id))
            ratio = min(best.held_blocks * self.block_tokens, request.input_len) / request.input_len
            wid = best.worker_id if ratio >= self.cache_threshold else by_load.worker_id
        self._route(request.request_id, wid)
        return wid

    def _route(self, request_id: str, wid: int) -> None:
        old = self._where.get(request_id)
        if old is not None:
            self._load[old] -= 1
        self._where[request_id] = wid
        self._load[wid] = self._load.get(wid, 0) + 1

    # PoolListener: only completions matter to the counter.
    def request_done(self, request: Request, placement: Placement | None, result: PrefillResult | None) -> None:
        wid = self._where.pop(request.request_id, None)
        if wid is not None:
            self._load[wid] -= 1

    def reconfig_done(self, *args: object) -> None:
        """Fixed compositions: nothing to do."""

    def cache_op_done(self, *args: object) -> None:
        """Not used by this policy."""


class DynamoKVPolicy:
    """Dynamo KV router with unit weights: cost = uncached prompt blocks + outstanding prefill blocks."""

    __slots__ = ("block_tokens",)

    def __init__(self, block_tokens: int) -> None:
        self.block_tokens = block_tokens

    def choose(self, request: Request, match: PrefixMatch, candidates: Sequence[WorkerView], now: float) -> int:
        total = -(-request.input_len // self.block_tokens)  # prompt blocks, partial last block included
        return min(candidates, key=lambda v: (total - v.held_blocks + v.outstanding_blocks, v.worker_id)).worker_id
