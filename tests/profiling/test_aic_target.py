"""`vertumnus profile --engine aiconfigurator`: AIConfigurator's SDK as a profiling target (modelled, not measured).

The real SDK (``vertumnus[aic]``, installed by ``make setup``) runs every test here: a tiny grid through the whole
flow (fit, κ, files), the provenance labels on the profile, its samples CSV, ``profile --show`` and a re-fit,
and the refusals a user meets (unknown model / system / backend / version, CP on a backend AIC does not model it
for, a prompt that does not fit in memory, the extra not installed) — each a message and exit code 2.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from vertumnus.config import REPO_ROOT
from vertumnus.cost_model import CostProfile
from vertumnus.profiling.aic_target import AicError, AicSpec, AicTarget
from vertumnus.profiling.measure import read_samples, read_samples_header

MODEL = "Qwen/Qwen3-30B-A3B"
CONFIG = REPO_ROOT / "configs" / "sim-40gpu.yaml"
EXCERPT = REPO_ROOT / "tests" / "data" / "conversation_excerpt.jsonl"
GRID = ["--degrees", "1,2", "--lengths", "1024,4096,16384,32768", "--prefix-ratios", "0,0.5"]
# AIConfigurator 0.12.0, h200_sxm, SGLang 0.5.14, bf16, MoE EP = C: modelled ms of (C, L, P) points of GRID.
EXPECTED_MS = {
    (1, 1024, 0): 27.373,
    (1, 16384, 8192): 219.615,
    (1, 32768, 0): 1041.752,
    (2, 1024, 512): 19.602,
    (2, 4096, 0): 63.098,
    (2, 32768, 16384): 451.005,
}


@pytest.fixture(scope="module")
def aic_profile(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The tiny grid profiled once through the CLI (with κ on the trace excerpt): (profile path, output)."""
    from vertumnus.cli import profile_cmd

    app = typer.Typer(pretty_exceptions_enable=False)
    bench = typer.Typer()
    app.add_typer(bench, name="bench")
    profile_cmd.register(app, bench)
    out = tmp_path_factory.mktemp("aic") / "qwen-aic.yaml"
    args = ["profile", "--engine", "aiconfigurator", "--model", MODEL, "--system", "h200_sxm", "--backend", "sglang"]
    args += ["--config", str(CONFIG), *GRID, "--repeats", "1", "--warmup", "0", "--trace", str(EXCERPT)]
    res = CliRunner(env={"COLUMNS": "200"}).invoke(app, [*args, "--out", str(out)])
    assert res.exit_code == 0, res.output
    return out, res.output


