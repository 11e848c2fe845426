"""The real server as a user starts it — ``vertumnus serve`` in a subprocess on 127.0.0.1, own Ray cluster, real
torch engine and decode actors — and the client-side helpers the serving tests share (fixtures: conftest.py).
A uniquely named module (not ``conftest``): test modules import it, and ``conftest`` names a different module
whenever several test directories are collected in one run.

Test hooks (``serving.test_hooks`` in configs/test-serve.yaml, docs/serving.md): ``Server.hold`` / ``release``
make a queue or a running prefill happen at the moment a test needs it instead of hoping the machine is slow.
Every wait here is bounded by its own deadline (pytest-timeout covers only the test function:
``timeout_func_only``)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import yaml

from vertumnus.config import VertumnusConfig, config_from_dict
from vertumnus.ports import free_port

REPO = Path(__file__).resolve().parents[2]
TEST_CONFIG = REPO / "configs" / "test-serve.yaml"
# bounds the start-up (Ray, 4 rank actors, decode actor): ~30-60 s on a quiet 2-core machine, 360 s seen on a
# heavily shared one; the server's own serving.startup_timeout_s (test config: 420 s, counted once Ray is up)
# usually reports first, with its reason
START_TIMEOUT_S = 480.0
WAIT_S = 180.0  # bound of a wait for a pool state the test made happen
CANONICAL = [(2, [0, 1]), (1, [2]), (1, [3])]  # the initial layout of configs/test-serve.yaml: (degree, ranks)


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

    def counters(self) -> Counters:
        """Every sample of /metrics now (compare later values with :meth:`Counters.delta`)."""
        return Counters(self, _samples(self.get("/metrics")))

    def post_admin(self, path: str, body: dict[str, Any], timeout: float = 300) -> Any:
        r = httpx.post(self.url + path, json=body, headers=self.admin, timeout=timeout)
        assert r.status_code == 200, f"POST {path} {body}: {r.status_code} {r.text}"
        return r.json()

    def hold(self, workers: list[int] | None = None, at: str = "queue") -> None:
        """Hold prefills on ``workers`` (None: every worker, also later ones) — see vertumnus/serving/holds.py."""
        self.post_admin("/v1/test/hold", {"workers": workers, "at": at})

    def release(self, workers: list[int] | None = None) -> None:
        self.post_admin("/v1/test/release", {"workers": workers})

    def holds(self) -> dict[str, Any]:
        r = httpx.get(self.url + "/v1/test/holds", headers=self.admin, timeout=60)
        r.raise_for_status()
        return dict(r.json())

    def reconfigure(self, op: str, worker: int, wait: bool = True) -> dict[str, Any]:
        """Admin split / merge (with ``wait``: answered once the targets are ACTIVE)."""
        return dict(self.post_admin("/v1/pool/reconfigure", {"op": op, "worker": worker, "wait": wait}))

    def wait_pool(self, pred: Callable[[dict[str, Any]], bool], what: str, timeout_s: float = WAIT_S) -> dict[str, Any]:
        """Poll /v1/pool until ``pred`` holds (a state the test caused; the deadline only bounds a failure)."""
        deadline = time.monotonic() + timeout_s
        while True:
            pool = self.get("/v1/pool")
            if pred(pool):
                return dict(pool)
            if time.monotonic() > deadline:
                raise AssertionError(f"not within {timeout_s:.0f} s: {what}; pool: {pool}")
            time.sleep(0.02)


class Counters:
    """A snapshot of /metrics; ``delta`` is what a test added since (the only way counters are asserted)."""

    def __init__(self, server: Server, samples: dict[str, float]) -> None:
        self.server = server
        self.samples = samples

    def delta(self, name: str, labels: str = "") -> float:
        key = f"{name}{{{labels}}}" if labels else name
        return self.server.metric(name, labels) - self.samples.get(key, 0.0)


def _samples(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def layout(pool: dict[str, Any]) -> list[tuple[int, list[int]]]:
    """(degree, ranks) of every worker, by first rank."""
    return sorted(((w["degree"], w["ranks"]) for w in pool["workers"]), key=lambda x: x[1])


def settled(pool: dict[str, Any]) -> bool:
    """Nothing in flight, no reconfiguration, every worker ACTIVE."""
    return (
        pool["inflight"] == 0
        and pool["placed"] == 0
        and pool["backlog"] == 0
        and pool["reconfiguring"] is None
        and all(w["state"] == "active" for w in pool["workers"])
    )


def restore_canonical(server: Server) -> dict[str, Any]:
    """Bring the shared server back to the initial layout (CANONICAL) by admin splits / merges."""
    for _ in range(4):
        pool = server.wait_pool(settled, "the pool settles (nothing in flight, every worker ACTIVE)")
        by_ranks = {tuple(w["ranks"]): w["id"] for w in pool["workers"]}
        if layout(pool) == CANONICAL:
            return pool
        if (0, 1, 2, 3) in by_ranks:
            server.reconfigure("split", by_ranks[(0, 1, 2, 3)])
        elif (0,) in by_ranks:
            server.reconfigure("merge", by_ranks[(0,)])
        else:
            server.reconfigure("split", by_ranks[(2, 3)])
    raise AssertionError(f"could not restore the initial layout: {server.get('/v1/pool')}")


def merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Deep merge of config mappings (b wins)."""
    out = dict(a)
    for k, v in b.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def wait_healthy(proc: subprocess.Popen[bytes], url: str, log: Path, timeout_s: float = START_TIMEOUT_S) -> None:
    """Until ``url``/health answers 200 with the server's own body (``{"status": "ok"}``: another program that
    happens to hold the port is not taken for the server); RuntimeError with the tail of ``log`` if the server
    exits first or ``timeout_s`` passes (a bound on a failure, not a speed assertion)."""
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}:\n{log.read_text(errors='replace')[-4000:]}")
        try:
            r = httpx.get(url + "/health", timeout=5)
            if r.status_code == 200 and r.json() == {"status": "ok"}:
                return
        except (httpx.HTTPError, ValueError):  # not up yet, or not JSON (not the server)
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"server not healthy in {timeout_s:.0f} s:\n{log.read_text(errors='replace')[-4000:]}")
        time.sleep(0.5)


