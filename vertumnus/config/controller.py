"""Window-based split / merge of workers (docs/design.md §2): the shared settings and one section per policy.

A config may carry both policy sections; the controller reads only the selected policy's (the other is there for
a policy override, e.g. the evaluation's controller ablation, which runs the rule controller on a predictive
config). Horizons are seconds; the ones the controller counts in windows must be whole windows.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from vertumnus.config._base import KeyedError, Section
from vertumnus.config.pool import SIM_SWITCH_S
from vertumnus.config.renamed import renamed_keys

_WHOLE = 1e-9  # relative tolerance of a whole number of windows (3 × 0.1 is not 0.3 in floating point)


def whole_windows(seconds: float, window_s: float) -> int | None:
    """``seconds`` as a count of ``window_s`` windows, or None when it is not a whole number of them."""
    n = round(seconds / window_s)
    return n if abs(n * window_s - seconds) <= _WHOLE * max(1.0, abs(seconds)) else None


class RulesConfig(Section):
    """The paper's utilisation / long-share thresholds (``controller.policy: rules``)."""

    theta_up: float = Field(0.8, gt=0, description="Split when utilisation ρ = D/K exceeds this.")
    theta_low: float = Field(0.3, ge=0, description="Merge when utilisation ρ falls below this.")
    delta_long: float = Field(
        0.1, ge=0, le=1, description="Reconfigure on a long-request-share change larger than this (within band)."
    )
    persist_windows: int = Field(2, ge=1, description="Windows a direction must hold before acting.")
    long_threshold_tokens: int = Field(
        32768, ge=1, description="A request with more input tokens is long (also the evaluation's long class)."
    )

    @model_validator(mode="after")
    def _band(self) -> RulesConfig:
        if self.theta_low >= self.theta_up:
            raise ValueError(f"theta_low ({self.theta_low}) must be below theta_up ({self.theta_up})")
        return self


class PredictiveConfig(Section):
    """The replay of recent arrivals on candidate compositions (``controller.policy: predictive``)."""

    # overload is answered within about this long instead of a window: docs/tuning.md#check_interval_s
    check_interval_s: float | None = Field(
        1.0, gt=0, description="Look for a split this often between window ends; None: at window ends only."
    )
    # long enough to average a steady load's noise, short enough to follow its changes: docs/tuning.md#span_s
    span_s: float = Field(10.0, gt=0, description="The forecast replays the arrivals of the last this many seconds.")
    # catches a burst that the span still averages away: docs/tuning.md#burst_span_s
    burst_span_s: float = Field(
        2.0, gt=0, description="A split also wins on this many seconds of arrivals repeated over the span."
    )
    switch_s: float = Field(
        SIM_SWITCH_S, ge=0, description="A move's switch price (seconds) until the engine's own switch is observed."
    )
    # a wider margin loses the splits that pay under load: docs/tuning.md#split_margin
    split_margin: float = Field(
        0.02, ge=0, lt=1, description="A split must cut the predicted mean TTFT by this fraction."
    )
    # keeps bursts of Poisson noise at a steady load from splitting: docs/tuning.md#burst_full_slack
    burst_full_slack: float | None = Field(
        0.02,
        ge=0,
        description="A burst-won split must predict ≤ (1 + this) × stay on the span forecast; None: the burst decides.",
    )
    # fewer moves for the same mean TTFT: docs/tuning.md#split_resamples
    split_resamples: int = Field(
        8, ge=0, le=64, description="A span-won split must beat staying on this many resamples of its mix; 0: off."
    )
    # fewer burst splits at a steady load, a pulse's split kept: docs/tuning.md#burst_resample_slack
    burst_resample_slack: float | None = Field(
        0.05,
        ge=0,
        description="A burst-won split must predict < (1 + this) × stay on each resample; None: not checked.",
    )
    # capacity is given away only for a clear gain: docs/tuning.md#merge_margin
    merge_margin: float = Field(
        0.05, ge=0, lt=1, description="A merge must cut the predicted mean TTFT by this fraction."
    )
    # one window's merge is noise, three wait too long: docs/tuning.md#merge_persist_s
    merge_persist_s: float = Field(
        10.0, gt=0, description="A merge must be wanted at every window end for this long (whole windows)."
    )
    # a remembered spike keeps the merge cautious: docs/tuning.md#merge_stress_memory_s
    merge_stress_memory_s: float = Field(
        30.0,
        ge=0,
        description="A merge must also win at the peak-over-mean load of this long (whole windows); 0: at the cap.",
    )
    # several merges at once were the flapping the next burst split back: docs/tuning.md#max_concurrent_merges
    max_concurrent_merges: int = Field(1, ge=1, description="Merges one decision may start together.")


class ControllerConfig(Section):
    enabled: bool = Field(True, description="Run window-based split / merge.")
    policy: Literal["rules", "predictive"] = Field(
        "predictive",
        description="predictive: replay recent arrivals on candidate compositions; rules: the paper's thresholds.",
    )
    # the window every predictive horizon was tuned at: docs/tuning.md#window_s
    window_s: float = Field(5.0, gt=0, description="Observation window H in seconds.")
    rules: RulesConfig = Field(
        default_factory=RulesConfig,
        description="Read only by policy rules (may stand beside policy predictive for a policy override).",
    )
    predictive: PredictiveConfig = Field(
        default_factory=PredictiveConfig,
        description="Read only by policy predictive (may stand beside policy rules for a policy override).",
    )

    @model_validator(mode="before")
    @classmethod
    def _former_keys(cls, data: Any) -> Any:
        if isinstance(data, dict) and (found := renamed_keys(data)):
            raise KeyedError(*found[0], *found[1:])
        return data

    @model_validator(mode="after")
    def _whole_windows(self) -> ControllerConfig:
        # The controller counts these horizons in windows (it decides merges at window ends only).
        if self.policy != "predictive":
            return self
        p, w = self.predictive, self.window_s
        bad = [
            (f"controller.predictive.{k}", f"{s:g} s is not a whole number of controller.window_s ({w:g} s) windows "
             f"(e.g. {w * (s // w):g} or {w * (s // w + 1):g})")
            for k, s in (("merge_persist_s", p.merge_persist_s), ("merge_stress_memory_s", p.merge_stress_memory_s))
            if whole_windows(s, w) is None
        ]  # fmt: skip
        if bad:
            raise KeyedError(*bad[0], *bad[1:])
        return self
