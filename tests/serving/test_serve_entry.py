"""The Ray Serve entry point run as an operator would: ``serve run`` of the very ``serveConfigV2`` of
deploy/rayservice.yaml (only the HTTP host / port and the application's ``args.config`` changed, to 127.0.0.1, a
free port and configs/test-serve.yaml) against a fresh head started with ``ray start --head --block`` and its own
temp dir. Shows that ``vertumnus.serving.serve_entry:build_app`` imports and builds on the cluster, that its one
ingress replica brings the pool up (real torch rank actors, decode actor) and serves the OpenAI API, the pool and
the metrics through the Serve proxy, and that SIGINT to ``serve run`` shuts the application down gracefully
(replica destructor without errors) after which stopping the head leaves no process of that cluster behind."""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml
from ray_cluster import (
    NODE_ENV,
    REGISTER_ENV,
    STOP_TIMEOUT_S,
    alive,
    default_sigint,
    descendants,
    free_port,
    mentioning,
    start_head,
    stop_process,
    tool,
)

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
RAYSERVICE = REPO / "deploy" / "rayservice.yaml"
TEST_CONFIG = REPO / "configs" / "test-serve.yaml"
START_TIMEOUT_S = 420.0  # per wait (ray start, serve run healthy): the fixture's own bound (214 s seen loaded)


def serve_config(port: int) -> dict[str, Any]:
    """deploy/rayservice.yaml's ``spec.serveConfigV2`` with only the HTTP address and ``args.config`` changed."""
    (svc,) = [d for d in yaml.safe_load_all(RAYSERVICE.read_text()) if d and d.get("kind") == "RayService"]
    conf: dict[str, Any] = yaml.safe_load(svc["spec"]["serveConfigV2"])
    conf["http_options"]["host"] = "127.0.0.1"
    conf["http_options"]["port"] = port
    (app,) = conf["applications"]
    app["args"]["config"] = str(TEST_CONFIG.resolve())
    return conf


@dataclass
class ServeRun:
    url: str
    ray: subprocess.Popen[bytes]
    serve: subprocess.Popen[bytes] | None
    temp_dir: str
    ray_log: Path
    serve_log: Path
    cluster_pids: set[int] = field(default_factory=set)

    def get(self, path: str) -> Any:
        r = httpx.get(self.url + path, timeout=60)
        r.raise_for_status()
        return r.json() if "json" in r.headers.get("content-type", "") else r.text

    def logs(self) -> str:
        return "\n".join(p.read_text(errors="replace")[-3000:] for p in (self.ray_log, self.serve_log) if p.exists())

    def stop(self) -> tuple[int | None, int, set[int]]:
        """SIGINT ``serve run`` (it shuts Serve down), then the head; (serve status, head status, processes of
        the cluster still alive after STOP_TIMEOUT_S — those are then killed)."""
        self.cluster_pids |= descendants(self.ray.pid) | mentioning(self.temp_dir)
        serve_rc = stop_process(self.serve) if self.serve is not None else None
        self.cluster_pids |= descendants(self.ray.pid)
        ray_rc = stop_process(self.ray)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        left = alive(self.cluster_pids) | mentioning(self.temp_dir)
        while left and time.monotonic() < deadline:
            time.sleep(0.5)
            left = alive(self.cluster_pids) | mentioning(self.temp_dir)
        for pid in left:  # only processes of this test's own cluster
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return serve_rc, ray_rc, left


def _wait(what: str, run: ServeRun, ready: Any) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while not ready():
        for name, p in (("ray start", run.ray), ("serve run", run.serve)):
            if p is not None and p.poll() is not None:
                raise RuntimeError(f"{what}: `{name}` exited with {p.returncode}:\n{run.logs()}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not within {START_TIMEOUT_S} s:\n{run.logs()}")
        time.sleep(0.5)


