"""Run summaries, per-interval series and per-phase verdicts on hand-made columns."""

from __future__ import annotations

import numpy as np
import pytest

from vertumnus.eval.phase_stats import lower_bound_violations, phase_summaries, phase_verdicts
from vertumnus.sim.metrics import per_interval, summarize

NAN = float("nan")


def cols() -> dict[str, np.ndarray]:
    return {
        "arrival": np.array([0.0, 10.0, 70.0, 80.0]),
        "input_len": np.array([1000, 3000, 2000, 4000]),
        "slo": np.array([1.0, 1.0, 1.0, 1.0]),
        "cached": np.array([0, 1500, 0, 0]),
        "ttft": np.array([0.5, 2.0, 0.8, NAN]),  # the last one never completed
        "degree": np.array([4, 8, 4, 0]),
    }


def test_summary_counts_unfinished_as_misses() -> None:
    s = summarize(cols())
    assert (s["requests"], s["completed"]) == (4, 3)
    assert s["mean_ttft_s"] == pytest.approx((0.5 + 2.0 + 0.8) / 3)
    assert s["p50_ttft_s"] == pytest.approx(0.8)
    assert s["slo_attainment"] == pytest.approx(2 / 4)
    assert s["slo_attainment_token_weighted"] == pytest.approx(3000 / 10000)
    assert s["prefix_hit_rate_tokens"] == pytest.approx(1500 / 6000)  # completed requests only


def test_per_minute_series() -> None:
    iv = per_interval(cols(), 60.0)
    assert iv["start"].tolist() == [0.0, 60.0]
    assert iv["mean_ttft"].tolist() == pytest.approx([1.25, 0.8])
    assert iv["hit_rate"].tolist() == pytest.approx([1500 / 4000, 0.0])
    assert iv["count"].tolist() == [2.0, 1.0]


def test_phase_verdicts_pick_best_fixed_per_phase() -> None:
    bounds = [(0.0, 60.0), (60.0, 120.0)]
    v = phase_summaries(cols(), bounds)
    assert [p["requests"] for p in v] == [2, 2]
    fixed = {"A": [{"mean_ttft_s": 1.0}, {"mean_ttft_s": 3.0}], "B": [{"mean_ttft_s": 2.0}, {"mean_ttft_s": 0.4}]}
    verdicts = phase_verdicts(v, fixed)
    assert [(x.best_fixed, x.best_fixed_ttft) for x in verdicts] == [("A", 1.0), ("B", 0.4)]
    assert verdicts[0].ratio == pytest.approx(1.25) and verdicts[1].ratio == pytest.approx(2.0)


def test_lower_bound_violations_ignore_unfinished() -> None:
    lb = np.array([0.4, 2.5, 0.8, 0.1])
    assert lower_bound_violations(cols()["ttft"], lb) == 1  # request 2: 2.0 < 2.5
