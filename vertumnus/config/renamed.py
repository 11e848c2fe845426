"""Keys of the former flat ``controller`` section: where each went, for an error that names the new key."""

from __future__ import annotations

_RULES = ("theta_up", "theta_low", "delta_long", "persist_windows", "long_threshold_tokens")
_PREDICTIVE = (
    "check_interval_s", "split_margin", "split_resamples", "burst_resample_slack", "merge_margin",
    "max_concurrent_merges",
)  # fmt: skip

# old controller key -> what to write instead (one line each)
RENAMED: dict[str, str] = {
    **{k: f"moved to controller.rules.{k}" for k in _RULES},
    **{k: f"moved to controller.predictive.{k}" for k in _PREDICTIVE},
    "headroom": "moved to pool.initial_headroom",
    "history_trace": "moved to pool.history_trace",
    "switch_s": "split in two: controller.predictive.switch_s (a move's price until the engine's switch is "
    "observed) and pool.sim_switch_s (the simulated engine's switch)",
    "lookback_windows": "now controller.predictive.span_s, in seconds (lookback_windows × window_s)",
    "burst_lookback_s": "renamed controller.predictive.burst_span_s",
    "burst_split_full_slack": "renamed controller.predictive.burst_full_slack",
    "merge_persist_windows": "now controller.predictive.merge_persist_s, in seconds (windows × window_s)",
    "merge_stress_windows": "now controller.predictive.merge_stress_memory_s, in seconds (windows × window_s)",
    "burst_split_margin": "removed: a split won on the burst forecast uses controller.predictive.split_margin",
    "max_concurrent_ops": "removed: a constant of the controller (MAX_CONCURRENT_SPLITS)",
    "startup_check_interval_s": "removed: a constant of the controller (STARTUP_CHECK_INTERVAL_S)",
    "startup_span_s": "removed: a constant of the controller (STARTUP_SPAN_S)",
    "merge_stress": "removed: a constant of the controller (MERGE_STRESS_MAX)",
    "forecast_rate_spread": "removed: a constant of the controller (FORECAST_RATE_SPREAD)",
    "min_forecast_requests": "removed: a constant of the controller (MIN_FORECAST_REQUESTS)",
    "split_resample_after_s": "removed: a constant of the controller (RESAMPLE_AFTER_S)",
    "switch_from_observed": "removed: a move's switch is always priced at the switches observed",
    "wait_for_min_forecast": "removed: always on",
    "split_persist_windows": "removed: a split acts at once",
    "split_while_reconfiguring": "removed: no split is decided while a reconfiguration runs",
    "merge_patient_margin": "removed (patient merges)",
    "merge_patient_windows": "removed (patient merges)",
}


def renamed_keys(section: dict[str, object]) -> list[tuple[str, str]]:
    """``(controller.<old key>, where it went)`` for every former flat key in a raw ``controller`` mapping."""
    return [(f"controller.{k}", RENAMED[k]) for k in section if isinstance(k, str) and k in RENAMED]