def _healthy(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeRun]:
    """A fresh head (own temp dir and ports, 8 CPUs: ingress + 4 rank slots + decode) and ``serve run`` of the
    RayService's config; stopped (if a test did not) and its temp dir removed at module end."""
    tmp = tmp_path_factory.mktemp("serve-run")
    # Ray's socket paths must stay short (AF_UNIX): the cluster's temp dir is a fresh one directly under /tmp
    temp_dir = tempfile.mkdtemp(prefix="vt-serve-")
    http = free_port()
    cfg_path = tmp / "serve-config.yaml"
    cfg_path.write_text(yaml.safe_dump(serve_config(http), sort_keys=False))
    # token auth with the test's own token: Ray 2.60's `ray start` refuses token mode without one (a fresh
    # machine has no ~/.ray/auth_token), and a driver without the cluster's token is refused
    auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
    # NODE_ENV: the RayService's container env (deploy/rayservice.yaml): Ray's workers at the server's priority,
    # not nice 15 — on a loaded machine a nice-15 replica and its rank actors starve past START_TIMEOUT_S
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "RAY_TMPDIR": temp_dir, **auth, **NODE_ENV, **REGISTER_ENV}
    env.pop("RAY_AUTH_TOKEN_PATH", None)
    env.pop("RAY_ADDRESS", None)
    popen: dict[str, Any] = {"cwd": tmp, "env": env, "stderr": subprocess.STDOUT, "start_new_session": True}
    ray_log, serve_log = tmp / "ray-start.log", tmp / "serve-run.log"

    def head(gcs: int) -> list[str]:
        return [
            *(tool("ray"), "start", "--head", "--block", "--temp-dir", temp_dir, "--num-cpus", "8", "--num-gpus", "0"),
            *("--port", str(gcs), "--ray-client-server-port", str(free_port())),
            *("--dashboard-agent-listen-port", str(free_port()), "--min-worker-port", "0", "--max-worker-port", "0"),
            *("--include-dashboard=false", "--disable-usage-stats"),
        ]

    try:
        ray, gcs, _ = start_head(head, ray_log, temp_dir, env, tmp)
    except BaseException:
        shutil.rmtree(temp_dir, ignore_errors=True)
        raise
    run = ServeRun(f"http://127.0.0.1:{http}", ray, None, temp_dir, ray_log, serve_log)
    try:
        cmd = [tool("serve"), "run", "--address", f"127.0.0.1:{gcs}", str(cfg_path)]
        with serve_log.open("wb") as out:
            run.serve = subprocess.Popen(cmd, stdout=out, preexec_fn=default_sigint, **popen)
        _wait("serve run: GET /health 200", run, lambda: _healthy(run.url))
        run.cluster_pids = descendants(ray.pid) | mentioning(temp_dir)
        yield run
    finally:
        run.stop()
        shutil.rmtree(temp_dir, ignore_errors=True)


def test_serve_run_of_the_rayservice_config_serves_the_api(served: ServeRun) -> None:
    assert served.get("/health") == {"status": "ok"}
    assert [m["id"] for m in served.get("/v1/models")["data"]] == ["vertumnus-tiny"]

    c = openai.OpenAI(base_url=served.url + "/v1", api_key="unused", max_retries=0, timeout=300)
    r = c.completions.create(model="vertumnus-tiny", prompt="Hello, Vertumnus", max_tokens=8, temperature=0)
    assert len(r.choices) == 1 and r.choices[0].finish_reason in ("stop", "length")
    assert r.usage is not None and 1 <= r.usage.completion_tokens <= 8
    chunks = c.chat.completions.create(
        model="vertumnus-tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=4, stream=True
    )
    assert any(ch.choices and ch.choices[0].finish_reason for ch in chunks)  # SSE through the Serve proxy
    c.close()

    # the controller (on in configs/test-serve.yaml) may be merging workers: read the pool once it is settled
    pool: dict[str, Any] = {}

    def settled() -> bool:
        nonlocal pool
        pool = served.get("/v1/pool")
        return pool["reconfiguring"] is None and all(w["state"] == "active" for w in pool["workers"])

    _wait("pool settled", served, settled)
    assert pool["engine"] == "torch"
    assert sorted(rank for w in pool["workers"] for rank in w["ranks"]) == [0, 1, 2, 3]

    ok = re.search(r'^vertumnus_requests_total\{outcome="ok"\} (\S+)$', served.get("/metrics"), re.M)
    assert ok is not None and float(ok.group(1)) >= 2


def test_sigint_stops_serve_gracefully_and_the_cluster_leaves_no_process(served: ServeRun) -> None:
    replica_logs = sorted(Path(served.temp_dir).glob("session_*/logs/serve/replica_vertumnus_*.log"))
    assert replica_logs, "no replica log of the vertumnus application"
    serve_rc, ray_rc, left = served.stop()
    assert serve_rc == 0, served.logs()
    text = "\n".join(p.read_text(errors="replace") for p in replica_logs)
    assert "__del__ raised" not in text and "Exception during graceful shutdown" not in text, text[-3000:]
    assert "vertumnus: replica shut down (pool closed, placement groups removed)" in text, text[-3000:]
    assert ray_rc is not None
    assert not left, f"processes of the test's Ray cluster still alive after {STOP_TIMEOUT_S} s: {sorted(left)}"
