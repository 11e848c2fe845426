"""`vertumnus profile --engine sim`: the whole flow recovers planted coefficients; refusal; --show; bad input."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from vertumnus.config import load_config
from vertumnus.cost_model import COEFFICIENTS, CostModel, CostProfile, DegreeProfile
from vertumnus.profiling.flow import FitRejected, ProfileOptions, run_profile
from vertumnus.profiling.measure import GridSpec, read_samples
from vertumnus.profiling.targets import SimTarget

LENGTHS = "256,1024,4096,16384,65536"


def test_sim_flow_recovers_planted_coefficients(
    tmp_path: Path,
    planted_config: Path,
    planted: dict[int, DegreeProfile],
    excerpt: Path,
    runner: CliRunner,
    cli_app: typer.Typer,
) -> None:
    out = tmp_path / "profiles" / "planted-fit.yaml"
    args = ["profile", "--engine", "sim", "--config", str(planted_config), "--degrees", "1,2,4"]
    args += ["--lengths", LENGTHS, "--prefix-ratios", "0,0.25,0.5,0.75", "--repeats", "3", "--warmup", "1"]
    args += ["--trace", str(excerpt), "--out", str(out)]
    res = runner.invoke(cli_app, args)
    assert res.exit_code == 0, res.output
    prof = CostProfile.load(out)
    assert (prof.engine, prof.source) == ("sim", "simulated")
    assert sorted(prof.degrees) == [1, 2, 4]
    for c, want in planted.items():
        got = prof.degrees[c]
        for name in COEFFICIENTS:
            assert getattr(got, name) == pytest.approx(getattr(want, name), rel=1e-6, abs=1e-15), (c, name)
        assert got.mape is not None and got.mape < 1e-9
        assert got.max_error is not None and got.max_error < 1e-9
        assert got.kappa is not None and 0 < got.kappa <= prof.kappa_window_s
    # Samples CSV: one median row per grid point (5 lengths × 4 ratios × 3 degrees), next to the profile.
    rows = read_samples(out.with_name("planted-fit.samples.csv"))
    assert len(rows) == 60 and {m.repeats for m in rows} == {3}
    model = CostModel(prof)
    for m in rows:
        assert m.point.r + m.point.p == m.point.length
        assert m.seconds == pytest.approx(model.predict(m.point.degree, m.point.r, m.point.p), rel=1e-9)
    columns = ["degree", "length", "prefix_ratio", "r", "p", "seconds"]
    with out.with_name("planted-fit.samples.csv").open() as f:  # provenance comment lines, then the columns
        assert next(csv.reader(ln for ln in f if not ln.startswith("#")))[:6] == columns
    assert out.with_name("planted-fit.fit.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "planted-fit.yaml" in res.output and "MAPE" in res.output


class _BentTarget(SimTarget):
    """The planted model, except that long prompts with a cached prefix take 3× longer (a region it cannot fit)."""

    def measure(self, degree: int, r: int, p: int) -> float:
        e = SimTarget.measure(self, degree, r, p)
        return 3.0 * e if p > 0 and r + p > 4096 else e


def test_max_mape_refusal_names_degree_and_region(tmp_path: Path, planted_config: Path) -> None:
    cfg = load_config(planted_config)
    target = _BentTarget(CostProfile.load(cfg.resolve_path(cfg.cost_model.profile)))
    spec = GridSpec(degrees=(1, 2), lengths=(256, 1024, 4096, 16384, 65536), prefix_ratios=(0.0, 0.5), repeats=1)
    out = tmp_path / "bent.yaml"
    with pytest.raises(FitRejected) as err:
        run_profile(target, spec, cfg, ProfileOptions(out, max_mape=0.15))
    msg = str(err.value)
    assert len(err.value.lines) == 2
    assert err.value.lines[0].startswith("degree 1: MAPE")
    assert err.value.lines[1].startswith("degree 2: MAPE")
    assert "worst region long/prefix" in msg and "use --force" in msg
    assert not out.exists()  # no profile ...
    assert out.with_name("bent.samples.csv").exists() and out.with_name("bent.fit.png").exists()  # ... but evidence
    # --force writes it, recording why it was forced.
    run = run_profile(target, spec, cfg, ProfileOptions(out, max_mape=0.15, force=True))
    assert CostProfile.load(out).notes == run.profile.notes and "written with --force" in run.profile.notes


def test_show_prints_the_profile(tmp_path: Path, runner: CliRunner, cli_app: typer.Typer) -> None:
    res = runner.invoke(cli_app, ["profile", "--show", "configs/profiles/qwen3-30b-a3b-h200.yaml"])
    assert res.exit_code == 0, res.output
    for text in ("qwen3-30b-a3b-h200.yaml", "source: calibrated", "Qwen3-30B-A3B", "NVIDIA H200", "alpha", "κ/10s"):
        assert text in res.output
    assert "not measured" in res.output  # the notes follow the table
    # One row per degree: C, five coefficients, MAPE and max error unknown (calibrated: dashes), κ = 7.
    rows = [ln.split() for ln in res.output.splitlines() if ln.split()[:1] in (["1"], ["2"], ["4"], ["8"])]
    assert [r[0] for r in rows] == ["1", "2", "4", "8"]
    assert rows[0][1:] == ["0.02", "0", "5e-07", "1.6e-05", "1.83e-09", "—", "—", "7"]
    assert all(r[-3:] == ["—", "—", "7"] and len(r) == 9 for r in rows)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--degrees", "1,3"], "--degrees must be powers of two"),
        (["--degrees", "1,x"], "--degrees: expected comma-separated integers"),
        (["--prefix-ratios", "0,1.0"], "--prefix-ratios must lie in [0, 1)"),
        (["--lengths", "256,131072"], "exceed what the engine runs (max 65536 tokens)"),
        (["--engine", "tpu"], "unknown engine 'tpu'"),
        (["--noise", "-1"], "--noise must be ≥ 0"),
        (["--repeats", "0"], "--repeats must be ≥ 1"),
        (["--max-mape", "0"], "--max-mape must be > 0"),
        (["--capacity-engine", "guess"], "--capacity-engine must be one of model, real"),
        (["--trace", "no/such/trace.jsonl"], "trace file not found"),
        (["--degrees", "8"], "cost profile has no degree 8"),
    ],
)
def test_bad_input_is_a_clear_error(
    tmp_path: Path, planted_config: Path, runner: CliRunner, cli_app: typer.Typer, extra: list[str], message: str
) -> None:
    base = ["profile", "--engine", "sim", "--config", str(planted_config), "--out", str(tmp_path / "x.yaml")]
    res = runner.invoke(cli_app, [*base, "--lengths", "256,1024", "--trace", "", *extra])
    assert isinstance(res.exception, ValueError), res.output
    assert message in str(res.exception)
    assert not (tmp_path / "x.yaml").exists()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["profile", "--engine", "sim"], "--out is required"),
        (["profile", "--show", "no/such/profile.yaml"], "cost profile not found"),
        (["profile", "--engine", "sim", "--out", "p.txt"], "--out must name a .yaml file"),
    ],
)
def test_cli_usage_errors(runner: CliRunner, cli_app: typer.Typer, argv: list[str], message: str) -> None:
    # vertumnus.cli.main.main() turns these ValueErrors into "error: ..." and exit code 2.
    res = runner.invoke(cli_app, argv)
    assert isinstance(res.exception, ValueError) and message in str(res.exception)


def test_bench_profile_prints_the_figures(planted_config: Path, runner: CliRunner, cli_app: typer.Typer) -> None:
    args = [
        "bench",
        "profile",
        "--engine",
        "sim",
        "--config",
        str(planted_config),
        "--degrees",
        "1,2",
        "--repeats",
        "1",
    ]
    res = runner.invoke(cli_app, args)
    assert res.exit_code == 0, res.output
    lines = [ln for ln in res.output.splitlines() if ln.startswith("bench profile:")]
    assert lines[:2] == [
        "bench profile: engine=sim C=1 MAPE=0.00% max_error=0.00%",
        "bench profile: engine=sim C=2 MAPE=0.00% max_error=0.00%",
    ]
    assert lines[2].startswith("bench profile: 16 points × 1 repeats in ")


def test_capacity_engine_real_through_the_cli(
    tmp_path: Path, planted_config: Path, excerpt: Path, runner: CliRunner, cli_app: typer.Typer
) -> None:
    base = ["profile", "--engine", "sim", "--config", str(planted_config), "--degrees", "1,2", "--lengths", LENGTHS]
    base += ["--repeats", "1", "--trace", str(excerpt), "--capacity-requests", "30"]
    kappas = {}
    for engine in ("model", "real"):
        out = tmp_path / f"{engine}.yaml"
        res = runner.invoke(cli_app, [*base, "--capacity-engine", engine, "--out", str(out)])
        assert res.exit_code == 0, res.output
        prof = CostProfile.load(out)
        assert f"kappa: {engine} service times, 30 requests of conversation_excerpt.jsonl" in prof.notes
        kappas[engine] = {c: p.kappa for c, p in prof.degrees.items()}
    # the noiseless sim engine serves in exactly Ê, so timing it gives the model's κ
    assert kappas["real"] == kappas["model"] and all(k is not None and k > 0 for k in kappas["model"].values())


def test_refit_from_samples_with_another_statistic(tmp_path: Path, planted_config: Path) -> None:
    cfg = load_config(planted_config)
    target = SimTarget(CostProfile.load(cfg.resolve_path(cfg.cost_model.profile)), noise=0.2, seed=3)
    spec = GridSpec(degrees=(1, 2), lengths=(256, 1024, 4096, 16384, 65536), prefix_ratios=(0.0, 0.5), repeats=5)
    first = run_profile(target, spec, cfg, ProfileOptions(tmp_path / "a.yaml", force=True))
    csv_a = tmp_path / "a.samples.csv"
    assert [m.seconds for m in read_samples(csv_a)] == [m.median_s for m in first.measurements]
    spec_min = GridSpec(degrees=(1,), lengths=(2,), repeats=1, statistic="min")  # grid ignored with samples
    again = run_profile(target, spec_min, cfg, ProfileOptions(tmp_path / "b.yaml", force=True, from_samples=csv_a))
    assert [m.point for m in again.measurements] == [m.point for m in first.measurements]
    assert [m.seconds for m in again.measurements] == [m.min_s for m in first.measurements]
    assert "re-fitted from a.samples.csv" in CostProfile.load(tmp_path / "b.yaml").notes
    assert again.profile.degrees[1].d != first.profile.degrees[1].d  # a different statistic, a different fit
