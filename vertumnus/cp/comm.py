"""Collectives of one CP worker's group: AllGather of tensors (K/V per layer, prefix blocks) and of objects.

``DistComm`` wraps a ``torch.distributed`` process group (gloo on CPU, NCCL on GPU). It uses
``all_gather_single`` — the name torch 2.13 gives ``all_gather_into_tensor`` (the old name still works there but
warns as deprecated); gloo supports it on CPU, so no fallback to a list-``all_gather`` is needed. ``LocalComm``
is the degree-1 worker: gathering is the identity, no process group exists.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
import torch.distributed as dist

_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


class Comm(Protocol):
    rank: int  # rank inside the worker
    size: int  # the worker's degree C

    def all_gather(self, t: torch.Tensor) -> torch.Tensor:
        """[size · t.shape[0], ...]: every rank's ``t`` (same shape everywhere), concatenated in rank order."""
        ...

    def all_gather_object(self, obj: Any) -> list[Any]: ...


class LocalComm:
    """Degree 1: one rank, nothing to exchange."""

    rank = 0
    size = 1

    def all_gather(self, t: torch.Tensor) -> torch.Tensor:
        return t

    def all_gather_object(self, obj: Any) -> list[Any]:
        return [obj]


class DistComm:
    """A worker's process group; ``rank`` is the position inside the group (0 = the worker's first rank)."""

    def __init__(self, group: dist.ProcessGroup, rank: int, size: int) -> None:
        self.group = group
        self.rank = rank
        self.size = size

    def all_gather(self, t: torch.Tensor) -> torch.Tensor:
        t = t.contiguous()
        out = t.new_empty((self.size * t.shape[0], *t.shape[1:]))
        _gather_single(out, t, group=self.group)
        return out

    def all_gather_object(self, obj: Any) -> list[Any]:
        out: list[Any] = [None] * self.size
        dist.all_gather_object(out, obj, group=self.group)
        return out
