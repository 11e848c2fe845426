"""Control-plane benchmark: placement latency, replay throughput, trie scan cost and memory per node.

- ``placement``: the real pool (scheduler + cache manager + controller) over N workers (half CP8, half CP4)
  and a trie pre-filled with 256-block prompts held by 1–3 workers each; times one ``pool.submit`` of a
  128K-token (256-block) prompt whose first half is a cached document — trie match, placement cost over all
  workers, reservation, access / missed statistics, reconcile check, pin — then completes it (untimed).
- ``replay``: a Mooncake trace through the whole control plane (submit, completions, cache reports, windows,
  scans, reconfigurations) on 40 GPUs of CP4 / CP8 over :class:`~vertumnus.engines.sim.instant.InstantDataPlane`,
  one thread; requests per wall-clock second of the event loop (trace loading excluded).
- ``scan_ms`` / ``bytes_per_trie_node``: the cache manager's own measurements (:mod:`vertumnus.bench.trie`).

Figures depend on the machine; the CLI prints them, tests never assert on them.
"""

from __future__ import annotations

import gc
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from vertumnus.cache.block_keys import keys_from_hash_ids
from vertumnus.config import REPO_ROOT, VertumnusConfig, config_from_dict, format_composition
from vertumnus.controller.initial import TRACE_BLOCK_TOKENS, read_trace_lengths
from vertumnus.controller.predictive import Verdict
from vertumnus.cost_model import CostModel
from vertumnus.engines.sim.events import EventKind, EventLoop
from vertumnus.engines.sim.instant import InstantDataPlane, on_event_loop
from vertumnus.interfaces import PrefillJob
from vertumnus.pool import PrefillPool
from vertumnus.types import CacheReport, CacheReportKind, PrefillResult, Request

DEFAULT_TRACE = REPO_ROOT.parent / "shared" / "traces" / "conversation_first15min.jsonl"
PROMPT_BLOCKS = 256  # 128K tokens of 512-token blocks


@dataclass(slots=True)
class PlacementFigures:
    workers: int
    trie_nodes: int
    samples: int
    p50_us: float
    p99_us: float
    mean_us: float
    cpu_p50_us: float  # the same placements in thread CPU time (robust to a contended machine)
    cpu_p99_us: float


@dataclass(slots=True)
class ReplayFigures:
    requests: int
    completed: int
    wall_s: float
    requests_per_s: float
    cpu_s: float  # process CPU time of the same loop
    requests_per_cpu_s: float
    events: int
    reconfigurations: int
    cache_ops: int
    composition_start: str
    composition_end: str


def _bench_config(nodes: int, composition: str | None, controller: bool) -> VertumnusConfig:
    return config_from_dict(
        {
            "pool": {"nodes": nodes, "gpus_per_node": 8, "degrees": [4, 8], "max_model_len": 262144,
                     "kv_capacity_blocks_per_rank": 1024, "initial_composition": composition},
            "controller": {"enabled": controller},
        }
    )  # fmt: skip


class _NullPlane:
    """Accepts everything, does nothing (the placement benchmark completes jobs itself)."""

    def start(self, groups: Any, epoch: int, events: Any) -> None:
        self.groups = list(groups)

    def submit(self, worker_id: int, job: Any) -> None: ...

    def withdraw(self, worker_id: int) -> list[Any]:
        return []

    def park(self, worker_ids: Any) -> None: ...

    def activate(self, plan: Any) -> None: ...

    def execute(self, op: Any) -> None: ...

    def restart(self, group: Any, epoch: int) -> None: ...

    def close(self) -> None: ...


