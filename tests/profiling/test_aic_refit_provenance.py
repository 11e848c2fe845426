"""`vertumnus profile --from-samples X.samples.csv` keeps the samples' provenance (issue 11, item 7).

The bug: a re-fit was labelled with the metadata of the target the command line built — by default the sim
engine over the *config's* profile — e.g. ``source: simulated · engine: sim · hardware: simulated (NVIDIA H200
(calibrated, not measured))`` for samples that came from somewhere else. Now the samples CSV carries its labels
in a ``# key: value`` header, a re-fit takes them from there (``--source/--engine/--model/--hardware`` override
one label each), and a CSV without a header is labelled ``unknown``, never borrowed. (The AIConfigurator case —
a modelled profile re-fitted — is in test_aic_target.py.)
"""

from __future__ import annotations

from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from vertumnus.config import REPO_ROOT
from vertumnus.cost_model import CostProfile
from vertumnus.profiling.measure import read_samples, read_samples_header

# The config whose current profile is the calibrated one: the labels that used to leak into re-fits.
CALIBRATED_CONFIG = REPO_ROOT / "configs" / "sim-40gpu.yaml"
GRID = ["--degrees", "1,2", "--lengths", "256,1024,4096,16384", "--prefix-ratios", "0,0.5", "--repeats", "1"]


@pytest.fixture
def planted_samples(tmp_path: Path, planted_config: Path, runner: CliRunner, cli_app: typer.Typer) -> Path:
    """Samples the sim engine took over the *planted* profile (labels: sim / simulated / the planted model)."""
    out = tmp_path / "planted.yaml"
    args = ["profile", "--engine", "sim", "--config", str(planted_config), *GRID, "--trace", "", "--out", str(out)]
    res = runner.invoke(cli_app, args)
    assert res.exit_code == 0, res.output
    return out.with_name("planted.samples.csv")


def _refit(runner: CliRunner, app: typer.Typer, samples: Path, out: Path, *extra: str) -> CostProfile:
    args = ["profile", "--config", str(CALIBRATED_CONFIG), "--from-samples", str(samples), "--trace", ""]
    res = runner.invoke(app, [*args, *extra, "--out", str(out)])
    assert res.exit_code == 0, res.output
    return CostProfile.load(out)


def test_refit_is_labelled_with_the_samples_provenance_not_the_configs(
    tmp_path: Path, planted_samples: Path, runner: CliRunner, cli_app: typer.Typer
) -> None:
    planted = CostProfile.load(planted_samples.with_name("planted.yaml"))
    assert (planted.source, planted.engine) == ("simulated", "sim")
    assert planted.model == "unknown (cost profile, measured)" and planted.hardware == "simulated (unknown)"
    refit = _refit(runner, cli_app, planted_samples, tmp_path / "refit.yaml")
    # Before the fix: model "Qwen3-30B-A3B (cost profile, calibrated)", hardware "simulated (NVIDIA H200
    # (calibrated, not measured))" — the labels of the config's profile, which produced none of these samples.
    labels = ("source", "engine", "model", "hardware")
    assert [getattr(refit, k) for k in labels] == [getattr(planted, k) for k in labels]
    assert f"re-fitted from planted.samples.csv, taken {planted.date}" in refit.notes
    # The re-fit's own samples CSV keeps the labels too (a re-fit of a re-fit stays labelled).
    assert read_samples_header(tmp_path / "refit.samples.csv") == read_samples_header(planted_samples)
    assert read_samples(tmp_path / "refit.samples.csv") == read_samples(planted_samples)


def test_flags_override_single_labels(
    tmp_path: Path, planted_samples: Path, runner: CliRunner, cli_app: typer.Typer
) -> None:
    refit = _refit(
        runner,
        cli_app,
        planted_samples,
        tmp_path / "relabelled.yaml",
        "--source",
        "measured",
        "--hardware",
        "NVIDIA H200 (8× SXM, lab rack 3)",
    )
    assert (refit.source, refit.hardware) == ("measured", "NVIDIA H200 (8× SXM, lab rack 3)")
    assert (refit.engine, refit.model) == ("sim", "unknown (cost profile, measured)")  # from the CSV header
    assert (
        "provenance: labels set on the command line (hardware=NVIDIA H200 (8× SXM, lab rack 3), source=measured)"
        in (refit.notes)
    )


def test_a_csv_without_provenance_is_labelled_unknown(
    tmp_path: Path, planted_samples: Path, runner: CliRunner, cli_app: typer.Typer
) -> None:
    bare = tmp_path / "bare.samples.csv"  # as written before the header existed (or by hand)
    bare.write_text("".join(ln for ln in planted_samples.read_text().splitlines(True) if not ln.startswith("#")))
    assert read_samples_header(bare) == {}
    refit = _refit(runner, cli_app, bare, tmp_path / "bare.yaml")
    assert (refit.source, refit.engine, refit.model, refit.hardware) == ("unknown",) * 4
    assert "provenance: source, engine, model, hardware not recorded in bare.samples.csv" in refit.notes
    res = runner.invoke(cli_app, ["profile", "--show", str(tmp_path / "bare.yaml")])
    assert res.exit_code == 0 and "PROVENANCE UNKNOWN" in res.output


def test_labels_need_from_samples(
    tmp_path: Path, planted_config: Path, runner: CliRunner, cli_app: typer.Typer
) -> None:
    args = ["profile", "--engine", "sim", "--config", str(planted_config), "--source", "measured"]
    res = runner.invoke(cli_app, [*args, "--out", str(tmp_path / "x.yaml")])
    assert isinstance(res.exception, ValueError) and "apply to --from-samples only" in str(res.exception)