def test_tiny_grid_through_the_flow(aic_profile: tuple[Path, str]) -> None:
    out, output = aic_profile
    rows = read_samples(out.with_name("qwen-aic.samples.csv"))
    assert len(rows) == 16 and {m.repeats for m in rows} == {1}  # 2 degrees × 4 lengths × 2 prefix ratios
    got = {(m.point.degree, m.point.length, m.point.p): m.seconds for m in rows}
    for key, ms in EXPECTED_MS.items():
        assert got[key] == pytest.approx(ms / 1000, rel=1e-4), key
    # The model's shape: a cached prefix is cheaper than computing it, CP2 is faster than one GPU.
    assert got[(1, 32768, 16384)] < got[(1, 32768, 0)]
    assert all(got[(2, n, p)] < got[(1, n, p)] for (c, n, p) in got if c == 1)
    prof = CostProfile.load(out)
    assert sorted(prof.degrees) == [1, 2]
    for deg in prof.degrees.values():  # fitted within the project's threshold (no --force) and κ computed
        assert deg.mape is not None and deg.mape < 0.15
        assert deg.kappa is not None and 0 <= deg.kappa <= prof.kappa_window_s
    # One GPU misses the SLO on the excerpt's 100K-token prompts at any load (κ = 0); CP2 serves some demand.
    k1, k2 = prof.degrees[1].kappa, prof.degrees[2].kappa
    assert k1 is not None and k2 is not None and k1 == 0.0 < k2
    assert prof.kappa_window_s == 5.0  # the config's controller window
    assert out.with_name("qwen-aic.fit.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "qwen-aic.yaml" in output


def test_profile_is_labelled_modelled(aic_profile: tuple[Path, str]) -> None:
    out, output = aic_profile
    prof = CostProfile.load(out)
    assert (prof.source, prof.engine) == ("modelled", "aiconfigurator")
    assert prof.model == "Qwen/Qwen3-30B-A3B (bfloat16; MoE EP = C)"
    assert prof.hardware == (
        "h200_sxm (modelled by AIConfigurator 0.12.0 from its sglang 0.5.14 silicon data, extrapolated above "
        "16384 tokens; not measured)"
    )
    notes = prof.notes.splitlines()
    assert notes[0].startswith("MODELLED, NOT MEASURED OR CALIBRATED: prefill times predicted by NVIDIA ")
    assert (
        "AIConfigurator 0.12.0 (aiconfigurator-core 0.12.0) from its silicon database h200_sxm/sglang/0.5.14"
        in (notes[0])
    )
    assert notes[1] == ("aic layouts: C=1: TP1, MoE EP1; C=2: CP2 (allgather), TP1, MoE EP2; precision: bfloat16")
    assert notes[2] == (
        "aic data: silicon data up to 16384 tokens (context attention ≤ 16384, MoE ≤ 16384); extrapolated above "
        "16384 tokens (attention quadratically); kernel sums without framework overhead (optimistic)"
    )
    assert "measured" not in prof.source and "calibrated" not in prof.source
    text = out.read_text()
    assert text.startswith("# MODELLED, NOT MEASURED OR CALIBRATED: prefill times of Qwen/Qwen3-30B-A3B")
    # The samples CSV carries the same labels (a re-fit keeps them).
    header = read_samples_header(out.with_name("qwen-aic.samples.csv"))
    assert (header["source"], header["engine"], header["model"]) == ("modelled", "aiconfigurator", prof.model)
    assert header["hardware"] == prof.hardware
    assert header["note"] == notes[:3]
    # The report printed after profiling says so.
    assert "source: modelled" in output
    assert "MODELLED by aiconfigurator, NOT MEASURED OR CALIBRATED" in output


def test_show_says_modelled(aic_profile: tuple[Path, str], capsys: pytest.CaptureFixture[str]) -> None:
    out, _ = aic_profile
    code, printed = _main(["profile", "--show", str(out)], capsys)
    assert code == 0
    assert "source: modelled · engine: aiconfigurator" in printed
    assert "MODELLED by aiconfigurator, NOT MEASURED OR CALIBRATED" in printed
    assert "extrapolated above 16384 tokens" in printed


def test_refit_keeps_the_modelled_labels(
    aic_profile: tuple[Path, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, _ = aic_profile
    again = tmp_path / "again.yaml"
    # The config's own profile is the calibrated one: its labels must not leak into the re-fit.
    args = ["profile", "--config", str(CONFIG), "--from-samples", str(out.with_name("qwen-aic.samples.csv"))]
    code, printed = _main([*args, "--trace", "", "--out", str(again)], capsys)
    assert code == 0, printed
    first, refit = CostProfile.load(out), CostProfile.load(again)
    assert (refit.source, refit.engine, refit.model, refit.hardware) == (
        first.source,
        first.engine,
        first.model,
        first.hardware,
    )
    assert refit.notes.splitlines()[:3] == first.notes.splitlines()[:3]
    assert again.read_text().startswith("# MODELLED, NOT MEASURED OR CALIBRATED")
    for c in (1, 2):
        assert refit.degrees[c].d == pytest.approx(first.degrees[c].d, rel=1e-12)


def test_vllm_tp1_matches_the_issue_table() -> None:
    # Reference table: AIC vLLM TP1 of Qwen3-30B-A3B bf16 on one H200 — 28 ms at 1K, 138 at 8K, 3,364 at 64K.
    target = AicTarget(AicSpec(MODEL, "h200_sxm", "vllm"))
    assert target.version == "0.24.0"
    target.setup(1)
    ms = [target.measure(1, n, 0) * 1000 for n in (1024, 8192, 65536)]
    assert ms == pytest.approx([28.327, 138.432, 3363.673], rel=1e-4)
    with pytest.raises(AicError, match="only for the SGLang backend"):
        target.setup(2)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--model", "Foo/Bar", "--system", "h200_sxm"], "AIConfigurator has no model 'Foo/Bar'"),
        (["--model", MODEL, "--system", "h900"], "database has no system 'h900'; installed: a100_sxm, b200_sxm"),
        (["--model", MODEL, "--system", "b60", "--backend", "sglang"], "b60 has no sglang data; it has: vllm 0.20.0"),
        (["--model", MODEL, "--system", "h200_sxm", "--backend-version", "9"], "has no version '9'; it has: 0.5.14"),
        (["--model", MODEL, "--system", "h200_sxm", "--backend", "tpu"], "--backend must be one of sglang, vllm"),
        (["--model", MODEL, "--system", "h200_sxm", "--moe", "dp"], "--moe must be one of ep, tp"),
        (
            ["--model", MODEL, "--system", "h200_sxm", "--backend", "vllm", "--degrees", "1,2"],
            "context parallelism only for the SGLang backend",
        ),
        (  # 149 GiB per GPU at 256K tokens on one H200 (SGLang's memory model): more than it has
            ["--model", MODEL, "--system", "h200_sxm", "--lengths", "262144"],
            "does not fit one worker of degree 1 on h200_sxm at 262144 tokens",
        ),
        (["--system", "h200_sxm"], "--engine aiconfigurator needs --model"),
    ],
)
def test_refusals_are_a_message_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    out = tmp_path / "x.yaml"
    base = ["profile", "--engine", "aiconfigurator", "--config", str(CONFIG), "--degrees", "1", "--trace", ""]
    code, printed = _main([*base, "--lengths", "1024,4096", "--repeats", "1", *argv, "--out", str(out)], capsys)
    assert code == 2, printed
    assert message in printed and "Traceback" not in printed
    assert not list(tmp_path.iterdir())  # refused before anything was modelled or written


def test_unknown_model_lists_the_installed_ones(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    argv = ["profile", "--engine", "aiconfigurator", "--model", "Qwen/Qwen9", "--system", "h200_sxm"]
    code, printed = _main([*argv, "--out", str(tmp_path / "x.yaml")], capsys)
    assert code == 2
    assert "installed: " in printed and MODEL in printed and "deepseek-ai/DeepSeek-V4-Flash" in printed


def test_aic_options_need_the_aic_engine(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, printed = _main(
        ["profile", "--engine", "sim", "--system", "h200_sxm", "--out", str(tmp_path / "x.yaml")], capsys
    )
    assert code == 2 and "apply to --engine aiconfigurator only" in printed


def test_without_the_extra_the_package_imports_and_the_engine_says_how_to_install() -> None:
    # Hide the SDK as if `vertumnus[aic]` were not installed: the CLI still imports and runs; the engine refuses.
    code = (
        "import sys; sys.modules['aiconfigurator'] = None; sys.modules['aiconfigurator_core'] = None\n"
        "import vertumnus.profiling.targets, vertumnus.profiling.flow, vertumnus.cli.main as m\n"
        "sys.argv = ['vertumnus', 'profile', '--engine', 'aiconfigurator', '--model', 'Qwen/Qwen3-30B-A3B',"
        " '--system', 'h200_sxm', '--out', 'never.yaml']\n"
        "m.main()\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=REPO_ROOT)
    assert res.returncode == 2, res.stderr
    assert "needs NVIDIA AIConfigurator: pip install 'vertumnus[aic]'" in res.stderr
    assert "Traceback" not in res.stderr
    assert not (REPO_ROOT / "never.yaml").exists()


def _main(argv: list[str], capsys: pytest.CaptureFixture[str] | None) -> tuple[int, str]:
    """Run `vertumnus ARGV` as the installed entry point does (errors → message + exit 2); (code, output)."""
    from vertumnus.cli.main import main

    saved = sys.argv
    sys.argv = ["vertumnus", *argv]
    try:
        main()
        code = 0
    except SystemExit as e:
        code = int(e.code or 0)
    finally:
        sys.argv = saved
    if capsys is None:
        return code, ""
    cap = capsys.readouterr()
    return code, cap.out + cap.err