def start_server(
    tmp: Path, overrides: dict[str, Any] | None = None, address: str | None = None, env: dict[str, str] | None = None
) -> Server:
    """Write the test config (+ overrides), start ``vertumnus serve`` and wait for /health: on a local cluster
    of its own, or joining the cluster at ``address`` (with ``env``: e.g. that cluster's auth token)."""
    proc, url, log, cfg = launch_server(tmp, overrides, address, env)
    try:
        wait_healthy(proc, url, log)
    except RuntimeError:
        stop_server(proc)
        raise
    address = ""
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith("Ray cluster: "):
            address = line.split()[2]
    return Server(url, proc, log, cfg, address)


def launch_server(
    tmp: Path, overrides: dict[str, Any] | None = None, address: str | None = None, env: dict[str, str] | None = None
) -> tuple[subprocess.Popen[bytes], str, Path, VertumnusConfig]:
    """Start ``vertumnus serve`` on the test config (+ overrides) without waiting: (process, url, log, config)."""
    data = merge(yaml.safe_load(TEST_CONFIG.read_text()), overrides or {})
    cfg = config_from_dict(data)
    cfg_path = tmp / "server.yaml"
    cfg_path.write_text(yaml.safe_dump(data))
    port = free_port()
    log = tmp / "server.log"
    env = {**(env if env is not None else os.environ), "PYTHONUNBUFFERED": "1"}
    env.pop("RAY_ADDRESS", None)
    cmd = [sys.executable, "-m", "vertumnus.cli.main", "serve", "--config", str(cfg_path), "--port", str(port)]
    if address:
        cmd += ["--address", address]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env)
    return proc, f"http://127.0.0.1:{port}", log, cfg


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    """Graceful stop (SIGINT → lifespan shutdown → Ray shutdown); kill after 60 s."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)


async def complete_greedy(server: Server, prompts: list[str], max_tokens: int) -> list[Any]:
    """All ``prompts`` at once as greedy completions with their token ids (``choices[0].token_ids``)."""
    c = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=600)
    try:
        return list(
            await asyncio.gather(
                *(
                    c.completions.create(
                        model="vertumnus-tiny",
                        prompt=p,
                        max_tokens=max_tokens,
                        temperature=0,
                        extra_body={"return_token_ids": True},
                    )
                    for p in prompts
                )
            )
        )
    finally:
        await c.close()
