"""Start the real server as a user would: ``vertumnus serve`` in a subprocess on 127.0.0.1, own Ray cluster,
real torch engine and decode actors. One server per test module (module-scoped fixtures in the modules)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from vertumnus.config import VertumnusConfig, config_from_dict

REPO = Path(__file__).resolve().parents[2]
TEST_CONFIG = REPO / "configs" / "test-serve.yaml"
START_TIMEOUT_S = 900.0


@dataclass
class Server:
    url: str
    proc: subprocess.Popen[bytes]
    log: Path
    cfg: VertumnusConfig
    ray_address: str

    @property
    def admin(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.cfg.serving.admin_token}"}

    def get(self, path: str) -> Any:
        r = httpx.get(self.url + path, timeout=60)
        r.raise_for_status()
        return r.json() if "json" in r.headers.get("content-type", "") else r.text

    def metric(self, name: str, labels: str = "") -> float:
        """Value of one sample of /metrics (``labels`` like ``outcome="ok"``); 0 when absent."""
        want = f"{name}{{{labels}}}" if labels else name
        for line in self.get("/metrics").splitlines():
            if line.startswith(want + " "):
                return float(line.split()[-1])
        return 0.0

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


def merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Deep merge of config mappings (b wins)."""
    out = dict(a)
    for k, v in b.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(tmp: Path, overrides: dict[str, Any] | None = None) -> Server:
    """Write the test config (+ overrides), start ``vertumnus serve`` and wait for /health."""
    data = merge(yaml.safe_load(TEST_CONFIG.read_text()), overrides or {})
    cfg = config_from_dict(data)
    cfg_path = tmp / "server.yaml"
    cfg_path.write_text(yaml.safe_dump(data))
    port = free_port()
    log = tmp / "server.log"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("RAY_ADDRESS", None)
    cmd = [sys.executable, "-m", "vertumnus.cli.main", "serve", "--config", str(cfg_path), "--port", str(port)]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}:\n{log.read_text(errors='replace')[-4000:]}")
        try:
            if httpx.get(url + "/health", timeout=5).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            stop_server(proc)
            raise RuntimeError(f"server not healthy in {START_TIMEOUT_S} s:\n{log.read_text(errors='replace')[-4000:]}")
        time.sleep(1.0)
    address = ""
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith("Ray cluster: "):
            address = line.split()[2]
    return Server(url, proc, log, cfg, address)


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    """Graceful stop (SIGINT → lifespan shutdown → Ray shutdown); kill after 60 s."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)


@pytest.fixture(scope="module")
def server_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """``server_factory(overrides)`` starts one server for the module; all are stopped at module end."""
    started: list[Server] = []

    def make(overrides: dict[str, Any] | None = None) -> Server:
        s = start_server(tmp_path_factory.mktemp("server"), overrides)
        started.append(s)
        return s

    yield make
    for s in started:
        stop_server(s.proc)


@pytest.fixture(scope="session")
def shared_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The server most modules share: controller off (the composition changes only when a test orders it) and
    no scan-driven replication (a prefix is where the test put it; reconciliation after a split is then the only
    copy path, and it shares its export/import code with replication). Started once per session."""
    overrides = {"controller": {"enabled": False}, "cache": {"replication": False}}
    s = start_server(tmp_path_factory.mktemp("shared-server"), overrides)
    yield s
    stop_server(s.proc)
