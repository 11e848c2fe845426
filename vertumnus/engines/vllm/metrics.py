"""Counters of the vLLM backend, as a dict (:func:`stats`) and as a Prometheus collector.

The server's registry is per app (:class:`vertumnus.serving.metrics.ServingMetrics`); the serving runtime
registers ``plane.collector()`` there (the data plane is an :class:`~vertumnus.interfaces.EngineStatsSource`),
so these appear next to the pool's metrics on ``/metrics``. Names:

- ``vertumnus_vllm_kv_events_total{kind}``: KV-event feed counters summed over every worker's feed since start
  (batches, events, stored, removed, cleared, malformed, unknown, other_medium, duplicates, gaps,
  replay_requests, replayed, lost, replay_timeouts);
- ``vertumnus_vllm_cache_ops_total{kind}``: logical_reclaims, logically_reclaimed_blocks (vLLM has no
  per-prefix eviction: reclaimed prefixes are dropped from the trie and left to vLLM's LRU), copy_prefills,
  transfer_exports, ops_unconfirmed, ops_without_tokens;
- ``vertumnus_vllm_engine_start_seconds`` / ``vertumnus_vllm_restart_seconds`` (summaries: count and sum) and
  ``vertumnus_vllm_engine_restarts_total`` (failure restarts).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from prometheus_client.core import CounterMetricFamily, Metric, SummaryMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from vertumnus.engines.vllm.data_plane import VllmDataPlane

OP_COUNTERS = (
    "logical_reclaims", "logically_reclaimed_blocks", "copy_prefills", "transfer_exports", "ops_unconfirmed",
    "ops_without_tokens",
)  # fmt: skip


def feed_counters(plane: VllmDataPlane) -> Counter[str]:
    """KV-event counters summed over every feed the data plane ever opened."""
    total: Counter[str] = Counter()
    for feed in plane.feeds:
        total.update(feed.counters)
    return total


def stats(plane: VllmDataPlane) -> dict[str, Any]:
    """Everything as plain data (``/v1/pool``-style)."""
    return {
        "data_plane": dict(plane.counters),
        "kv_events": dict(feed_counters(plane)),
        "engine_start_s": list(plane.engine_start_s),
        "restarts": [{"epoch": r.epoch, "stop_s": r.stop_s, "start_s": r.start_s} for r in plane.restarts],
    }


class VllmCollector(Collector):
    """Prometheus view of :func:`stats` (read at scrape time)."""

    def __init__(self, plane: VllmDataPlane) -> None:
        self.plane = plane

    def collect(self) -> Iterable[Metric]:
        p = self.plane
        ev = CounterMetricFamily("vertumnus_vllm_kv_events", "KV-event feed counters, all workers.", labels=["kind"])
        for kind, n in sorted(feed_counters(p).items()):
            ev.add_metric([kind], float(n))
        yield ev
        ops = CounterMetricFamily("vertumnus_vllm_cache_ops", "Cache-op work on vLLM workers.", labels=["kind"])
        for kind in OP_COUNTERS:
            ops.add_metric([kind], float(p.counters.get(kind, 0)))
        yield ops
        yield CounterMetricFamily(
            "vertumnus_vllm_engine_restarts", "Engines restarted after a failure.", value=p.counters.get("restarts", 0)
        )
        yield SummaryMetricFamily(
            "vertumnus_vllm_engine_start_seconds", "vLLM engine start-up time.",
            count_value=len(p.engine_start_s), sum_value=sum(p.engine_start_s),
        )  # fmt: skip
        yield SummaryMetricFamily(
            "vertumnus_vllm_restart_seconds", "Reconfiguration: stop the sources' engines + start the targets'.",
            count_value=len(p.restarts), sum_value=sum(r.total_s for r in p.restarts),
        )  # fmt: skip
