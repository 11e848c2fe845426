"""Cost model: formula, vectorisation, the calibrated H200 profile's published properties, and NNLS fitting."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from vertumnus.config import DEFAULT_PROFILE, REPO_ROOT
from vertumnus.cost_model import CostModel, CostProfile, DegreeProfile, attention_work
from vertumnus.profiling.fit import ProfileSample, fit_degree, fit_profile, nnls


def _model() -> CostModel:
    return CostModel(
        CostProfile(
            degrees={
                1: DegreeProfile(d=0.01, a=0.0, b=1e-6, c=2e-5, alpha=1e-9),
                4: DegreeProfile(d=0.05, a=1e-5, b=2e-6, c=2e-5, alpha=1e-9),
            }
        )
    )


def test_formula_by_hand() -> None:
    m = _model()
    r, p = 1000, 500
    w = 1000 * 500 + 1000 * 1001 / 2
    assert attention_work(r, p) == w
    assert m.predict(1, r, p) == pytest.approx(0.01 + 1e-6 * 500 + 2e-5 * 1000 + 1e-9 * w)
    assert m.predict(4, r, p) == pytest.approx(0.05 + 1e-5 * 1000 + 2e-6 * 500 + (2e-5 * 1000 + 1e-9 * w) / 4)


def test_vectorised_matches_scalar() -> None:
    m = _model()
    degs = np.array([1, 4, 4, 1])
    r = np.array([10, 2000, 70000, 1])
    p = np.array([0, 512, 4096, 100000])
    got = m.predict_many(degs, r, p)
    want = [m.predict(int(c), int(x), int(y)) for c, x, y in zip(degs, r, p, strict=True)]
    np.testing.assert_allclose(got, want, rtol=1e-12)
    np.testing.assert_allclose(
        m.predict_degree(4, r, p), [m.predict(4, int(x), int(y)) for x, y in zip(r, p, strict=True)]
    )


def test_unknown_degree_is_an_error() -> None:
    with pytest.raises(ValueError, match="no degree 8"):
        _model().predict(8, 10, 0)
    with pytest.raises(ValueError, match="no degree 2"):
        _model().predict_many([1, 2], [1, 1], [0, 0])


def test_calibrated_default_profile_properties() -> None:
    prof = CostProfile.load(REPO_ROOT / DEFAULT_PROFILE)
    assert prof.source == "calibrated"
    assert "not measured" in prof.notes
    m = CostModel(prof)
    assert sorted(m.degrees) == [1, 2, 4, 8]
    e1 = m.predict(1, 65536, 0)
    assert e1 == pytest.approx(5.0, rel=0.02)
    assert e1 / m.predict(4, 65536, 0) == pytest.approx(2.71, rel=0.02)
    assert e1 / m.predict(8, 65536, 0) == pytest.approx(3.91, rel=0.02)
    for r in (256, 512, 1024, 2048):
        assert m.predict(4, r, 0) >= m.predict(1, r, 0)
        assert m.predict(8, r, 0) >= m.predict(1, r, 0)


def test_profile_load_errors(tmp_path: Path) -> None:
    p = tmp_path / "p.yaml"
    p.write_text("degrees: {1: {d: 0, a: 0, b: 0, c: 0}}")
    with pytest.raises(ValueError, match="degree 1: missing"):
        CostProfile.load(p)
    p.write_text("degrees: {1: {d: -1, a: 0, b: 0, c: 0, alpha: 0}}")
    with pytest.raises(ValueError, match="must be finite and ≥ 0"):
        CostProfile.load(p)
    with pytest.raises(ValueError, match="not found"):
        CostProfile.load(tmp_path / "missing.yaml")


def test_profile_save_load_round_trip(tmp_path: Path) -> None:
    prof = _model().profile
    prof.degrees[1].kappa = 7.5
    prof.save(tmp_path / "x.yaml")
    again = CostProfile.load(tmp_path / "x.yaml")
    assert again.degrees == prof.degrees


def test_nnls_against_known_solution() -> None:
    a = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    b = np.array([2.0, -1.0, 1.0])
    x = nnls(a, b)
    # Unconstrained optimum has x2 < 0; with x ≥ 0 the optimum is x2 = 0, x1 = mean(2, 1) = 1.5.
    np.testing.assert_allclose(x, [1.5, 0.0], atol=1e-12)


def test_fit_recovers_planted_coefficients() -> None:
    planted = {
        1: DegreeProfile(d=0.01, a=0.0, b=2e-7, c=1.5e-5, alpha=2e-9),
        2: DegreeProfile(d=0.02, a=3e-6, b=4e-7, c=1.5e-5, alpha=2e-9),
    }
    model = CostModel(CostProfile(degrees=planted))
    samples = [
        ProfileSample(c, r, p, model.predict(c, r, p))
        for c in (1, 2)
        for r in (128, 512, 2048, 8192, 16384, 32768)
        for p in (0, 1024, 8192, 32768)
    ]
    profile, fits = fit_profile(samples, engine="test")
    assert profile.engine == "test" and [f.degree for f in fits] == [1, 2]
    for c in (1, 2):
        for name in ("d", "a", "b", "c", "alpha"):
            got, want = getattr(profile.degrees[c], name), getattr(planted[c], name)
            assert got == pytest.approx(want, rel=1e-4, abs=1e-12), (c, name)
        assert profile.degrees[c].mape is not None and profile.degrees[c].mape < 1e-6


def test_single_degree_fit_predicts_exactly() -> None:
    # Alone, degree 2 only identifies a + c/2: the fit must still predict exactly.
    planted = DegreeProfile(d=0.02, a=3e-6, b=4e-7, c=1.5e-5, alpha=2e-9)
    model = CostModel(CostProfile(degrees={2: planted}))
    grid = [(r, p) for r in (128, 2048, 16384, 32768) for p in (0, 1024, 32768)]
    fit = fit_degree(2, [ProfileSample(2, r, p, model.predict(2, r, p)) for r, p in grid])
    fitted = CostModel(CostProfile(degrees={2: fit.profile}))
    for r, p in grid:
        assert fitted.predict(2, r, p) == pytest.approx(model.predict(2, r, p), rel=1e-6)
    assert fit.profile.a == 0.0 and fit.profile.c == pytest.approx(2 * 3e-6 + 1.5e-5)


def test_fit_needs_enough_samples() -> None:
    with pytest.raises(ValueError, match="at least 5 samples"):
        fit_degree(1, [ProfileSample(1, 10, 0, 0.1)] * 3)
