"""The shipped AIConfigurator profile (configs/profiles/qwen3-30b-a3b-h200-aic.yaml) and the sim config using it.

The profile is labelled MODELLED (never measured or calibrated), it is reproducible from the samples committed
next to it, its samples are the SDK's own numbers (re-modelled here for a few points), and
configs/sim-40gpu-aic.yaml differs from configs/sim-40gpu.yaml in its cost profile only (thresholds not
re-tuned, so a comparison of the two holds everything else fixed).
"""

from __future__ import annotations

import pytest
import yaml

from vertumnus.config import REPO_ROOT, load_config
from vertumnus.cost_model import COEFFICIENTS, CostProfile
from vertumnus.profiling.aic_target import AicSpec, AicTarget
from vertumnus.profiling.fit import fit_profile
from vertumnus.profiling.measure import plot_path, read_samples, read_samples_header, samples_path

PROFILE = REPO_ROOT / "configs" / "profiles" / "qwen3-30b-a3b-h200-aic.yaml"
SIM = REPO_ROOT / "configs" / "sim-40gpu.yaml"
SIM_AIC = REPO_ROOT / "configs" / "sim-40gpu-aic.yaml"


def test_shipped_profile_is_modelled_and_reproducible() -> None:
    prof = CostProfile.load(PROFILE)
    assert (prof.source, prof.engine) == ("modelled", "aiconfigurator")
    assert prof.model == "Qwen/Qwen3-30B-A3B (bfloat16; MoE EP = C)"
    assert "AIConfigurator 0.12.0" in prof.hardware and "sglang 0.5.14" in prof.hardware
    assert "extrapolated above 16384 tokens" in prof.hardware
    assert prof.notes.startswith("MODELLED, NOT MEASURED OR CALIBRATED")
    assert PROFILE.read_text().startswith("# MODELLED, NOT MEASURED OR CALIBRATED")
    assert sorted(prof.degrees) == [1, 2, 4, 8] and prof.kappa_window_s == 5.0
    for c, d in prof.degrees.items():
        assert d.mape is not None and d.mape <= 0.15, c
        assert d.kappa is not None, c
    assert plot_path(PROFILE).read_bytes()[:4] == b"\x89PNG"
    header = read_samples_header(samples_path(PROFILE))
    assert (header["source"], header["engine"], header["model"]) == ("modelled", "aiconfigurator", prof.model)
    again, _ = fit_profile([m.sample() for m in read_samples(samples_path(PROFILE))])
    for c, d in prof.degrees.items():
        for name in (*COEFFICIENTS, "mape", "max_error"):
            assert getattr(again.degrees[c], name) == pytest.approx(getattr(d, name), rel=1e-9, abs=1e-15), (c, name)


def test_shipped_samples_are_the_sdks_numbers() -> None:
    rows = {(m.point.degree, m.point.r, m.point.p): m.seconds for m in read_samples(samples_path(PROFILE))}
    target = AicTarget(AicSpec("Qwen/Qwen3-30B-A3B", "h200_sxm", "sglang", "ep"))
    for key in ((1, 1024, 0), (4, 2048, 6144), (8, 65536, 0), (8, 49152, 147456)):
        target.setup(key[0])
        assert target.measure(*key) == pytest.approx(rows[key], rel=1e-9), key


def test_sim_config_differs_in_the_profile_only() -> None:
    base, aic = yaml.safe_load(SIM.read_text()), yaml.safe_load(SIM_AIC.read_text())
    assert aic["cost_model"].pop("profile") == "configs/profiles/qwen3-30b-a3b-h200-aic.yaml"
    base["cost_model"].pop("profile")
    assert aic == base
    assert "NOT re-tuned" in SIM_AIC.read_text() and "MODELLED, NOT MEASURED OR CALIBRATED" in SIM_AIC.read_text()
    cfg = load_config(SIM_AIC)
    assert CostProfile.load(cfg.resolve_path(cfg.cost_model.profile)).source == "modelled"
    assert set(cfg.pool.degrees) <= set(CostProfile.load(PROFILE).degrees)
