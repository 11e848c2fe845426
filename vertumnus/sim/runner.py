"""Run one policy on one workload: the event loop drives the very same :class:`~vertumnus.pool.PrefillPool`
the server runs, over a :class:`~vertumnus.engines.sim.SimDataPlane`.

Event flow: arrivals are pushed one at a time (the heap stays small); an arrival calls ``pool.submit``; the data
plane's callbacks are ENGINE events; the pool's timers (window ends, cache scans) are TIMER events scheduled at
``pool.next_timer()``, re-read after every event. The run ends when every request finished or was rejected
(or, with requests stuck, ``drain_limit_s`` after the last arrival).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from vertumnus.config import VertumnusConfig, format_composition
from vertumnus.controller.forecast import Forecaster
from vertumnus.controller.initial import History, summarize_history
from vertumnus.cost_model import CostModel
from vertumnus.engines.sim import SimDataPlane, SimStats
from vertumnus.engines.sim.events import EventKind, EventLoop
from vertumnus.pool import PrefillPool
from vertumnus.scheduler.scheduler import RequestRejected
from vertumnus.sim.baselines import SGLangCacheAwarePolicy
from vertumnus.sim.lower_bound import lower_bound
from vertumnus.sim.metrics import Collector, ReconfigRecord, summarize
from vertumnus.sim.policies import LOWER_BOUND, configure
from vertumnus.types import Request

# Called once before the first event and after every event (a steer, a decision delay, a probe).
SimHook = Callable[["Simulation"], None]
# Builds the forecaster the predictive controller uses instead of its own (e.g. the clairvoyant reference).
ForecasterFactory = Callable[["Simulation"], Forecaster]


@dataclass(slots=True)
class DecisionDelay:
    """A hook that computes the predictive controller's decisions off the pool, as the server does, and acts on
    each ``delay_s`` virtual seconds after its snapshot (the result a thread would compute from it)."""

    delay_s: float

    def __post_init__(self) -> None:
        if self.delay_s < 0:
            raise ValueError(f"decision delay must be ≥ 0 s, got {self.delay_s}")

    def __call__(self, sim: Simulation) -> None:
        ctl = sim.pool.controller
        ctl.defer_decisions = True
        if ctl.pending is None:
            return
        job = ctl.take_pending()
        assert job is not None
        verdict = ctl.decide(job)
        sim.loop.push(sim.loop.now + self.delay_s, EventKind.ENGINE, lambda: ctl.finish(job, verdict, sim.loop.now))


@dataclass(slots=True)
class RunResult:
    """Everything a report needs from one run."""

    policy: str
    summary: dict[str, Any]
    collector: Collector
    composition: list[tuple[float, dict[int, int]]]
    reconfigs: list[ReconfigRecord] = field(default_factory=list)
    stats: SimStats | None = None

    @property
    def arrays(self) -> dict[str, np.ndarray]:
        return self.collector.arrays()


def workload_history(requests: Sequence[Request], cfg: VertumnusConfig, cost: CostModel) -> History:
    """The simulated workload as its own history (initial composition when none is configured)."""
    c = cfg
    return summarize_history(
        np.array([r.arrival_s for r in requests]), np.array([r.input_len for r in requests], dtype=np.int64),
        [r.block_keys for r in requests], cost, c.pool.degrees, c.controller.window_s,
        c.controller.rules.long_threshold_tokens, c.cache.block_tokens, c.scheduler.beta, c.scheduler.lam,
    )  # fmt: skip


class Simulation:
    """One run: event loop + sim data plane + pool + collector."""

    def __init__(
        self,
        requests: Sequence[Request],
        cfg: VertumnusConfig,
        cost: CostModel,
        policy: str = "vertumnus",
        composition: str | None = None,
        drain_limit_s: float = 3600.0,
        forecaster: ForecasterFactory | None = None,
        hooks: Sequence[SimHook] = (),
    ) -> None:
        """``forecaster``: builds (from this simulation) the forecaster the predictive controller uses instead of
        its own (:meth:`~vertumnus.controller.controller.Controller.use_forecaster`; the idle-gap jump is off then,
        such a forecast may see the next arrival coming). ``hooks``: each called once before the first event and
        after every event (e.g. :class:`DecisionDelay`, the evaluation's prescient steer)."""
        self.requests = sorted(requests, key=lambda r: r.arrival_s)  # stable: equal times keep input order
        self.policy = policy
        self.cfg, router = configure(policy, cfg, composition)
        self.cost = cost
        self.loop = EventLoop()
        self.data_plane = SimDataPlane(self.cfg, cost, self.loop)
        history = None
        if not self.cfg.pool.initial_composition and not self.cfg.pool.history_trace:
            history = workload_history(self.requests, self.cfg, cost)
        self.pool = PrefillPool(self.cfg, cost, self.data_plane, self.loop.clock, router=router, history=history)
        self.collector = Collector(self.cfg.slo.t_ext_s, self.loop.clock)
        self.collector.expect(self.requests)
        self.pool.add_listener(self.collector)
        self.hooks = tuple(hooks)
        self.forecast_injected = forecaster is not None
        if forecaster is not None:
            self.pool.controller.use_forecaster(forecaster(self))
        if isinstance(router, SGLangCacheAwarePolicy):
            self.pool.add_listener(router)  # its in-flight request counters follow completions
        last = self.requests[-1].arrival_s if self.requests else 0.0
        self.end_limit = last + drain_limit_s
        self._next = 0
        self._timer_at = math.inf
        # Idle-gap jump (see _idle_tick): one timer period runs every kind of tick at least once; the predictive
        # forecast stops changing once the last arrival is older than its spans.
        ctl = self.pool.controller
        periods = [ctl.window_s, self.cfg.cache.scan_interval_s]
        settle = 0.0
        if ctl.params is not None:
            periods.append(ctl.params.check_interval_s or 0.0)
            settle = max(ctl.params.span_s, ctl.params.burst_span_s)
        self._idle_period = max(periods)
        self._idle_settle_s = settle
        self._idle_state: tuple[object, ...] | None = None
        self._idle_activity = (-1, -1)  # engine events and arrivals run by the last idle tick
        self._idle_since = 0.0
        self._last_arrival = -math.inf
        self.idle_windows_skipped = 0

    # -- events -----------------------------------------------------------------------------------------------
    def _push_arrival(self) -> None:
        if self._next < len(self.requests):
            r = self.requests[self._next]
            self._next += 1
            self.loop.push(r.arrival_s, EventKind.ARRIVAL, self._arrive, r)

    def _arrive(self, request: Request) -> None:
        self._last_arrival = request.arrival_s
        self._push_arrival()
        try:
            self.pool.submit(request)
        except RequestRejected:
            self.collector.rejected(request)

    def _timer(self) -> None:
        if self.loop.now >= self._timer_at:
            self._timer_at = math.inf
        self.pool.on_timer(self.loop.now)
        self._idle_tick()

    def _arm_timer(self) -> None:
        nt = self.pool.next_timer()
        if nt < self._timer_at:
            self._timer_at = max(nt, self.loop.now)
            self.loop.push(self._timer_at, EventKind.TIMER, self._timer)

    def _idle_tick(self) -> None:
        """Jump an idle gap in O(1) instead of walking it tick by tick (a trace with one arrival hours or
        years after the rest would otherwise run every window end and cache scan in between).

        Called after each timer tick. Idle: no engine event queued (no prefill, copy, park, ack or switch
        pending), so only timers and the next arrival remain. Once :meth:`PrefillPool.idle_state` has stayed
        equal through a whole timer period of idle ticks with nothing else run in between (every kind of tick
        ran once and changed nothing) and the forecast no longer depends on the time, every further tick before
        the next arrival is the same no-op: they are skipped. Results are those of the walk (up to float
        rounding of the window grid), only the skipped windows' reports are not kept.
        """
        loop = self.loop
        if loop.pending(EventKind.ENGINE) or self.forecast_injected or self.pool.controller.pending is not None:
            # (an injected forecast may see the next arrival coming: its ticks are not no-ops; a decision waiting
            # to be computed lands as an engine event)
            self._idle_state = None
            return
        now = loop.now
        activity = (loop.ran(EventKind.ENGINE), loop.ran(EventKind.ARRIVAL))
        state = self.pool.idle_state()
        if state != self._idle_state or activity != self._idle_activity:
            self._idle_state, self._idle_since, self._idle_activity = state, now, activity
            return
        if now - self._idle_since < self._idle_period or now < self._last_arrival + self._idle_settle_s:
            return
        # the one queued arrival (pushed one at a time); none: requests stuck, nothing left but the drain limit
        until = self.requests[self._next - 1].arrival_s if loop.pending(EventKind.ARRIVAL) else self.end_limit
        if until - now > 2 * self._idle_period:
            self.idle_windows_skipped += self.pool.skip_idle(until)

    # -- run ------------------------------------------------------------------------------------------------
    def run(self, progress: Callable[[int, int], None] | None = None) -> RunResult:
        """Simulate to the end; ``progress(done, total)`` is called every few hundred events."""
        wall0, cpu0 = time.perf_counter(), time.process_time()
        self.pool.start()
        snap = self.pool.snapshot()
        self.collector.set_workers({w.worker_id: w.degree for w in snap.workers}, self.loop.now)
        initial = snap.composition
        self._push_arrival()
        loop, col = self.loop, self.collector
        total = len(self.requests)
        for hook in self.hooks:
            hook(self)
        while loop.step():
            for hook in self.hooks:
                hook(self)
            self._arm_timer()
            if col.remaining == 0 and self._next >= total:
                break
            if loop.now > self.end_limit:
                break
            if progress is not None and loop.popped % 512 == 0:
                progress(total - col.remaining, total)
        wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
        if progress is not None:
            progress(total - col.remaining, total)
        self.data_plane.close()
        summary = self._summary(wall, cpu, initial)
        return RunResult(self.policy, summary, col, col.composition, col.reconfigs, self.data_plane.stats)

    def _summary(self, wall: float, cpu: float, initial: str) -> dict[str, Any]:
        col, stats = self.collector, self.data_plane.stats
        cache = self.pool.cache.stats()
        out: dict[str, Any] = {"policy": self.policy}
        out.update(summarize(col.arrays()))
        statuses = [r.status for r in col.records.values()]
        final: dict[int, int] = {}
        for c in col.degrees.values():
            final[c] = final.get(c, 0) + 1
        drains = [r.drain_s for r in col.reconfigs]
        switches = [r.switch_s for r in col.reconfigs]
        out.update(
            {
                "rejected": statuses.count("rejected"),
                "failed": statuses.count("failed"),
                "unfinished": statuses.count("pending"),
                "reconfigurations": len(col.reconfigs),
                "splits": sum(r.kind == "split" for r in col.reconfigs),
                "merges": sum(r.kind == "merge" for r in col.reconfigs),
                "mean_drain_s": float(np.mean(drains)) if drains else None,
                "max_drain_s": float(np.max(drains)) if drains else None,
                "mean_switch_s": float(np.mean(switches)) if switches else None,
                "replications": col.replications,
                # Ordered copies by kind (queue_aware): fetches run before the prefill of the request placed
                # with them; push copies come off a queued holder after a placement (cache/hot_copy.py).
                "fetch_copies": int(cache["fetch_ordered"]),
                "push_copies": int(cache["hot_ordered"]),
                "scan_copies": int(cache["replications_ordered"]),  # the periodic scan's (rules; inter-degree)
                "reclamations": col.reclamations,
                "reconciles": col.reconciles,
                "failed_cache_ops": col.failed_ops,
                "copied_blocks": stats.copied_blocks,
                "evicted_blocks": stats.evicted_blocks,
                "initial_composition": initial,
                "final_composition": format_composition(final),
                "sim_time_s": self.loop.now,
                "events": self.loop.popped,
                "sim_wall_s": wall,
                "sim_cpu_s": cpu,  # process CPU time: robust to other load on a shared machine
                "events_per_s": self.loop.popped / wall if wall > 0 else None,
            }
        )
        return out


def run_lower_bound(requests: Sequence[Request], cfg: VertumnusConfig, cost: CostModel) -> RunResult:
    """The zero-queue lower bound as a run result (no pool, no events)."""
    wall0 = time.perf_counter()
    col = Collector(cfg.slo.t_ext_s, lambda: 0.0)
    for rec in lower_bound(requests, cost, cfg.pool.degrees, cfg.cache.block_tokens, cfg.slo.t_ext_s):
        col.records[rec.request_id] = rec
    out: dict[str, Any] = {"policy": LOWER_BOUND}
    out.update(summarize(col.arrays()))
    out.update({"reconfigurations": 0, "replications": 0, "reclamations": 0})
    out["sim_wall_s"] = time.perf_counter() - wall0
    return RunResult(LOWER_BOUND, out, col, [])


def run_policy(
    requests: Sequence[Request],
    cfg: VertumnusConfig,
    cost: CostModel,
    policy: str,
    composition: str | None = None,
    progress: Callable[[int, int], None] | None = None,
    forecaster: ForecasterFactory | None = None,
    hooks: Sequence[SimHook] = (),
) -> RunResult:
    """Run ``policy`` (any name of :data:`~vertumnus.sim.policies.POLICIES`) on ``requests`` (``forecaster``,
    ``hooks``: see :class:`Simulation`)."""
    if policy == LOWER_BOUND:
        configure(policy, cfg, composition)
        return run_lower_bound(requests, cfg, cost)
    return Simulation(requests, cfg, cost, policy, composition, forecaster=forecaster, hooks=hooks).run(progress)
