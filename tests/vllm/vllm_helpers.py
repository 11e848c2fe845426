"""Shared machinery of the engine tests: an event loop on a thread (the pool and the vLLM data plane live on
one asyncio loop, as in the server), Ray hosting per module on the session's Ray cluster, configs."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from vertumnus.config import VertumnusConfig, config_from_dict
from vertumnus.serving.hosting import RayHosting, start_hosting

T = TypeVar("T")


class LoopThread:
    """An asyncio loop on a daemon thread; ``call`` runs a function on it (serialised with every callback).

    ``checks`` run on the loop before every poll of :meth:`wait` and may raise — e.g. the data plane's
    ``raise_task_failure``, so an exception in a background task (an assertion in a test's EngineEvents
    callback, say) fails the waiting test at once instead of after the wait's timeout."""

    def __init__(self) -> None:
        self.checks: list[Callable[[], None]] = []
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="test-loop", daemon=True)
        self.thread.start()

    def call(self, fn: Callable[..., T], *args: Any, timeout_s: float = 120.0) -> T:
        if threading.current_thread() is self.thread:  # already on the loop (e.g. inside a wait condition)
            return fn(*args)
        fut: concurrent.futures.Future[T] = concurrent.futures.Future()

        def run() -> None:
            try:
                fut.set_result(fn(*args))
            except BaseException as e:  # handed to the caller
                fut.set_exception(e)

        self.loop.call_soon_threadsafe(run)
        return fut.result(timeout_s)

    def run(self, coro: Any, timeout_s: float = 300.0) -> Any:
        """Run a coroutine on the loop and return its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def wait(self, cond: Callable[[], bool], timeout_s: float, what: str) -> None:
        """Poll ``cond`` on the loop until true (a wait for engine work, not a timing assertion)."""
        deadline = time.monotonic() + timeout_s
        while not self.call(self._checked, cond):
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
            time.sleep(0.05)

    def _checked(self, cond: Callable[[], bool]) -> bool:
        for check in self.checks:
            check()
        return cond()

    def close(self) -> None:
        """Let the loop's tasks end (a data plane's ``close()`` cancels its own; a cancelled task still needs a turn
        of the loop to finish), then stop it. Stopping at once left them pending, and the interpreter reported each
        one ("Task was destroyed but it is pending!") at exit."""

        async def settle() -> None:
            pending = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            if pending:
                await asyncio.wait(pending, timeout=10)

        self.run(settle(), timeout_s=15)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def vllm_config(overrides: dict[str, Any]) -> VertumnusConfig:
    """The engine tests' base: tiny model, CPU slots, 128-token trie blocks over 32-token vLLM blocks."""
    base: dict[str, Any] = {
        "pool": {
            "engine": "vllm", "nodes": 1, "gpus_per_node": 2, "degrees": [1], "initial_composition": "2xCP1",
            "max_model_len": 2048, "kv_capacity_blocks_per_rank": 1024,
        },
        "cache": {"block_tokens": 128, "scan_interval_s": 10_000.0},
        "controller": {"enabled": False},
        "cost_model": {"profile": "configs/profiles/tiny-cpu.yaml"},
        "serving": {"cpu_slots": 2, "decode_actors": 0, "device": "cpu"},
        "vllm": {"block_size": 32, "kv_cache_space_gib": 1, "dtype": "float32", "start_timeout_s": 1200.0},
    }  # fmt: skip
    return config_from_dict(_merge(base, overrides))


def _merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    out = dict(a)
    for k, v in b.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def hosting_for(cfg: VertumnusConfig) -> RayHosting:
    """Placement groups of ``cfg`` on the session's Ray cluster (not shut down when the module closes it)."""
    hosting = start_hosting(cfg)
    hosting.owns_cluster = False
    return hosting
