"""benchmarks/route_floor.py: the scripted route from a start composition to a target one (issue 16's reference
for what moving costs) takes exactly the operations the difference needs, on disjoint workers, and a run along
it ends on the target with every request answered."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

from vertumnus.controller.lattice import Lattice
from vertumnus.types import ReconfigKind

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def route_floor(benchmark_script: Callable[[str], ModuleType]) -> ModuleType:
    return benchmark_script("route_floor")


@pytest.mark.parametrize(
    ("start", "target", "kind", "n"),
    [({4: 4, 8: 3}, {4: 10}, ReconfigKind.SPLIT, 3), ({4: 6, 8: 2}, {4: 2, 8: 4}, ReconfigKind.MERGE, 2),
     ({4: 6, 8: 2}, {4: 8, 8: 1}, ReconfigKind.SPLIT, 1)],
)  # fmt: skip
def test_the_route_takes_the_operations_the_difference_needs(
    route_floor: ModuleType, start: dict[int, int], target: dict[int, int], kind: ReconfigKind, n: int
) -> None:
    lattice = Lattice(5, 8, [4, 8])
    lattice.build(start)
    ops = route_floor.route_ops(lattice, target)
    assert len(ops) == n and {op.kind for op in ops} == {kind}
    sources = [s.worker_id for op in ops for s in op.sources]
    assert len(sources) == len(set(sources))  # disjoint: the epoch protocol runs them together
    for op in ops:  # committed one after another, each with fresh target ids (as the epoch protocol assigns them)
        src = op.sources[0].worker_id
        again = lattice.split_of(src) if kind == ReconfigKind.SPLIT else lattice.merge_of(src)
        assert again is not None and again.sources == op.sources
        lattice.apply(again.sources, again.targets)
    assert lattice.composition() == target


def test_a_run_along_the_route_ends_on_the_target(route_floor: ModuleType) -> None:
    # The tuning set's steady-0.45 starts on 6xCP4+2xCP8; routed to 4xCP4+3xCP8 at 0.5 s (one merge).
    mean = route_floor.run_route(
        str(ROOT / "configs/eval/tuning.yaml"),
        str(ROOT / "configs/sim-40gpu.yaml"),
        "steady-0.45",
        0,
        "4xCP4+3xCP8",
        0.5,
    )
    assert 0.0 < mean < 5.0  # run_route asserts that it ended on the target and that every request was answered


def test_the_route_refuses_a_pool_of_three_degrees(route_floor: ModuleType) -> None:
    lattice = Lattice(1, 8, [2, 4, 8])
    lattice.build({8: 1})
    with pytest.raises(ValueError, match="two degrees"):
        route_floor.route_ops(lattice, {4: 2})
