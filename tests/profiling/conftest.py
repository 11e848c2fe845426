"""Shared helpers for the profiling tests: planted profiles, configs pointing at them, and the CLI runner."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer
import yaml
from typer.testing import CliRunner

from vertumnus.config import REPO_ROOT
from vertumnus.cost_model import CostProfile, DegreeProfile
from vertumnus.engines.vllm.availability import unavailable

EXCERPT = REPO_ROOT / "tests" / "data" / "conversation_excerpt.jsonl"

PLANTED = {
    1: DegreeProfile(d=0.01, a=0.0, b=2e-7, c=1.5e-5, alpha=2e-9),
    2: DegreeProfile(d=0.02, a=3e-6, b=4e-7, c=1.5e-5, alpha=2e-9),
    4: DegreeProfile(d=0.04, a=5e-6, b=8e-7, c=1.5e-5, alpha=2e-9),
}


@pytest.fixture
def planted() -> dict[int, DegreeProfile]:
    """The coefficients the sim engine is planted with (ground truth for the fit)."""
    return dict(PLANTED)


@pytest.fixture
def excerpt() -> Path:
    """300 lines of the conversation trace (tests/data, committed by the simulator's tests)."""
    return EXCERPT


@pytest.fixture
def planted_config(tmp_path: Path) -> Path:
    """A config whose cost_model.profile is the planted profile (the sim engine's ground truth)."""
    prof = CostProfile(degrees={c: DegreeProfile(p.d, p.a, p.b, p.c, p.alpha) for c, p in PLANTED.items()})
    prof.save(tmp_path / "planted.yaml")
    cfg = {
        "pool": {"gpus_per_node": 4, "degrees": [1, 2, 4], "max_model_len": 65536},
        "cost_model": {"profile": str(tmp_path / "planted.yaml")},
    }
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner(env={"COLUMNS": "200"})


@pytest.fixture
def cli_app() -> typer.Typer:
    """A fresh app with only the profiling commands (independent of the other command modules)."""
    from vertumnus.cli import profile_cmd

    app = typer.Typer(pretty_exceptions_enable=False)
    bench = typer.Typer()
    app.add_typer(bench, name="bench")
    profile_cmd.register(app, bench)
    return app


@pytest.fixture
def vllm_required() -> None:
    """vLLM must import on x86_64 Linux (fail naming `make setup`); elsewhere the test is skipped."""
    why = unavailable()
    if why is not None:
        required, message = why
        if required:
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
