"""The results report says where its cost profile comes from: a calibrated profile is flagged as not measured, a
measured one is not."""

from __future__ import annotations

from types import SimpleNamespace

from vertumnus.eval.report_caveats import limits, profile_notice


def _rep(source: str) -> SimpleNamespace:
    prof = SimpleNamespace(source=source, model="m", hardware="h")
    return SimpleNamespace(
        cost=SimpleNamespace(profile=prof), cfg=SimpleNamespace(cost_model=SimpleNamespace(profile="p.yaml"))
    )


def test_calibrated_profile_is_flagged() -> None:
    notice = profile_notice(_rep("calibrated"))  # type: ignore[arg-type]
    assert "calibrated, not measured" in notice and "`p.yaml`" in notice
    assert limits("calibrated").startswith("- The cost profile is calibrated")


def test_measured_profile_is_not_called_calibrated() -> None:
    notice = profile_notice(_rep("measured"))  # type: ignore[arg-type]
    assert "calibrated" not in notice and "vertumnus profile" in notice
    assert "calibrated" not in limits("measured").splitlines()[0]
