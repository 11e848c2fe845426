"""Driver-side bookkeeping of the torch data plane: one slot per worker, in-flight copies, prefill outputs."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import torch

from vertumnus.interfaces import PrefillJob
from vertumnus.types import CacheOp, WorkerGroup, WorkerState


@dataclass(slots=True)
class PrefillOutput:
    """What a finished prefill leaves for the decode side (``TorchDataPlane.take_output``)."""

    request_id: str
    worker_id: int
    cached_tokens: int
    logits: torch.Tensor  # last-token logits [V], float32
    kv: torch.Tensor | None  # [layers, 2, Hkv, L, D] in sequence order (prefix + computed), if asked for
    compute_s: float  # slowest rank's wall time for the step
    cpu_s: float = 0.0  # largest per-rank CPU time of the step (insensitive to other load on the machine)


@dataclass(slots=True)
class Running:
    """The job a worker is running. ``copy_op``: a RECONCILE still fetching blocks before the prefill."""

    job: PrefillJob
    started_s: float
    replies: dict[int, object] = field(default_factory=dict)  # worker-local rank -> PrefillDone
    copy_op: int | None = None


@dataclass(slots=True)
class Slot:
    """A worker as the driver sees it. FCFS queue; at most one job sent to the ranks at a time.

    state: ACTIVE (dispatching) → DRAINING (park requested: no new dispatch; Park goes out once idle)
    → PARKED (every rank replied) → retired by activate. FAILED: ranks killed, waiting for restart.
    """

    group: WorkerGroup
    epoch: int  # the epoch its ranks run under (replies of an earlier incarnation carry another)
    state: WorkerState = WorkerState.ACTIVE
    queue: deque[PrefillJob] = field(default_factory=deque)
    running: Running | None = None
    park_sent: bool = False
    parked: set[int] = field(default_factory=set)

    @property
    def worker_id(self) -> int:
        return self.group.worker_id

    @property
    def usable(self) -> bool:
        return self.state != WorkerState.FAILED


@dataclass(slots=True)
class Copy:
    """A replicate / reconcile in flight: export replies collected from every source rank, then import."""

    op: CacheOp
    src: int
    dst: int
    expected: int  # source ranks
    job: PrefillJob | None = None  # the prefill waiting for this reconcile, if any
    exported: dict[int, tuple[tuple[int, ...], torch.Tensor | None]] = field(default_factory=dict)


def partition_blocks(copy: Copy, dst_degree: int) -> list[tuple[tuple[int, ...], torch.Tensor | None]]:
    """Per destination rank: the exported blocks it will own (canonical placement: depth mod C_dst)."""
    got: dict[int, torch.Tensor] = {}
    for keys, blocks in copy.exported.values():
        if blocks is not None:
            got.update(zip(keys, blocks, strict=True))
    op = copy.op
    per_rank: list[list[int]] = [[] for _ in range(dst_degree)]
    for depth in range(op.first_missing, len(op.keys)):
        key = op.keys[depth]
        if key in got:
            per_rank[depth % dst_degree].append(key)
    return [(tuple(ks), torch.stack([got[k] for k in ks]) if ks else None) for ks in per_rank]
