"""A workload's load over time: :class:`LoadPhase` s and the named patterns that build them (steady, alternating,
ramp, pulse, sine, explicit phases), validated from a set file's ``pattern`` and ``params``. How a load becomes a
request rate, and the requests themselves: :mod:`vertumnus.eval.protocol`."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

Curve = Literal["linear", "cosine"]


@dataclass(slots=True, frozen=True)
class LoadPhase:
    """``duration_s`` seconds whose load and long share move from (``load``, ``long_share``) to
    (``load_end``, ``long_end``) along ``curve`` (None: constant). ``label`` names the phase in reports."""

    duration_s: float
    load: float
    long_share: float
    load_end: float | None = None
    long_end: float | None = None
    curve: Curve = "linear"
    label: str = ""

    def __post_init__(self) -> None:
        if not (self.duration_s > 0 and math.isfinite(self.duration_s)):
            raise ValueError(f"phase duration must be > 0, got {self.duration_s}")
        for name in ("load", "load_end"):
            v = getattr(self, name)
            if v is not None and not (v >= 0 and math.isfinite(v)):
                raise ValueError(f"phase {name} must be ≥ 0, got {v}")
        for name in ("long_share", "long_end"):
            v = getattr(self, name)
            if v is not None and not 0 <= v <= 1:
                raise ValueError(f"phase {name} must be in [0, 1], got {v}")
        if self.curve not in ("linear", "cosine"):
            raise ValueError(f"phase curve must be 'linear' or 'cosine', got {self.curve!r}")

    def ease(self, u: float) -> float:
        """Progress g(u) ∈ [0, 1] at fraction u of the phase (monotone in u)."""
        return u if self.curve == "linear" else 0.5 * (1.0 - math.cos(math.pi * u))

    def at(self, u: float) -> tuple[float, float]:
        """(load, long share) at fraction ``u`` ∈ [0, 1] of the phase."""
        g = self.ease(u)
        lo = self.load if self.load_end is None else self.load + (self.load_end - self.load) * g
        ls = self.long_share if self.long_end is None else self.long_share + (self.long_end - self.long_share) * g
        return lo, ls

    @property
    def mean_load(self) -> float:
        """Time-averaged load (linear and half-cosine curves both average to the midpoint)."""
        return self.load if self.load_end is None else 0.5 * (self.load + self.load_end)

    @property
    def mean_long_share(self) -> float:
        return self.long_share if self.long_end is None else 0.5 * (self.long_share + self.long_end)


def phase_bounds(phases: Sequence[LoadPhase]) -> list[tuple[float, float]]:
    """(start, end) seconds of each phase."""
    out, t = [], 0.0
    for p in phases:
        out.append((t, t + p.duration_s))
        t += p.duration_s
    return out


# -- patterns ---------------------------------------------------------------------------------------------------
class Params(BaseModel):
    """Strict, frozen parameters of a set file (unknown keys are errors)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class Level(Params):
    """A (load, long share) operating point."""

    load: float = Field(ge=0)
    long_share: float = Field(ge=0, le=1)


class SteadyParams(Params):
    load: float = Field(ge=0)
    long_share: float = Field(ge=0, le=1)
    duration_s: float = Field(gt=0)


class AlternatingParams(Params):
    """High-rate short phases and low-rate long-heavy phases in turn."""

    high: Level
    low: Level
    high_s: float = Field(gt=0)
    low_s: float = Field(gt=0)
    phases: int = Field(ge=1, description="Number of phases in all (high and low together).")
    start: Literal["high", "low"] = "high"


class RampParams(Params):
    """Linear ramp of the load from ``from_load`` to ``to_load`` in ``steps`` equal phases, optional holds."""

    from_load: float = Field(ge=0)
    to_load: float = Field(ge=0)
    long_share: float = Field(ge=0, le=1)
    long_end: float | None = Field(None, ge=0, le=1)
    ramp_s: float = Field(gt=0)
    steps: int = Field(1, ge=1)
    hold_before_s: float = Field(0.0, ge=0)
    hold_after_s: float = Field(0.0, ge=0)


class PulseParams(Params):
    """Base level, ``count`` excursions to the pulse level (a spike or a long-heavy plateau), base level."""

    base: Level
    pulse: Level
    before_s: float = Field(gt=0)
    pulse_s: float = Field(gt=0)
    after_s: float = Field(gt=0)
    count: int = Field(1, ge=1)


