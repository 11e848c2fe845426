"""Simulated engine: workers on a virtual clock with the configured cost profile and LRU block caches."""

from vertumnus.engines.sim.cache import BlockCache
from vertumnus.engines.sim.data_plane import SimDataPlane
from vertumnus.engines.sim.worker import SimStats, SimWorker, reused_tokens

__all__ = ["BlockCache", "SimDataPlane", "SimStats", "SimWorker", "reused_tokens"]
