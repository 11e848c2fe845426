"""The prescient start: the start composition moved to a known target at once, then held.

A reference for the out-of-sample protocol (:mod:`vertumnus.eval.evaluate`), not a policy. A controller that
starts on the wrong composition and *converges* to the best fixed one pays the way there: the sources drain,
their GPUs sit idle through the switch, their caches are reconciled away, and at a load near capacity the backlog
built meanwhile lasts long after. The prescient start knows at t = 0 which composition will be best over the
whole run (hindsight) and begins every operation towards it as soon as the workers are up, with the pool's own
epoch protocol (the same drain, switch and reconciliation as the controller's moves); afterwards nothing moves.
Its mean TTFT above the best fixed composition's is what no controller that converges to that composition can
avoid; only one that beats the best fixed composition after converging can end below it.

Geometry: a split of a degree-C worker is useful while the composition (in-flight targets counted, their sources
not) has more degree-C workers than the target and fewer GPUs below degree C; a merge of two degree-C siblings
while it has more degree-C workers than the target and fewer GPUs above degree C. Every useful operation whose
sources are ACTIVE begins at once (disjoint blocks run concurrently); a lattice of more than two degrees reaches
its target over several rounds (a CP8 split into CP4s whose halves are split again when they are up).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING

from vertumnus.config import format_composition
from vertumnus.controller.lattice import LatticeOp
from vertumnus.engines.sim.events import EventKind
from vertumnus.pool import PrefillPool
from vertumnus.types import ReconfigKind, WorkerState

if TYPE_CHECKING:
    from vertumnus.sim.runner import Simulation


@dataclass(slots=True)
class PrescientSteer:
    """Steers a pool from its start composition to ``target`` (degree → workers) once, then leaves it alone.

    Called by the simulation after every event (as a :class:`~vertumnus.sim.runner.Simulation` hook, which also
    runs an event at ``at_s``) until :attr:`done`; no operation begins before ``at_s`` (0: as soon as the workers
    are up; later: the route a controller deciding then would take).
    :attr:`began` counts the operations it started."""

    target: dict[int, int]
    at_s: float = 0.0
    done: bool = False
    began: int = 0
    hooked: bool = False  # the simulation called it once (as a hook)

    def hook(self, sim: Simulation) -> None:
        """The simulation hook: first call (before the first event) schedules an event at ``at_s`` (the steer
        runs then, arrival or not); every call steers until done."""
        if not self.hooked:
            self.hooked = True
            if self.at_s > 0:
                sim.loop.push(self.at_s, EventKind.ENGINE, lambda: None)
        elif self.done:
            return
        self(sim.pool, sim.loop.now)

    def __post_init__(self) -> None:
        self.target = {d: n for d, n in sorted(self.target.items()) if n}

    def __call__(self, pool: PrefillPool, now: float) -> None:
        if self.done or now < self.at_s:
            return
        ep = pool.epochs
        if not ep.inflight and self._effective(pool) == self.target:
            self.done = True
            return
        while (op := self._next_op(pool)) is not None:
            drain = max(pool.scheduler.queue_s(s.worker_id, now) for s in op.sources)
            ep.begin(ep.next_plan(op, drain), now)
            self.began += 1
        if not ep.inflight and self._effective(pool) != self.target and not self._waiting(pool):
            raise ValueError(
                f"the prescient start cannot reach {format_composition(self.target)} from "
                f"{format_composition(self._effective(pool))} in this lattice"
            )

    def _effective(self, pool: PrefillPool) -> dict[int, int]:
        """The composition once the plans in flight commit: their targets in, their sources out."""
        leaving = {s.worker_id for r in pool.epochs.inflight for s in r.plan.sources}
        eff = Counter(g.degree for wid, g in pool.lattice.groups.items() if wid not in leaving)
        eff.update(t.degree for r in pool.epochs.inflight for t in r.plan.targets)
        return {d: n for d, n in sorted(eff.items()) if n}

    def _waiting(self, pool: PrefillPool) -> bool:
        """Some worker is not ACTIVE yet (the pool is coming up): its operation begins later."""
        return any(pool.scheduler.state(wid) != WorkerState.ACTIVE for wid in pool.lattice.groups)

    def _next_op(self, pool: PrefillPool) -> LatticeOp | None:
        """A useful operation on ACTIVE workers outside every plan in flight (fresh target ids each call)."""
        eff = self._effective(pool)
        busy = pool.epochs.busy_workers()
        for kind in (ReconfigKind.SPLIT, ReconfigKind.MERGE):
            for op in pool.lattice.ops(kind):
                c = op.sources[0].degree
                if eff.get(c, 0) <= self.target.get(c, 0):
                    continue
                below = kind == ReconfigKind.SPLIT  # a split adds GPUs below degree c, a merge above it
                if _gpus(eff, c, below) >= _gpus(self.target, c, below):
                    continue
                if any(s.worker_id in busy or pool.scheduler.state(s.worker_id) != WorkerState.ACTIVE
                       for s in op.sources):  # fmt: skip
                    continue
                return op
        return None


def _gpus(composition: dict[int, int], degree: int, below: bool) -> int:
    """GPUs in the workers of a degree below (``below``) or above ``degree``."""
    return sum(d * n for d, n in composition.items() if (d < degree if below else d > degree))
