"""Messages between the data plane (or a Ray actor's driver) and rank processes.

Protocol invariant: every rank of a worker receives the *same* command sequence (the data plane puts each
command into all of the worker's rank queues under one lock), and ranks execute commands one at a time in
order. A command is therefore an engine step: geometry (group, epoch) can only change between commands, and
all ranks of a worker enter every collective together.
Tensors travel through ``torch.multiprocessing`` queues (shared memory), stacked into one tensor per message.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from vertumnus.config import ModelConfig
from vertumnus.types import CacheReport, ReconfigKind, WorkerGroup


@dataclass(slots=True)
class RankSpec:
    """Everything a rank process needs to build its :class:`~vertumnus.engines.torch.rank_worker.RankWorker`."""

    rank: int  # global rank = node · gpus_per_node + node-local rank
    world_size: int
    gpus_per_node: int
    degrees: tuple[int, ...]
    model: ModelConfig
    block_tokens: int  # KV block = one manager cache block (cache.block_tokens)
    capacity_blocks: int  # per-rank KV capacity in blocks
    retain: tuple[int, float] | None = None  # cache.retention(): eviction order (None: plain LRU)
    device: str = "cpu"  # "cpu" or "cuda" (rank r uses cuda:(r mod device_count))
    attn_impl: str = "auto"
    threads: int = 1  # intra-op threads per rank (CPU)
    timeout_s: float = 300.0  # rendezvous / collective timeout


# -- commands --------------------------------------------------------------------------------------------


@dataclass(slots=True)
class RunPrefill:
    worker_id: int
    request_id: str
    token_ids: list[int]
    block_keys: tuple[int, ...]  # chained keys of the prompt's full blocks (block_tokens each)
    max_reuse_blocks: int
    return_kv: bool = False


@dataclass(slots=True)
class Park:
    worker_id: int


@dataclass(slots=True)
class Activate:
    """Adopt ``target`` (this rank's new worker) under ``epoch``; ``sources`` are the parked workers."""

    kind: ReconfigKind
    epoch: int
    target: WorkerGroup
    sources: tuple[WorkerGroup, ...]


@dataclass(slots=True)
class Assign:
    """A fresh (restarted or idle) rank joins ``group`` under ``epoch``; its cache is empty."""

    group: WorkerGroup
    epoch: int


@dataclass(slots=True)
class ExportBlocks:
    op_id: int
    worker_id: int
    keys: tuple[int, ...]


@dataclass(slots=True)
class ImportBlocks:
    """Install blocks of ``path[first_missing:]``; ``available`` are the keys some source provided, ``keys`` /
    ``blocks`` the ones this rank will own (canonical placement depth mod C)."""

    op_id: int
    worker_id: int
    path: tuple[int, ...]
    first_missing: int
    available: tuple[int, ...]
    keys: tuple[int, ...] = ()
    blocks: torch.Tensor | None = None  # [len(keys), layers, 2, Hkv, B, D]


@dataclass(slots=True)
class RemoveBlocks:
    op_id: int
    worker_id: int
    keys: tuple[int, ...]


@dataclass(slots=True)
class ListBlocks:
    """Reply with the blocks this rank stores (:meth:`TorchDataPlane.block_layout`; tests and debugging)."""

    worker_id: int
    token: int


@dataclass(slots=True)
class Regroup:
    """Re-form every process group under ``generation`` (after restarted ranks joined the world)."""

    generation: int


@dataclass(slots=True)
class Shutdown:
    pass


Command = (
    RunPrefill | Park | Activate | Assign | ExportBlocks | ImportBlocks | RemoveBlocks | ListBlocks | Regroup | Shutdown
)


# -- replies ---------------------------------------------------------------------------------------------


@dataclass(slots=True)
class Ready:
    rank: int  # global
    generation: int
    pid: int


@dataclass(slots=True)
class EpochAck:
    worker_id: int
    rank: int  # global rank (WorkerGroup.global_ranks), as the simulated engine reports it
    epoch: int


@dataclass(slots=True)
class PrefillDone:
    worker_id: int
    rank: int  # rank inside the worker
    request_id: str
    cached_tokens: int
    compute_s: float  # wall time of the step on this rank
    logits: torch.Tensor | None = None  # [V] from the rank holding the last token
    kv: torch.Tensor | None = None  # [layers, 2, Hkv, L, D] from the worker's first rank when asked
    reports: list[CacheReport] = field(default_factory=list)  # from the worker's first rank
    epoch: int = -1  # the rank's epoch: lets the driver drop replies of a failed worker's earlier incarnation
    cpu_s: float = 0.0  # CPU time of the step in this rank's process (all threads, gloo's included)


@dataclass(slots=True)
class Parked:
    worker_id: int
    rank: int


@dataclass(slots=True)
class Exported:
    op_id: int
    worker_id: int
    rank: int
    keys: tuple[int, ...]
    blocks: torch.Tensor | None  # [len(keys), layers, 2, Hkv, B, D]


@dataclass(slots=True)
class OpDone:
    op_id: int
    worker_id: int
    rank: int
    reports: list[CacheReport] = field(default_factory=list)
    error: str | None = None


@dataclass(slots=True)
class Reports:
    """Cache reports not tied to a prefill or an op (e.g. CLEARED when a restarted worker starts empty)."""

    worker_id: int
    reports: list[CacheReport]


@dataclass(slots=True)
class BlockList:
    token: int
    worker_id: int
    rank: int  # rank inside the worker
    keys: tuple[int, ...]  # the blocks whose KV this rank stores


@dataclass(slots=True)
class RankFailed:
    rank: int  # global
    worker_id: int | None
    message: str


Reply = Ready | EpochAck | PrefillDone | Parked | Exported | OpDone | Reports | BlockList | RankFailed
