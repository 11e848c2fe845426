"""`vertumnus bench profile-fit` (the timed fits moved out of the unit tests): its report, verdict and errors.

The benchmark itself times real engines, so it is not run here; this checks how it reads a result and that
bad arguments fail before anything starts."""

from __future__ import annotations

import pytest
import typer
from typer.testing import CliRunner

from vertumnus.bench.profile_fit import PRESETS, FitBenchResult, run_fit_bench
from vertumnus.cost_model import DegreeProfile
from vertumnus.profiling.fit import DegreeFit


def result(*mapes: float) -> FitBenchResult:
    fits = [DegreeFit(1 << i, DegreeProfile(0.01, 0, 0, 0, 0), 8, m, 2 * m, None) for i, m in enumerate(mapes)]
    return FitBenchResult("torch", "cpu", 0.15, fits, 16, 5, 21.94, "1.00", "2.00", "AMD EPYC, 2 cores; cpu clock")


def test_the_report_names_each_degrees_mape_and_the_verdict() -> None:
    good = result(0.0281, 0.0662)
    assert good.ok
    assert good.lines() == [
        "bench profile-fit: engine=torch C=1 samples=8 MAPE=2.81% max_error=5.62% (threshold 15%) ok",
        "bench profile-fit: engine=torch C=2 samples=8 MAPE=6.62% max_error=13.24% (threshold 15%) ok",
        "bench profile-fit: engine=torch 16 points × 5 repeats in 21.9 s (1-min load 1.00 → 2.00; AMD EPYC, 2 cores; "
        "cpu clock): PASS",
    ]
    bad = result(0.0281, 0.2)
    assert not bad.ok
    assert bad.lines()[1].endswith("(threshold 15%) ABOVE") and bad.lines()[2].endswith(": FAIL")


def test_presets_are_the_grids_the_tests_used_to_time() -> None:
    assert (PRESETS["torch"].spec.degrees, PRESETS["torch"].spec.lengths, PRESETS["torch"].timing) == (
        (1, 2),
        (512, 1024, 1536, 2048),
        "cpu",
    )
    assert (PRESETS["vllm"].spec.degrees, PRESETS["vllm"].spec.lengths) == ((1,), (256, 512, 1024, 2047))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"engine": "sim"}, "--engine must be one of torch, vllm"),
        ({"engine": "torch", "max_mape": 0.0}, "--max-mape must be > 0"),
        ({"engine": "torch", "repeats": 0}, "--repeats must be ≥ 1"),
    ],
)
def test_bad_arguments_fail_before_measuring(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        run_fit_bench(**kwargs)  # type: ignore[arg-type]


def test_the_command_is_registered() -> None:
    from vertumnus.cli import bench_profile_fit

    app, bench = typer.Typer(), typer.Typer()
    app.add_typer(bench, name="bench")
    bench_profile_fit.register(app, bench)
    res = CliRunner(env={"COLUMNS": "200"}).invoke(app, ["bench", "profile-fit", "--help"])
    assert res.exit_code == 0 and "--max-mape" in res.output
