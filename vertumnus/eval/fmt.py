"""The evaluation's ratios and number formats: one definition each, shared by every report table."""

from __future__ import annotations

import math


def ratio(a: float, b: float) -> float:
    """``a ÷ b`` of two TTFT figures, where ``inf`` stands for a run that completed nothing.

    Both infinite: 1.0 — two runs that completed nothing are equally bad, and neither is ahead of the other.
    Otherwise a zero or negative divisor gives inf, and an infinite ``a`` gives inf."""
    if math.isinf(a) and math.isinf(b):
        return 1.0
    return a / b if b > 0 else math.inf


def rel_change(a: float | None, b: float | None) -> float:
    """``a / b − 1`` (the relative change of ``a`` against ``b``); nan where either is missing or ``b`` is 0."""
    if a is None or b is None or not b:
        return math.nan
    return a / b - 1.0


def num3(x: float | None) -> str:
    """A figure to three decimals (seconds, ratios); "–" for a missing or non-finite one."""
    return "–" if x is None or not math.isfinite(x) else f"{x:.3f}"


def share(x: float | None) -> str:
    """A share as a percentage with one decimal ("12.3%"); "–" for a missing one."""
    return "–" if x is None else f"{x:.1%}"


def signed_pct(x: float | None) -> str:
    """A relative change as a signed percentage with one decimal ("+1.2%"); "n/a" for a missing or non-finite one."""
    return "n/a" if x is None or not math.isfinite(x) else f"{100 * x:+.1f}%"
