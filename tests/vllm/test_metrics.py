"""The vLLM backend's Prometheus collector renders the data plane's counters exactly."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

from prometheus_client import CollectorRegistry, generate_latest

from vertumnus.engines.vllm.metrics import VllmCollector, stats
from vertumnus.engines.vllm.worker import RestartRecord


def test_collector_and_stats() -> None:
    feeds = [
        SimpleNamespace(counters=Counter(batches=3, stored=2, lost=1)),
        SimpleNamespace(counters=Counter(batches=1)),
    ]
    plane = SimpleNamespace(
        feeds=feeds, counters=Counter(logical_reclaims=2, logically_reclaimed_blocks=5, restarts=1),
        engine_start_s=[20.0, 30.0], restarts=[RestartRecord(2, (0,), (3,), 2.0, 48.0)],
    )  # fmt: skip
    reg = CollectorRegistry()
    reg.register(VllmCollector(plane))  # type: ignore[arg-type]
    text = generate_latest(reg).decode()
    for line in (
        'vertumnus_vllm_kv_events_total{kind="batches"} 4.0',
        'vertumnus_vllm_kv_events_total{kind="lost"} 1.0',
        'vertumnus_vllm_cache_ops_total{kind="logical_reclaims"} 2.0',
        'vertumnus_vllm_cache_ops_total{kind="logically_reclaimed_blocks"} 5.0',
        "vertumnus_vllm_engine_restarts_total 1.0",
        "vertumnus_vllm_engine_start_seconds_sum 50.0",
        "vertumnus_vllm_restart_seconds_count 1.0",
        "vertumnus_vllm_restart_seconds_sum 50.0",
    ):
        assert line in text.splitlines(), line
    got = stats(plane)  # type: ignore[arg-type]
    assert got["kv_events"] == {"batches": 4, "stored": 2, "lost": 1}
    assert got["restarts"] == [{"epoch": 2, "stop_s": 2.0, "start_s": 48.0}]
