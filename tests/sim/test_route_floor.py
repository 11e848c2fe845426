"""benchmarks/route_floor.py: a run along the scripted route from a start composition to a target one (issue 16's
reference for what moving costs) ends on the target with every request answered. The route itself is the
prescient start's steer (tests/sim/test_prescient.py)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def route_floor(benchmark_script: Callable[[str], ModuleType]) -> ModuleType:
    return benchmark_script("route_floor")


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
