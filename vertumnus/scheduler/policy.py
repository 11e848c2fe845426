"""Routing policies: the seam where Vertumnus' placement cost and the simulator's baselines plug in.

A policy sees only the *eligible* workers of a request (ACTIVE, long enough, enough free KV capacity — the
scheduler filters; a policy never has to) and returns the id of one of them. The default policy is the
placement cost of DESIGN.md §1::

    J_{i,w} = q_w(t_i) + β·Ê_{i,w} + λ·Ê_{i,w}·(C_w − C_min)/C_min

argmin, ties to the lower degree, then the shorter queue, then the lower worker id. The scheduler recognises
:class:`PlacementCostPolicy` at construction and evaluates it vectorised over all workers instead of
building :class:`WorkerView` objects; :meth:`PlacementCostPolicy.choose` is the same rule over views (used by
tests and by anyone composing policies).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from vertumnus.types import PrefixMatch, Request, WorkerState


@dataclass(slots=True, frozen=True)
class WorkerView:
    """What a routing policy may know about one eligible worker at the request's arrival.

    ``queue_s``: q_w(now), outstanding predicted work in seconds (running request: remaining part only).
    ``outstanding_blocks``: uncached prompt blocks of the requests queued or running there.
    ``held_blocks``: leading blocks of this request the worker holds validly (the match, per worker).
    ``cached_tokens`` / ``predicted_s``: P_{i,w} and Ê_{i,w} as the scheduler computed them.
    ``free_blocks``: KV capacity not reserved by queued / running requests.
    """

    worker_id: int
    degree: int
    node: int
    state: WorkerState
    queue_s: float
    outstanding_blocks: int
    free_blocks: int
    held_blocks: int
    cached_tokens: int
    predicted_s: float


@runtime_checkable
class RoutingPolicy(Protocol):
    """Chooses a worker for a request among eligible candidates (never empty when called)."""

    def choose(self, request: Request, match: PrefixMatch, candidates: Sequence[WorkerView], now: float) -> int:
        """Return the ``worker_id`` of one of ``candidates``."""
        ...


class PlacementCostPolicy:
    """Vertumnus' cache- and load-aware placement cost J (the default policy)."""

    __slots__ = ("beta", "lam")

    def __init__(self, beta: float = 1.0, lam: float = 0.0) -> None:
        if beta < 1.0 or lam < 0.0:
            raise ValueError(f"placement cost needs beta ≥ 1 and lam ≥ 0 (got beta={beta}, lam={lam})")
        self.beta = beta
        self.lam = lam

    def cost(self, view: WorkerView, c_min: int) -> float:
        """J for one candidate given the smallest eligible degree."""
        return view.queue_s + view.predicted_s * (self.beta + self.lam * (view.degree - c_min) / c_min)

    def choose(self, request: Request, match: PrefixMatch, candidates: Sequence[WorkerView], now: float) -> int:
        """argmin J; ties: lower degree, then shorter queue, then lower worker id.

        The queue before the id: two queues an ulp apart can round to the same J (a sum of reservations less
        the running part against the same sum reached another way), and the vectorised path picks the least
        queue of a degree without evaluating J for the rest; this rule is what both paths compute."""
        c_min = min(v.degree for v in candidates)
        best = min(candidates, key=lambda v: (self.cost(v, c_min), v.degree, v.queue_s, v.worker_id))
        return best.worker_id
