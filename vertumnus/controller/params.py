"""The controller's parameters: the one place in :mod:`vertumnus.controller` that reads the configuration.

Each policy gets a frozen, keyword-only parameter object built by ``from_config``; everything downstream (the
shell, the policies, the pure decision) reads these objects, never the config. Horizons are in seconds; where the
logic counts windows (persistence, the stress memory) the horizon must be a whole number of windows.

The module constants are knobs that did not beat the tuning set's noise: fixed values, each with one line of
why; the figures are in docs/tuning.md. ``PredictiveParams`` still carries them as fields (defaulting to the
constants) so that an experiment or a test can vary one without a config key.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from vertumnus.config import VertumnusConfig, whole_windows

# Splits one decision may start together: a burst far above capacity is answered at once.
# docs/tuning.md#max_concurrent_splits
MAX_CONCURRENT_SPLITS = 4
# Split checks this often from before the first arrival until STARTUP_SPAN_S after it: the start-up backlog
# outlasts a late first split. docs/tuning.md#startup_check_interval_s
STARTUP_CHECK_INTERVAL_S = 0.1
# How long after the pool's first arrival the start-up checks run. docs/tuning.md#startup_span_s
STARTUP_SPAN_S = 5.0
# A merge must also win at the forecast's rate × the observed swing, at most this. docs/tuning.md#merge_stress_max
MERGE_STRESS_MAX = 2.0
# A move's objective averages the forecast at (1 − u)×, 1× and (1 + u)× its rate: TTFT is convex in the load.
# docs/tuning.md#forecast_rate_spread
FORECAST_RATE_SPREAD = 0.2
# The forecast uses at least this many most recent arrivals, however old. docs/tuning.md#min_forecast_requests
MIN_FORECAST_REQUESTS = 32
# Span splits must hold on resamples of the forecast's mix once the pool is this old (the start-up's splits are
# left to the margins). docs/tuning.md#resample_after_s
RESAMPLE_AFTER_S = 15.0


def _windows(seconds: float, window_s: float, key: str) -> int:
    """``seconds`` as a count of ``window_s`` windows; ValueError naming ``key`` when it is not a whole number."""
    n = whole_windows(seconds, window_s)
    if n is None:
        raise ValueError(
            f"controller.predictive.{key} ({seconds:g} s) must be a whole number of windows "
            f"(controller.window_s {window_s:g} s)"
        )
    return n


@dataclass(frozen=True, slots=True, kw_only=True)
class ControllerParams:
    """What the controller shell reads, whatever the policy."""

    enabled: bool
    policy: Literal["rules", "predictive"]
    window_s: float  # the observation window
    long_threshold_tokens: int  # a request with more input tokens counts as long in the window reports
    switch_s: float  # a move's switch price until the engine's own switch has been observed

    @classmethod
    def from_config(cls, cfg: VertumnusConfig) -> ControllerParams:
        """Read ``controller.enabled / policy / window_s``, ``rules.long_threshold_tokens`` and
        ``predictive.switch_s``."""
        cc = cfg.controller
        return cls(
            enabled=cc.enabled, policy=cc.policy, window_s=cc.window_s,
            long_threshold_tokens=cc.rules.long_threshold_tokens, switch_s=cc.predictive.switch_s,
        )  # fmt: skip


@dataclass(frozen=True, slots=True, kw_only=True)
class RulesParams:
    """The rule policy's thresholds (docs/design.md §2); ``theta_*``/``delta_long`` also label every window report."""

    theta_up: float
    theta_low: float
    delta_long: float
    persist_windows: int

    @classmethod
    def from_config(cls, cfg: VertumnusConfig) -> RulesParams:
        """Read ``controller.rules``."""
        rc = cfg.controller.rules
        return cls(
            theta_up=rc.theta_up, theta_low=rc.theta_low, delta_long=rc.delta_long, persist_windows=rc.persist_windows
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class PredictiveParams:
    """Everything the predictive policy and its decision read (the pool's shape included)."""

    window_s: float  # the observation window (window ends decide merges)
    degrees: tuple[int, ...]  # the lattice's CP degrees, ascending
    beta: float  # the scheduler's J = (β + λ·(C − C_min)/C_min)·Ê: the replay places by the same rule
    lam: float
    check_interval_s: float | None  # split checks between window ends; None: at window ends only
    span_s: float  # the forecast span: the arrivals of the last span_s seconds
    burst_span_s: float  # the burst forecast: the last burst_span_s seconds, repeated over the span
    switch_s: float  # a move's switch price until the engine's own switch has been observed
    split_margin: float  # a split (span or burst) must cut the predicted mean TTFT by this fraction
    burst_full_slack: float | None  # a burst split may lose on the span by at most this (None: unchecked)
    split_resamples: int  # bootstrap resamples of the forecast's mix a split must hold on (0: none)
    burst_resample_slack: float | None  # a burst split may lose on a resample by at most this (None: unchecked)
    merge_margin: float  # a merge must cut the predicted mean TTFT by this fraction
    merge_persist_s: float  # ... and be wanted at every window end for this long
    merge_stress_memory_s: float  # the window demands the merge stress is sized by (0: always the maximum)
    max_concurrent_merges: int  # merges one decision may start together
    max_concurrent_splits: int = MAX_CONCURRENT_SPLITS
    startup_check_interval_s: float | None = STARTUP_CHECK_INTERVAL_S  # None: check_interval_s throughout
    startup_span_s: float = STARTUP_SPAN_S
    merge_stress_max: float = MERGE_STRESS_MAX
    forecast_rate_spread: float = FORECAST_RATE_SPREAD
    min_forecast_requests: int = MIN_FORECAST_REQUESTS
    resample_after_s: float = RESAMPLE_AFTER_S

    def __post_init__(self) -> None:
        # checked once here, so that a horizon that is not a whole number of windows fails at load
        self.merge_persist_windows  # noqa: B018
        self.merge_stress_windows  # noqa: B018

    @property
    def merge_persist_windows(self) -> int:
        """Window ends in a row a merge must be wanted at (at least 1)."""
        return max(1, _windows(self.merge_persist_s, self.window_s, "merge_persist_s"))

    @property
    def merge_stress_windows(self) -> int:
        """Window demands the merge stress remembers (0: none, the stress is always ``merge_stress_max``)."""
        return _windows(self.merge_stress_memory_s, self.window_s, "merge_stress_memory_s")

    @property
    def span_windows(self) -> int:
        """The forecast span in windows, rounded (at least 1): the recent demand the stress compares with."""
        return max(1, round(self.span_s / self.window_s))

    @classmethod
    def from_config(cls, cfg: VertumnusConfig) -> PredictiveParams:
        """Read the predictive policy's keys of ``controller`` (and the scheduler's β, λ, the pool's degrees)."""
        cc, pc = cfg.controller, cfg.controller.predictive
        return cls(
            window_s=cc.window_s,
            degrees=tuple(sorted(cfg.pool.degrees)),
            beta=cfg.scheduler.beta,
            lam=cfg.scheduler.lam,
            check_interval_s=pc.check_interval_s,
            span_s=pc.span_s,
            burst_span_s=pc.burst_span_s,
            switch_s=pc.switch_s,
            split_margin=pc.split_margin,
            burst_full_slack=pc.burst_full_slack,
            split_resamples=pc.split_resamples,
            burst_resample_slack=pc.burst_resample_slack,
            merge_margin=pc.merge_margin,
            merge_persist_s=pc.merge_persist_s,
            merge_stress_memory_s=pc.merge_stress_memory_s,
            max_concurrent_merges=pc.max_concurrent_merges,
        )
