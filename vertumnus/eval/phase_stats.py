"""Per-phase statistics of a run and the checks the evaluation report states against the paper's shape."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from vertumnus.sim.metrics import summarize


def phase_summaries(arrays: dict[str, np.ndarray], bounds: Sequence[tuple[float, float]]) -> list[dict[str, float]]:
    """Summary statistics over the requests arriving in each phase ``[start, end)``."""
    out = []
    for lo, hi in bounds:
        sel = (arrays["arrival"] >= lo) & (arrays["arrival"] < hi)
        out.append(summarize({k: v[sel] for k, v in arrays.items()}))
    return out


@dataclass(slots=True)
class PhaseVerdict:
    """Vertumnus against the fixed compositions in one phase (by mean TTFT)."""

    phase: int
    best_fixed: str
    best_fixed_ttft: float
    vertumnus_ttft: float

    @property
    def ratio(self) -> float:
        return self.vertumnus_ttft / self.best_fixed_ttft


def phase_verdicts(
    vertumnus: Sequence[dict[str, float]], fixed: Mapping[str, Sequence[dict[str, float]]]
) -> list[PhaseVerdict]:
    """Per phase: the fixed composition with the lowest mean TTFT and Vertumnus' mean TTFT."""
    out = []
    for k, v in enumerate(vertumnus):
        name, best = min(((n, s[k]["mean_ttft_s"]) for n, s in fixed.items()), key=lambda x: (x[1], x[0]))
        out.append(PhaseVerdict(k, name, float(best), float(v["mean_ttft_s"])))
    return out


def lower_bound_violations(ttft: np.ndarray, bound: np.ndarray, tol: float = 1e-9) -> int:
    """Completed requests whose TTFT is below the zero-queue lower bound (arrays aligned by arrival order)."""
    done = ~np.isnan(ttft)
    return int(np.sum(ttft[done] < bound[done] - tol))
