"""Grouping lattice and initial composition (DESIGN.md §2) with exact expectations."""

from __future__ import annotations

from pathlib import Path

import pytest

from vertumnus.config import DEFAULT_PROFILE, REPO_ROOT
from vertumnus.controller.initial import History, choose_initial, read_trace_lengths, summarize_history
from vertumnus.controller.lattice import Lattice, block_tilings, node_tilings
from vertumnus.cost_model import CostModel
from vertumnus.types import ReconfigKind, WorkerGroup

COST = CostModel.from_file(REPO_ROOT / DEFAULT_PROFILE)


def test_buddy_tilings() -> None:
    assert block_tilings(8, (4, 8)) == ((8,), (4, 4))
    assert block_tilings(4, (1, 2, 4)) == ((4,), (2, 2), (2, 1, 1), (1, 1, 2), (1, 1, 1, 1))
    # one tiling per degree multiset, large workers at low ranks
    assert node_tilings(8, (2, 4, 8)) == ((8,), (4, 4), (4, 2, 2), (2, 2, 2, 2))
    assert len(node_tilings(8, (1, 2, 4, 8))) == 10  # multisets of {1,2,4,8} buddy-tiling 8 ranks


def test_split_merge_adjacency_and_ids_never_reused() -> None:
    lat = Lattice(1, 8, [2, 4, 8])
    assert lat.build({8: 1}) == [WorkerGroup(0, 0, 0, 8)]
    split = lat.split_of(0)
    assert split is not None and split.kind == ReconfigKind.SPLIT
    assert split.targets == (WorkerGroup(1, 0, 0, 4), WorkerGroup(2, 0, 4, 4))
    lat.apply(split.sources, split.targets)
    assert lat.composition() == {4: 2}
    s2 = lat.split_of(2)
    assert s2 is not None
    lat.apply(s2.sources, s2.targets)  # 4 + 2 + 2: ids 1, 3, 4
    assert lat.groups == {1: WorkerGroup(1, 0, 0, 4), 3: WorkerGroup(3, 0, 4, 2), 4: WorkerGroup(4, 0, 6, 2)}
    assert lat.sibling(1) is None  # its buddy [4,8) is two CP2s, not one CP4
    assert lat.sibling(3) == WorkerGroup(4, 0, 6, 2)
    merges = lat.ops(ReconfigKind.MERGE)
    assert [(tuple(s.worker_id for s in m.sources), m.targets) for m in merges] == [
        ((3, 4), (WorkerGroup(5, 0, 4, 4),))
    ]
    assert [op.sources[0].worker_id for op in lat.ops(ReconfigKind.SPLIT)] == [1]  # CP2 cannot split: 1 not allowed
    lat.apply(merges[0].sources, merges[0].targets)
    m = lat.merge_of(1)
    assert m is not None and m.targets == (WorkerGroup(6, 0, 0, 8),)  # 0..5 are never handed out again


def test_no_move_without_the_intermediate_degree() -> None:
    lat = Lattice(2, 8, [2, 8])
    lat.build({8: 1, 2: 4})
    assert lat.ops(ReconfigKind.SPLIT) == [] and lat.ops(ReconfigKind.MERGE) == []


def test_build_rejects_unreachable_compositions() -> None:
    lat = Lattice(1, 8, [2, 4, 8])
    with pytest.raises(ValueError, match="not a buddy tiling"):
        lat.build({4: 1, 2: 1})
    with pytest.raises(ValueError, match="degree 16 not in allowed"):
        lat.build({16: 1})
    assert lat.build({4: 1, 2: 2}) == [WorkerGroup(0, 0, 0, 4), WorkerGroup(1, 0, 4, 2), WorkerGroup(2, 0, 6, 2)]


def _hist(d4: float, d8: float, d48: float) -> History:
    return History(100, 1000.0, 100.0, 0.2, {(4,): d4, (8,): d8, (4, 8): d48})


@pytest.mark.parametrize(
    ("history", "expected"),
    [
        # 40 GPUs = 5 nodes × 8, κ = 7 per 10-s window for both degrees: K = 7 × workers = 7 × (10 − n8).
        (None, {8: 5}),  # no history: all GPUs in the largest degree
        (_hist(25, 20, 22), {8: 5}),  # 5×CP8: K = 35 ≥ 1.2 × 20 = 24
        (_hist(25, 40, 34), {4: 2, 8: 4}),  # all-CP8 short (35 < 48); 4×CP8 + 2×CP4: K = 42 ≥ 40.8
        (_hist(70, 70, 70), {4: 10}),  # nothing reaches 84: largest K (10 × CP4 = 70)
    ],
)
def test_initial_composition(history: History | None, expected: dict[int, int]) -> None:
    assert choose_initial(Lattice(5, 8, [4, 8]), COST, 10.0, 0.2, history) == expected


def test_history_demand_per_degree_set_and_long_share(tmp_path: Path) -> None:
    trace = tmp_path / "h.jsonl"
    trace.write_text(
        '{"timestamp": 0, "input_length": 1000, "output_length": 1, "hash_ids": [7]}\n'
        '{"timestamp": 20000, "input_length": 65536, "output_length": 1, "hash_ids": [7, 8]}\n'
    )
    ts, lens, keys = read_trace_lengths(trace)
    assert ts.tolist() == [0.0, 20.0] and lens.tolist() == [1000, 65536]
    h = summarize_history(ts, lens, keys, COST, [4, 8], 10.0, 32768, 512, 1.0, 0.1)
    assert (h.requests, h.duration_s, h.windows, h.long_share) == (2, 20.0, 2.0, 0.5)
    # request 2 reuses block 7 (512 tokens) seen in request 1: P = 512, R = 65024.
    e4 = [COST.predict(4, 1000, 0), COST.predict(4, 65024, 512)]
    e8 = [COST.predict(8, 1000, 0), COST.predict(8, 65024, 512)]
    assert h.demand_s[(4,)] == pytest.approx(sum(e4) / 2)
    assert h.demand_s[(8,)] == pytest.approx(sum(e8) / 2)
    # mixed: short at CP4 (E4 < 1.1·E8), long at CP8 (1.1·E8 < E4)
    assert h.demand_s[(4, 8)] == pytest.approx((e4[0] + e8[1]) / 2)
    no_keys = summarize_history(ts, lens, None, COST, [4, 8], 10.0, 32768, 512, 1.0, 0.1)
    assert no_keys.demand_s[(8,)] == pytest.approx((COST.predict(8, 1000, 0) + COST.predict(8, 65536, 0)) / 2)


def test_history_trace_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not found"):
        read_trace_lengths(tmp_path / "missing.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 0}\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl:1: not a Mooncake trace record"):
        read_trace_lengths(bad)
