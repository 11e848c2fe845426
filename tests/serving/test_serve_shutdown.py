"""Ctrl+C of `vertumnus serve` as a user does it: the console script in a subprocess (SIGINT at its default
action, as in a terminal), a small pool (one CPU rank slot), SIGINT once /health answers. The server exits
quietly: no traceback, none of the nanobind "leaked instance / type / function" lines that interpreter
finalization printed for the triton extension ``import torch`` loads, and its Ray cluster is gone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from server_harness import REPO, TEST_CONFIG, free_port, merge, wait_healthy

pytestmark = pytest.mark.slow

CLI = Path(sys.executable).parent / "vertumnus"
SMALL = {
    "pool": {"gpus_per_node": 1, "degrees": [1], "initial_composition": "1xCP1"},
    "serving": {"cpu_slots": 1, "test_hooks": False},
}
STOP_S = 120.0  # bounds the graceful stop (a hang guard, not a speed assertion)


def _default_sigint() -> None:
    # pytest started from a backgrounded shell inherits SIGINT ignored; a terminal's Ctrl+C meets the default
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _cluster_processes(temp_dir: str) -> list[int]:
    """Live processes started for the Ray cluster whose temp dir is ``temp_dir`` (their command lines name it)."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if temp_dir in cmd and state != "Z":
            out.append(int(d.name))
    return out


def test_ctrl_c_stops_serve_quietly(tmp_path: Path) -> None:
    cfg = tmp_path / "small.yaml"
    cfg.write_text(yaml.safe_dump(merge(yaml.safe_load(TEST_CONFIG.read_text()), SMALL)))
    port = free_port()
    out, err = tmp_path / "stdout.log", tmp_path / "stderr.log"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("RAY_ADDRESS", None)
    with out.open("wb") as o, err.open("wb") as e:
        proc = subprocess.Popen([str(CLI), "serve", "--config", str(cfg), "--port", str(port)], cwd=REPO,
                                stdout=o, stderr=e, env=env, preexec_fn=_default_sigint)  # fmt: skip
    try:
        wait_healthy(proc, f"http://127.0.0.1:{port}", err)
        logs = [x for x in out.read_text().splitlines() if x.startswith("Ray cluster: ")]
        assert logs, out.read_text()
        temp_dir = logs[0].rsplit("(logs: ", 1)[1].rstrip(")")
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=STOP_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    stderr = err.read_text(errors="replace")
    assert code == 130, (code, stderr[-3000:])  # the shell convention for an interrupted command
    assert "leaked" not in stderr, stderr[-3000:]
    assert "nanobind" not in stderr, stderr[-3000:]
    assert "Traceback" not in stderr + out.read_text(), stderr[-3000:]
    assert _cluster_processes(temp_dir) == []  # Ray was stopped before the process ended
