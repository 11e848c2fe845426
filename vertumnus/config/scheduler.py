"""Request placement: the cost J a request is placed by (docs/design.md §1)."""

from __future__ import annotations

from pydantic import Field

from vertumnus.config._base import Section


class SchedulerConfig(Section):
    beta: float = Field(1.0, ge=1.0, description="β ≥ 1: weight of the predicted service time in the placement cost.")
    lam: float = Field(0.1, ge=0.0, description="λ ≥ 0: GPU-occupancy cost of larger degrees, (C_w − C_min)/C_min × Ê.")
    rebalance_on_activate: bool = Field(
        True,
        description="When workers become ACTIVE (a split / merge commits, a failed worker is back), place every "
        "queued, not yet started request of the pool again by J, in arrival order, so the new workers take over "
        "the backlog at once instead of serving only later arrivals.",
    )
