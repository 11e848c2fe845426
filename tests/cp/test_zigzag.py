"""Zigzag partition / restore: property tests over lengths and degrees."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from vertumnus.cp.zigzag import ZigzagPlan

degrees = st.sampled_from([1, 2, 4, 8])
lengths = st.integers(min_value=1, max_value=400)


@settings(max_examples=150, deadline=None)
@given(n=lengths, c=degrees)
def test_partition_then_restore_is_identity(n: int, c: int) -> None:
    plan = ZigzagPlan(n, c)
    x = torch.arange(n) * 10 + 7
    parts = [plan.partition(x, k) for k in range(c)]
    assert all(p.shape == (2 * plan.chunk,) for p in parts)  # equal sizes: all_gather needs them
    assert torch.equal(plan.restore(torch.cat(parts)), x)


@settings(max_examples=150, deadline=None)
@given(n=lengths, c=degrees)
def test_positions_cover_the_padded_sequence_once_and_padding_is_last(n: int, c: int) -> None:
    plan = ZigzagPlan(n, c)
    assert plan.padded % (2 * c) == 0 and plan.n <= plan.padded < plan.n + 2 * c
    allpos = plan.gathered_positions()
    assert torch.equal(torch.sort(allpos).values, torch.arange(plan.padded))
    for k in range(c):
        a, b = plan.chunks_of(k)
        assert (a, b) == (k, 2 * c - 1 - k)
        pos = plan.local_positions(k)
        for i in range(0, len(pos), max(1, len(pos) // 7)):
            assert plan.owner_of(int(pos[i])) == (k, i)
    # padded items are zeros at the end of the sequence
    x = torch.ones(n, dtype=torch.long)
    gathered = torch.cat([plan.partition(x, k) for k in range(c)])
    seq = gathered.index_select(0, plan.restore_index())
    assert int(seq[:n].sum()) == n and int(seq[n:].sum()) == 0


@settings(max_examples=100, deadline=None)
@given(n=lengths, c=degrees)
def test_causal_work_is_balanced_across_ranks(n: int, c: int) -> None:
    plan = ZigzagPlan(n, c)
    # chunk j's queries see (j+1)·s uncached keys: each rank's pair sums to (2C+1)·s
    work = [sum((j + 1) * plan.chunk for j in plan.chunks_of(k)) for k in range(c)]
    assert work == [(2 * c + 1) * plan.chunk] * c


def test_sketch_example() -> None:
    plan = ZigzagPlan(13, 2)
    assert (plan.chunk, plan.padded) == (4, 16)
    assert plan.local_positions(0).tolist() == [0, 1, 2, 3, 12, 13, 14, 15]
    assert plan.local_positions(1).tolist() == [4, 5, 6, 7, 8, 9, 10, 11]
    assert plan.owner_of(12) == (0, 4)  # the last real token lives on rank 0


def test_restore_along_another_dim() -> None:
    plan = ZigzagPlan(9, 2)
    x = torch.arange(2 * 9 * 3).view(2, 9, 3)
    gathered = torch.cat([plan.partition(x, k, dim=1) for k in range(2)], dim=1)
    assert torch.equal(plan.restore(gathered, dim=1), x)


def test_rejects_empty() -> None:
    with pytest.raises(ValueError, match="n ≥ 1"):
        ZigzagPlan(0, 2)