def measure_placement(
    cost: CostModel, workers: int = 64, documents: int = 512, samples: int = 3000, seed: int = 0
) -> PlacementFigures:
    """p50 / p99 of one 128K-token placement on ``workers`` workers (see the module docstring)."""
    if workers < 2:
        raise ValueError("--workers must be at least 2")
    n8 = workers // 2
    n4 = workers - n8
    if n4 % 2:
        n8, n4 = n8 + 1, n4 - 1
    comp = format_composition({8: n8, 4: n4})
    cfg = _bench_config(n8 + n4 // 2, comp, controller=False)
    plane = _NullPlane()
    now = [0.0]
    pool = PrefillPool(cfg, cost, plane, lambda: now[0])  # type: ignore[arg-type]
    pool.start()
    ids = [g.worker_id for g in plane.groups]
    for g in plane.groups:
        for r in g.ranks:
            pool.epoch_ack(g.worker_id, r, 1, 0.0)
    rng = random.Random(seed)
    docs = [keys_from_hash_ids([d * 1_000_000 + b for b in range(PROMPT_BLOCKS)]) for d in range(documents)]
    for keys in docs:  # each document cached (whole) at 1-3 workers
        for wid in rng.sample(ids, rng.randint(1, 3)):
            pool.cache_report(CacheReport(wid, CacheReportKind.STORED, keys, None))
    half = PROMPT_BLOCKS // 2
    warm = 200
    times = np.empty(samples, dtype=np.float64)
    cpu = np.empty(samples, dtype=np.float64)
    gc.collect()
    gc.freeze()
    for k in range(warm + samples):
        doc = docs[rng.randrange(documents)]
        keys = doc[:half] + keys_from_hash_ids([10**12 + k * PROMPT_BLOCKS + b for b in range(half)])
        req = Request(f"p{k}", now[0], PROMPT_BLOCKS * TRACE_BLOCK_TOKENS, keys)
        c0 = time.thread_time_ns()
        t0 = time.perf_counter_ns()
        placement = pool.submit(req)
        t1 = time.perf_counter_ns()
        c1 = time.thread_time_ns()
        assert placement is not None
        if k >= warm:
            times[k - warm] = (t1 - t0) / 1000.0
            cpu[k - warm] = (c1 - c0) / 1000.0
        pool.prefill_started(placement.worker_id, req.request_id, now[0])
        pool.prefill_done(PrefillResult(req.request_id, placement.worker_id, placement.cached_tokens, 0.0, 0.0))
    gc.unfreeze()
    nodes = int(pool.cache.stats()["nodes"])
    return PlacementFigures(
        workers, nodes, samples, float(np.percentile(times, 50)), float(np.percentile(times, 99)),
        float(times.mean()), float(np.percentile(cpu, 50)), float(np.percentile(cpu, 99)),
    )  # fmt: skip


def load_trace_requests(path: str | Path) -> list[Request]:
    """Requests of a Mooncake trace (full-block keys), arrival times relative to the first request."""
    ts, lens, keys = read_trace_lengths(path)
    t0 = float(ts.min())
    return [Request(f"t{i}", float(ts[i]) - t0, int(lens[i]), keys[i]) for i in range(len(lens))]


def _predicted_s(job: PrefillJob) -> float:
    """A replayed prefill takes exactly what the scheduler predicted for it."""
    return job.placement.predicted_s


def measure_replay(
    cost: CostModel, trace: str | Path = DEFAULT_TRACE, switch_s: float = 0.8, cfg: VertumnusConfig | None = None
) -> ReplayFigures:
    """Replay a trace through the whole control plane on 40 GPUs (5 nodes × 8, CP4 / CP8; controller on; the
    trace itself is the history for the initial composition). ``cfg`` replaces that pool configuration."""
    p = Path(trace)
    if not p.exists():
        raise ValueError(f"trace not found: {p} (pass --trace FILE)")
    requests = load_trace_requests(p)
    if cfg is None:
        cfg = _bench_config(5, None, controller=True)
        cfg.pool.history_trace = str(p)
    heap = EventLoop()
    plane = InstantDataPlane(heap.clock, cfg.pool.gpus_per_node, schedule=on_event_loop(heap),
                             prefill_s=_predicted_s, switch_s=switch_s)  # fmt: skip
    pool = PrefillPool(cfg, cost, plane, heap.clock)
    pool.start()
    start_comp = format_composition(pool.lattice.composition())
    ops = [0]

    class _Count:
        def request_done(self, *a: Any) -> None: ...

        def reconfig_done(self, *a: Any) -> None: ...

        def cache_op_done(self, *a: Any) -> None:
            ops[0] += 1

    pool.add_listener(_Count())
    arrivals = iter(requests)

    def arrive(req: Request) -> None:
        pool.submit(req)
        nxt = next(arrivals, None)
        if nxt is not None:
            heap.push(nxt.arrival_s, EventKind.ARRIVAL, arrive, nxt)

    timer_at = [float("inf")]

    def timer() -> None:
        pool.on_timer(heap.now)
        timer_at[0] = float("inf")

    first = next(arrivals)
    heap.push(first.arrival_s, EventKind.ARRIVAL, arrive, first)
    horizon = requests[-1].arrival_s + 3600.0  # guard: never spin on timers for requests that cannot finish
    gc.collect()
    c0 = time.process_time()
    t0 = time.perf_counter()
    while True:
        nt = pool.next_timer()
        pending = len(requests) - plane.completed
        if nt < timer_at[0] and pending > 0 and nt < horizon:
            timer_at[0] = nt = max(nt, heap.now)
            heap.push(nt, EventKind.TIMER, timer)
        if not heap.step():
            break
    wall = time.perf_counter() - t0
    cpu = time.process_time() - c0
    return ReplayFigures(
        len(requests), plane.completed, wall, len(requests) / wall, cpu, len(requests) / cpu, heap.popped,
        len(pool.epochs.records), ops[0],
        start_comp, format_composition(pool.lattice.composition()),
    )  # fmt: skip


@dataclass(slots=True)
class DecisionFigures:
    workers: int
    forecast_requests: int
    queued_requests: int
    rules_ms_p50: float
    rules_ms_max: float
    predictive_ms_p50: float
    predictive_ms_max: float
    predictive_moves: int  # candidate moves scored per window


def _decision_times(
    cost: CostModel, policy: str, comp: str, nodes: int, rate_rps: float, windows: int
) -> tuple[list[float], PrefillPool, Verdict | None]:
    cfg = _bench_config(nodes, comp, controller=True)
    cc = cfg.controller
    cc.policy = policy  # type: ignore[assignment]
    cc.rules.persist_windows = 10**9
    cc.predictive.merge_persist_s = 10**9 * cc.window_s
    plane = _NullPlane()
    clock = [0.0]
    pool = PrefillPool(cfg, cost, plane, lambda: clock[0])  # type: ignore[arg-type]
    pool.start()
    for g in plane.groups:
        for r in g.ranks:
            pool.epoch_ack(g.worker_id, r, 1, 0.0)
    rng = random.Random(1)
    span = cc.predictive.span_s
    n = int(rate_rps * span)
    t0 = 1000.0
    for k in range(n):  # arrivals over the forecast span; all stay queued (the null plane never runs them)
        clock[0] = t0 - span + span * k / n
        keys = keys_from_hash_ids([10**9 + k * 200 + b for b in range(rng.randint(2, 128))])
        pool.submit(Request(f"d{k}", clock[0], len(keys) * TRACE_BLOCK_TOKENS, keys))
    ctl = pool.controller
    # The predictive verdict is computed but never acted on (taken as a deferred decision, then abandoned), so no
    # operation starts: each window decides anew on the same pool.
    ctl.defer_decisions = True
    verdict: Verdict | None = None
    times: list[float] = []
    for w in range(windows + 1):  # window 0 warms up (first calls into numpy paths), not timed
        clock[0] = t0 + w * cc.window_s
        ctl.timers.next_window_end = clock[0]
        c0 = time.thread_time()
        ctl.end_window(clock[0], lambda wid: pool.scheduler.queue_s(wid, clock[0]))
        if (job := ctl.take_pending()) is not None:
            verdict = ctl.decide(job)
            ctl.abandon(job)
        if w:
            times.append((time.thread_time() - c0) * 1000.0)
        # the same forecast every window: shift the logged arrivals with the clock
        if ctl.predictive is not None:
            log = ctl.predictive.log
            log.entries = type(log.entries)((t + cc.window_s, n_, p) for t, n_, p in log.entries)
    return times, pool, verdict


def measure_decision(cost: CostModel, workers: int = 64, rate_rps: float = 60.0, windows: int = 20) -> DecisionFigures:
    """Controller decision time (thread CPU) per window end on ``workers`` workers (half CP8, half CP4),
    rules and predictive, with ``rate_rps`` arrivals per second of 1K–64K tokens in the forecast span, every
    one of them still queued. No operation starts (rules: persistence out of reach; predictive: the verdict is
    computed, not acted on): each window decides anew."""
    n8 = workers // 2
    n4 = workers - n8
    if n4 % 2:
        n8, n4 = n8 + 1, n4 - 1
    comp = format_composition({8: n8, 4: n4})
    rules, _, _ = _decision_times(cost, "rules", comp, n8 + n4 // 2, rate_rps, windows)
    pred, pool, d = _decision_times(cost, "predictive", comp, n8 + n4 // 2, rate_rps, windows)
    log = pool.controller.predictive.log.entries if pool.controller.predictive else ()
    return DecisionFigures(
        workers, len(log), len(pool.scheduler.tickets), float(np.median(rules)),
        float(max(rules)), float(np.median(pred)), float(max(pred)), d.evaluated if d is not None else 0,
    )  # fmt: skip
