"""Prometheus metrics of one server (names are stable; docs/metrics.md documents each).

Counters and histograms are updated as requests and pool events complete; pool-state gauges (workers by degree
and state, per-worker outstanding workload and cached blocks) are read from the pool's snapshot at scrape time
by a custom collector, so they are exact and never leave stale label sets behind. Each app owns its
``CollectorRegistry`` (several servers can live in one process, e.g. in benchmarks).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from vertumnus.types import WorkerState

disable_created_metrics()  # no *_created series: they double the exposition and nobody queries them

TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0)
FAST_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0)
RECONFIG_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
OUTCOMES = ("ok", "too_long", "invalid", "rate_limited", "rejected", "cancelled", "error")


@dataclass(slots=True)
class WorkerRow:
    """One worker as /v1/pool and the metrics show it."""

    worker_id: int
    engine: str
    degree: int
    node: int
    ranks: tuple[int, ...]
    state: str
    epoch: int
    queue_s: float
    cached_blocks: int
    queued: int = 0  # requests queued or running there
    running: str | None = None  # request id running now
    free_kv_blocks: int = 0

    def as_json(self) -> dict[str, object]:
        return {
            "id": self.worker_id,
            "engine": self.engine,
            "degree": self.degree,
            "node": self.node,
            "ranks": list(self.ranks),
            "state": self.state,
            "epoch": self.epoch,
            "outstanding_s": round(self.queue_s, 6),
            "cached_blocks": self.cached_blocks,
            "queued": self.queued,
            "running": self.running,
            "free_kv_blocks": self.free_kv_blocks,
        }


class _PoolCollector(Collector):
    """Reads the pool at scrape time."""

    def __init__(
        self, rows: Callable[[], Sequence[WorkerRow]], degrees: Sequence[int], rebalanced: Callable[[], int]
    ) -> None:
        self._rows = rows
        self._degrees = tuple(degrees)
        self._rebalanced = rebalanced

    def collect(self) -> Iterable[Metric]:
        rows = self._rows()
        workers = GaugeMetricFamily(
            "vertumnus_workers", "Prefill workers by CP degree and lifecycle state.", labels=["degree", "state"]
        )
        counts = {(d, s.name.lower()): 0 for d in self._degrees for s in WorkerState}
        for r in rows:
            counts[(r.degree, r.state)] = counts.get((r.degree, r.state), 0) + 1
        for (d, s), n in sorted(counts.items()):
            workers.add_metric([str(d), s], n)
        queue = GaugeMetricFamily(
            "vertumnus_queue_workload_seconds",
            "Outstanding predicted prefill work q_w of each worker (seconds).",
            labels=["worker"],
        )
        cached = GaugeMetricFamily(
            "vertumnus_cached_blocks", "Cache blocks each worker holds (trie view).", labels=["worker"]
        )
        for r in rows:
            queue.add_metric([str(r.worker_id)], r.queue_s)
            cached.add_metric([str(r.worker_id)], r.cached_blocks)
        epoch = GaugeMetricFamily("vertumnus_pool_epoch", "Highest configuration epoch among the workers.")
        epoch.add_metric([], max((r.epoch for r in rows), default=0))
        rebalanced = CounterMetricFamily(
            "vertumnus_requests_rebalanced",
            "Queued requests placed again when workers became ACTIVE (scheduler.rebalance_on_activate).",
        )
        rebalanced.add_metric([], self._rebalanced())
        return [workers, queue, cached, epoch, rebalanced]


class ServingMetrics:
    """All metrics of one server, in their own registry."""

    def __init__(
        self,
        rows: Callable[[], Sequence[WorkerRow]],
        degrees: Sequence[int],
        rebalanced: Callable[[], int] = lambda: 0,
    ) -> None:
        """``rows``: the pool's workers at scrape time; ``rebalanced``: the pool's count of requests re-placed
        when workers became ACTIVE."""
        self.registry = CollectorRegistry(auto_describe=True)
        reg = self.registry
        self.requests = Counter("vertumnus_requests", "Requests by outcome.", ["outcome"], registry=reg)
        for o in OUTCOMES:
            self.requests.labels(o)
        self.ttft = Histogram(
            "vertumnus_ttft_seconds", "Time to first token (HTTP in → first token).", buckets=TTFT_BUCKETS, registry=reg
        )
        self.prefill = Histogram(
            "vertumnus_prefill_seconds",
            "Prefill duration on the worker, by CP degree.",
            ["degree"],
            buckets=TTFT_BUCKETS,
            registry=reg,
        )
        self.queue = Histogram(
            "vertumnus_queue_seconds",
            "Arrival → prefill start (queueing + routing).",
            buckets=TTFT_BUCKETS,
            registry=reg,
        )
        self.handoff = Histogram(
            "vertumnus_handoff_seconds",
            "Prefill done → first token (KV hand-off + decode).",
            buckets=TTFT_BUCKETS,
            registry=reg,
        )
        self.router = Histogram(
            "vertumnus_router_overhead_seconds",
            "HTTP in → placed on a worker (tokenise, hash, schedule, submit).",
            buckets=FAST_BUCKETS,
            registry=reg,
        )
        self.cached_tokens = Counter(
            "vertumnus_prefix_cached_tokens", "Prompt tokens served from a cached prefix.", registry=reg
        )
        self.prompt_tokens = Counter("vertumnus_prompt_tokens", "Prompt tokens of completed prefills.", registry=reg)
        self.completion_tokens = Counter("vertumnus_completion_tokens", "Generated tokens.", registry=reg)
        self.slo_attained = Counter(
            "vertumnus_slo_attained_tokens", "Prompt tokens of requests whose TTFT met their SLO.", registry=reg
        )
        self.slo_tokens = Counter(
            "vertumnus_slo_tokens", "Prompt tokens of requests with a TTFT (SLO denominator).", registry=reg
        )
        self.reconfigs = Counter(
            "vertumnus_reconfigurations", "Completed reconfigurations by op.", ["op"], registry=reg
        )
        self.reconfig_s = Histogram(
            "vertumnus_reconfiguration_seconds",
            "Reconfiguration stage durations.",
            ["stage"],
            buckets=RECONFIG_BUCKETS,
            registry=reg,
        )
        self.cache_ops = Counter("vertumnus_cache_ops", "Confirmed cache operations by kind.", ["kind"], registry=reg)
        self.cache_op_failures = Counter(
            "vertumnus_cache_op_failures", "Failed cache operations by kind.", ["kind"], registry=reg
        )
        for d in degrees:
            self.prefill.labels(str(d))
        for op in ("split", "merge"):
            self.reconfigs.labels(op)
        for stage in ("drain", "switch"):
            self.reconfig_s.labels(stage)
        for kind in ("replicate", "reclaim", "reconcile"):
            self.cache_ops.labels(kind)
            self.cache_op_failures.labels(kind)
        self.worker_failures = Counter("vertumnus_worker_failures", "Workers marked FAILED.", registry=reg)
        self.replacements = Counter(
            "vertumnus_request_replacements", "Requests re-placed on another worker (drain or failure).", registry=reg
        )
        self.inflight = Gauge("vertumnus_inflight_requests", "Admitted requests not yet finished.", registry=reg)
        reg.register(_PoolCollector(rows, degrees, rebalanced))

    def observe_ttft(self, ttft_s: float, prompt_tokens: int, slo_s: float) -> None:
        """Record a first token and its token-weighted SLO accounting."""
        self.ttft.observe(ttft_s)
        self.slo_tokens.inc(prompt_tokens)
        if ttft_s <= slo_s:
            self.slo_attained.inc(prompt_tokens)

    def render(self) -> bytes:
        """The Prometheus text exposition of this registry."""
        return generate_latest(self.registry)
