"""Fixtures every test folder shares."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

from tests.cli_runner import Cli, Result
from vertumnus.cli.main import main

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def benchmark_script() -> Callable[[str], ModuleType]:
    """Load a script of benchmarks/ by name (``"gpu_check"``) as a module: the scripts are not a package."""

    def load(name: str) -> ModuleType:
        spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod

    return load


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Cli:
    """Run the `vertumnus` entry point in-process (exit code, stdout, stderr)."""

    def run(*args: str) -> Result:
        monkeypatch.setattr(sys, "argv", ["vertumnus", *args])
        capsys.readouterr()
        code = 0
        try:
            main()
        except SystemExit as e:
            code = int(e.code or 0)
        out, err = capsys.readouterr()
        return Result(code, out, err)

    return run
