"""docs/results.md section 7 (vertumnus.eval.report_profiles): the two shipped profiles' E_C curves compared.

Exact expectations from the two shipped profiles: under the calibrated one C=4 beats C=8 below ~10.6K tokens
(a large degree does not pay for short requests); under the AIConfigurator one C=8 is fastest at every length.
"""

from __future__ import annotations

from pathlib import Path

from vertumnus.eval.report_caveats import limits, profile_notice
from vertumnus.eval.report_profiles import ProfileRuns, curves_section, fastest_degree_ranges, render_section
from vertumnus.sim.inputs import load_cost, load_sim_config


def _runs() -> list[ProfileRuns]:
    cal, aic = load_sim_config(None), load_sim_config("configs/sim-40gpu-aic.yaml")
    return [
        ProfileRuns("calibrated", cal, load_cost(cal), [], None),
        ProfileRuns("AIConfigurator", aic, load_cost(aic), [], None),
    ]


def test_fastest_degree_per_length() -> None:
    cal, aic = (r.cost for r in _runs())
    assert fastest_degree_ranges(cal, [4, 8], 262144) == [(1, 10640, 4), (10641, 262144, 8)]
    assert fastest_degree_ranges(aic, [4, 8], 262144) == [(1, 262144, 8)]
    assert [c for _, _, c in fastest_degree_ranges(cal, [1, 2, 4, 8], 262144)] == [1, 2, 4, 8]


def test_curves_section_labels_and_plot(tmp_path: Path) -> None:
    md = curves_section(_runs(), tmp_path / "img", tmp_path)
    assert "| calibrated | `configs/profiles/qwen3-30b-a3b-h200.yaml` | **calibrated** |" in md
    assert "| AIConfigurator | `configs/profiles/qwen3-30b-a3b-h200-aic.yaml` | **modelled** |" in md
    # E_C(64K, 0) in ms, C=1..8, calibrated then AIC: the calibration's anchors (5,000 / 1,845 / 1,279 calibrated).
    row = next(ln for ln in md.splitlines() if ln.startswith("| 65,536 |"))
    assert row.split(" | ")[1::2] == ["5,000", "2,857", "1,845", "1,279"]
    assert "| calibrated | 3.50 | 3.50 | 3.50 | 3.50 | assumed (70% busy) |" in md
    assert "- AIConfigurator: C=8 for L 1–262,144" in md
    assert (tmp_path / "img" / "profiles_ec.png").read_bytes()[:4] == b"\x89PNG"
    assert "![E_C curves of the two profiles](img/profiles_ec.png)" in md


def test_section_without_runs_still_names_both_profiles(tmp_path: Path) -> None:
    md = render_section(_runs(), tmp_path / "img", tmp_path)
    assert md.startswith("## 7. Two cost profiles: calibrated and AIConfigurator")
    assert "Neither profile is measured on hardware" in md and "not re-tuned" in md


def test_a_report_under_the_modelled_profile_says_so() -> None:
    aic = _runs()[1]
    from vertumnus.eval.report import Report

    notice = profile_notice(Report(aic.cfg, aic.cost, [], None, [], {}))
    assert notice.startswith("> **The cost profile is modelled, not measured or calibrated.**")
    assert "measured prefill times" not in notice
    assert limits("modelled").startswith("- The cost profile is modelled (predicted kernel times, not measured)")
