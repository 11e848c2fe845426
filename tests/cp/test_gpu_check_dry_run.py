"""benchmarks/gpu_check.py (the script prepared for a lent GPU) runs its whole code path on CPU (``--device cpu
--small``): the correctness check passes and the samples it writes are fitted by ``vertumnus profile
--from-samples`` like any measured grid. Guards the GPU script against rot between GPU loans."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

from vertumnus.profiling.measure import read_samples

ROOT = Path(__file__).resolve().parents[2]


def test_gpu_check_dry_run_and_fit(tmp_path: Path) -> None:
    out = tmp_path / "gpu_check"
    run = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--device", "cpu", "--small", "--repeats", "1",
         "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
        env={**os.environ, "OMP_NUM_THREADS": "1"},  # many tiny ops: threads only add sync waits on a shared box
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    corr = json.loads((out / "correctness.json").read_text())
    assert corr["ok"] and corr["worst"] <= 1e-3
    assert {c["impl"] for c in corr["cases"]} >= {"flash_lse", "mask", "reference-on-device"}
    rows = read_samples(out / "profile_samples.csv")
    assert {(m.point.r, m.point.p) for m in rows} == {(r, p) for r in (512, 1024, 2048) for p in (0, 1024, 2048)}
    assert all(m.point.degree == 1 and m.seconds > 0 and m.repeats == 1 for m in rows)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["correctness_ok"] and summary["samples"] == 9 and isinstance(summary["fit_degree_1"], dict)

    prof = tmp_path / "fitted.yaml"
    fit = subprocess.run(
        [str(Path(sys.executable).parent / "vertumnus"), "profile", "--from-samples", str(out / "profile_samples.csv"),
         "--degrees", "1", "--trace", "", "--force", "--out", str(prof)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert fit.returncode == 0, fit.stdout[-3000:] + fit.stderr[-3000:]
    data = yaml.safe_load(prof.read_text())
    assert list(data["degrees"]) == [1] and data["degrees"][1]["mape"] is not None
