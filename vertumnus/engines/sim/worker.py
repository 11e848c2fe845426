"""State of one simulated worker and the engine's counters."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from vertumnus.engines.sim.cache import BlockCache
from vertumnus.interfaces import PrefillJob
from vertumnus.types import WorkerGroup


def reused_tokens(blocks: int, input_len: int, block_tokens: int) -> int:
    """Prefix tokens reused for ``blocks`` cached leading blocks: at least one token is always computed."""
    return min(blocks * block_tokens, input_len - 1)


@dataclass(slots=True)
class SimWorker:
    """One simulated worker: geometry, FCFS queue, at most one running job, physical cache."""

    group: WorkerGroup
    cache: BlockCache
    epoch: int
    queue: deque[PrefillJob] = field(default_factory=deque)
    running: PrefillJob | None = None
    start_scheduled: bool = False
    parking: bool = False  # park requested: start nothing new
    parked: bool = False
    retired: bool = False


@dataclass(slots=True)
class SimStats:
    """Engine-side counters (reported by the simulator next to the pool's)."""

    prefills: int = 0
    copies: int = 0
    copied_blocks: int = 0
    copy_s: float = 0.0
    evicted_blocks: int = 0
    failed_ops: int = 0
