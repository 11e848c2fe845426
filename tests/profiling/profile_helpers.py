"""Helpers of the profiling tests that test modules import (fixtures live in conftest.py)."""

from __future__ import annotations

from collections import Counter

from vertumnus.cost_model import CostModel, CostProfile, DegreeProfile
from vertumnus.profiling.measure import GridPoint


class PlantedTimer:
    """Controlled timings for a real engine (:data:`vertumnus.profiling.measure.Timer`): each timed run records the
    planted E_C(r, p), so the fit must return the planted coefficients exactly, whatever the machine's load.
    Logs every run with the engine's own seconds (evidence that the engine really ran the point)."""

    def __init__(self, degrees: dict[int, DegreeProfile]) -> None:
        self.model = CostModel(CostProfile(degrees=dict(degrees)))
        self.runs: list[tuple[GridPoint, float]] = []

    def __call__(self, point: GridPoint, engine_s: float) -> float:
        self.runs.append((point, engine_s))
        return self.model.predict(point.degree, point.r, point.p)

    def per_point(self) -> Counter[tuple[int, int, int]]:
        """Timed runs per (degree, r, p)."""
        return Counter((pt.degree, pt.r, pt.p) for pt, _ in self.runs)