class SineParams(Params):
    """Load mean ± amplitude with period ``period_s`` (phases: half periods); the long share swings the other way
    (``long_at_low`` at the troughs, ``long_at_high`` at the crests)."""

    mean_load: float = Field(gt=0)
    amplitude: float = Field(ge=0)
    period_s: float = Field(gt=0)
    half_periods: int = Field(ge=1)
    long_at_high: float = Field(ge=0, le=1)
    long_at_low: float = Field(ge=0, le=1)
    start: Literal["high", "low"] = "high"

    @model_validator(mode="after")
    def _positive(self) -> SineParams:
        if self.amplitude > self.mean_load:
            raise ValueError(f"amplitude {self.amplitude} exceeds mean_load {self.mean_load} (negative load)")
        return self


class PhaseParams(Params):
    duration_s: float = Field(gt=0)
    load: float = Field(ge=0)
    long_share: float = Field(ge=0, le=1)
    load_end: float | None = Field(None, ge=0)
    long_end: float | None = Field(None, ge=0, le=1)
    curve: Curve = "linear"
    label: str = ""


class ExplicitParams(Params):
    phases: list[PhaseParams] = Field(min_length=1)


def _steady(p: SteadyParams) -> list[LoadPhase]:
    return [LoadPhase(p.duration_s, p.load, p.long_share, label=f"steady {p.load:g}")]


def _alternating(p: AlternatingParams) -> list[LoadPhase]:
    out = []
    high = p.start == "high"
    for _ in range(p.phases):
        lv, dur, name = (p.high, p.high_s, "high") if high else (p.low, p.low_s, "low")
        out.append(LoadPhase(dur, lv.load, lv.long_share, label=name))
        high = not high
    return out


def _ramp(p: RampParams) -> list[LoadPhase]:
    out = []
    end_long = p.long_share if p.long_end is None else p.long_end
    if p.hold_before_s:
        out.append(LoadPhase(p.hold_before_s, p.from_load, p.long_share, label="hold"))
    step = p.ramp_s / p.steps
    for k in range(p.steps):
        a, b = k / p.steps, (k + 1) / p.steps
        lo0, lo1 = p.from_load + (p.to_load - p.from_load) * a, p.from_load + (p.to_load - p.from_load) * b
        ls0, ls1 = p.long_share + (end_long - p.long_share) * a, p.long_share + (end_long - p.long_share) * b
        out.append(LoadPhase(step, lo0, ls0, lo1, ls1, "linear", label="ramp"))
    if p.hold_after_s:
        out.append(LoadPhase(p.hold_after_s, p.to_load, end_long, label="hold"))
    return out


def _pulse(p: PulseParams) -> list[LoadPhase]:
    out = [LoadPhase(p.before_s, p.base.load, p.base.long_share, label="base")]
    for _ in range(p.count):
        out.append(LoadPhase(p.pulse_s, p.pulse.load, p.pulse.long_share, label="pulse"))
        out.append(LoadPhase(p.after_s, p.base.load, p.base.long_share, label="base"))
    return out


def _sine(p: SineParams) -> list[LoadPhase]:
    hi, lo = p.mean_load + p.amplitude, p.mean_load - p.amplitude
    out = []
    falling = p.start == "high"
    for _ in range(p.half_periods):
        if falling:
            out.append(LoadPhase(p.period_s / 2, hi, p.long_at_high, lo, p.long_at_low, "cosine", "falling"))
        else:
            out.append(LoadPhase(p.period_s / 2, lo, p.long_at_low, hi, p.long_at_high, "cosine", "rising"))
        falling = not falling
    return out


def _explicit(p: ExplicitParams) -> list[LoadPhase]:
    return [LoadPhase(**ph.model_dump()) for ph in p.phases]


PATTERNS: dict[str, tuple[type[Params], Callable[[Any], list[LoadPhase]]]] = {
    "steady": (SteadyParams, _steady),
    "alternating": (AlternatingParams, _alternating),
    "ramp": (RampParams, _ramp),
    "spike": (PulseParams, _pulse),
    "plateau": (PulseParams, _pulse),
    "sine": (SineParams, _sine),
    "phases": (ExplicitParams, _explicit),
}


def build_phases(pattern: str, params: Mapping[str, Any]) -> list[LoadPhase]:
    """The phases of a named pattern (ValueError on an unknown pattern or bad parameters)."""
    if pattern not in PATTERNS:
        raise ValueError(f"unknown workload pattern {pattern!r}; known: {', '.join(PATTERNS)}")
    model, build = PATTERNS[pattern]
    try:
        parsed = model.model_validate(dict(params))
    except ValidationError as e:
        bad = "; ".join(f"{'.'.join(str(x) for x in err['loc']) or '<params>'}: {err['msg']}" for err in e.errors())
        raise ValueError(f"pattern {pattern!r}: {bad}") from None
    return build(parsed)
