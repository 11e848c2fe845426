"""The embedded default (configs/local.yaml) uses a profile MEASURED on the torch engine, and that profile is
reproducible from the samples committed next to it."""

from __future__ import annotations

import pytest

from vertumnus.config import REPO_ROOT, load_config
from vertumnus.cost_model import COEFFICIENTS, CostModel, CostProfile
from vertumnus.profiling.fit import fit_profile
from vertumnus.profiling.measure import plot_path, read_samples, samples_path


def test_local_default_uses_a_measured_torch_profile() -> None:
    cfg = load_config(REPO_ROOT / "configs" / "local.yaml")
    path = cfg.resolve_path(cfg.cost_model.profile)
    prof = CostProfile.load(path)
    assert (prof.source, prof.engine) == ("measured", "torch")
    assert sorted(prof.degrees) == cfg.pool.degrees  # κ is scaled to controller.window_s (CostModel.kappa)
    for c, d in prof.degrees.items():
        assert d.mape is not None and d.mape <= 0.15, c
        assert d.kappa is not None and 0 < d.kappa <= prof.kappa_window_s, c
    kappa_4 = prof.degrees[4].kappa
    assert kappa_4 is not None and CostModel(prof).kappa(4, 1.0) == pytest.approx(kappa_4 / prof.kappa_window_s)
    assert plot_path(path).read_bytes()[:4] == b"\x89PNG"
    # Re-fitting the committed samples gives the committed coefficients and errors.
    again, _ = fit_profile([m.sample() for m in read_samples(samples_path(path))])
    for c, d in prof.degrees.items():
        for name in (*COEFFICIENTS, "mape", "max_error"):
            assert getattr(again.degrees[c], name) == pytest.approx(getattr(d, name), rel=1e-9, abs=1e-15), (c, name)
