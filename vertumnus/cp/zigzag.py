"""Zigzag partition of a prefill's uncached tokens over the C ranks of a CP worker (DESIGN.md §4).

The R uncached tokens are padded to a multiple of 2C and cut into 2C equal chunks of s = ⌈R / 2C⌉ tokens.
Rank k takes chunks k and 2C−1−k, so every rank holds 2s tokens and the causal attention work is balanced:
chunk j attends to P + (j+1)·s keys, so rank k's two chunks see 2P + (k+1)·s + (2C−k)·s = 2P + (2C+1)·s
keys per pair of query rows — the same on every rank.

::

    C = 2, R = 13  →  s = ⌈13/4⌉ = 4, padded to 16 (· = padding, always at the end)

    position  0 1 2 3 │ 4 5 6 7 │ 8 9 a b │ c · · ·
    chunk        c0   │    c1   │    c2   │    c3
    rank          0   │     1   │     1   │     0        rank 0: c0+c3, rank 1: c1+c2

    AllGather (rank-major)   [c0 c3 | c1 c2]  ──restore (index_select by `restore_index`)──►  [c0 c1 c2 c3]

Padding tokens sit after every real token, so causality alone keeps real queries from seeing them; their own
outputs are dropped when restoring. Positions here are relative to the first uncached token; the absolute
position (for RoPE) is P + relative.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass(slots=True, frozen=True)
class ZigzagPlan:
    """Geometry of one prefill's zigzag split: ``n`` real uncached tokens over ``degree`` ranks."""

    n: int
    degree: int
    chunk: int = field(init=False)  # s, tokens per chunk
    padded: int = field(init=False)  # 2C·s ≥ n

    def __post_init__(self) -> None:
        if self.n < 1 or self.degree < 1:
            raise ValueError(f"zigzag needs n ≥ 1 and degree ≥ 1, got n={self.n}, degree={self.degree}")
        s = -(-self.n // (2 * self.degree))
        object.__setattr__(self, "chunk", s)
        object.__setattr__(self, "padded", 2 * self.degree * s)

    def chunks_of(self, rank: int) -> tuple[int, int]:
        """The two chunk indices rank ``rank`` holds, in local order."""
        assert 0 <= rank < self.degree
        return rank, 2 * self.degree - 1 - rank

    def local_positions(self, rank: int) -> torch.Tensor:
        """Relative positions (int64, length 2s) of rank ``rank``'s tokens, in local order."""
        s = self.chunk
        a, b = self.chunks_of(rank)
        return torch.cat([torch.arange(a * s, (a + 1) * s), torch.arange(b * s, (b + 1) * s)])

    def gathered_positions(self) -> torch.Tensor:
        """Relative positions of the rank-major AllGather order (rank 0's tokens, then rank 1's, ...)."""
        return torch.cat([self.local_positions(k) for k in range(self.degree)])

    def restore_index(self) -> torch.Tensor:
        """Index ``idx`` with ``gathered[idx] == sequence order`` (length ``padded``)."""
        return torch.argsort(self.gathered_positions())

    def owner_of(self, position: int) -> tuple[int, int]:
        """(rank, local index) holding relative position ``position`` (0 ≤ position < padded)."""
        assert 0 <= position < self.padded
        j, off = divmod(position, self.chunk)
        if j < self.degree:
            return j, off
        return 2 * self.degree - 1 - j, self.chunk + off

    def partition(self, x: torch.Tensor, rank: int, dim: int = 0) -> torch.Tensor:
        """Rank ``rank``'s slice of ``x`` (sequence of ``n`` items along ``dim``), padded with zeros."""
        assert x.shape[dim] == self.n, f"expected {self.n} items along dim {dim}, got {x.shape[dim]}"
        if self.padded > self.n:
            pad_shape = list(x.shape)
            pad_shape[dim] = self.padded - self.n
            x = torch.cat([x, x.new_zeros(pad_shape)], dim=dim)
        s = self.chunk
        a, b = self.chunks_of(rank)
        return torch.cat([x.narrow(dim, a * s, s), x.narrow(dim, b * s, s)], dim=dim)

    def restore(self, gathered: torch.Tensor, dim: int = 0) -> torch.Tensor:
        """Sequence order (first ``n`` items) from the rank-major concatenation of all ranks' slices."""
        assert gathered.shape[dim] == self.padded
        return gathered.index_select(dim, self.restore_index()).narrow(dim, 0, self.n)
