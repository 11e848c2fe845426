"""``vertumnus bench serve``: front end + pool overhead with the trivial engine (not a timed test).

The server is the real one — :func:`~vertumnus.serving.app.create_app` over a
:class:`~vertumnus.serving.runtime.ServingRuntime` with the real :class:`~vertumnus.pool.PrefillPool` — with
:class:`~vertumnus.engines.sim.instant.InstantDataPlane` / :class:`~vertumnus.serving.instant.InstantDecode` in place
of Ray, torch and decode, in a child process (so the load generator does not share its event loop).

Measured:
- *router overhead*: HTTP in (the handler starts, before the body is parsed) → the request is placed on a worker
  (parse, tokenize, hash the blocks, trie match, placement, submit), and HTTP in → the worker starts the
  prefill, from the server's own request timelines, at concurrency 1 (no queueing);
- *throughput*: completed requests/s at ``--concurrency`` clients with keep-alive connections.
Prompts share a few long prefixes, so the trie, matches and LRU reports are exercised like in real traffic.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx
import numpy as np

from vertumnus.config import VertumnusConfig, load_config
from vertumnus.ports import free_port


@dataclass(slots=True)
class BenchResult:
    requests_latency_phase: int
    router_ms_p50: float
    router_ms_p99: float
    worker_start_ms_p50: float
    worker_start_ms_p99: float
    client_ms_p50: float
    client_ms_p99: float
    requests_throughput_phase: int
    concurrency: int
    throughput_rps: float
    server_cpu_ms_per_request: float | None  # server process CPU time (user + system) per request
    capacity_rps_per_core: float | None  # 1000 / server_cpu_ms_per_request
    prompt_tokens: int
    machine: str
    load_average: float  # 1-min load average when the run ended (the machine is shared)


def serve_instant(cfg: VertumnusConfig, port: int) -> None:
    """Child process: the real app and pool over the instant engine on 127.0.0.1:``port``."""
    import uvicorn

    from vertumnus.cost_model import CostModel
    from vertumnus.engines.sim.instant import InstantDataPlane
    from vertumnus.serving.app import create_app
    from vertumnus.serving.instant import InstantDecode
    from vertumnus.serving.runtime import ServingRuntime

    clock = time.monotonic
    dp = InstantDataPlane(clock, cfg.pool.gpus_per_node, blocks_per_rank=cfg.pool.kv_capacity_blocks_per_rank,
                          block_tokens=cfg.cache.block_tokens)  # fmt: skip
    cost = CostModel.from_file(cfg.resolve_path(cfg.cost_model.profile))
    runtime = ServingRuntime(cfg, dp, InstantDecode(), cost, "instant", clock)
    uvicorn.run(create_app(runtime), host="127.0.0.1", port=port, log_level="warning", access_log=False)


def _cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of a process (Linux /proc); None elsewhere."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _prompts(n: int, words: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    prefixes = [" ".join(f"p{k}w{j}" for j in range(words)) for k in range(8)]
    return [f"{prefixes[i % 8]} q{i} {rng.randrange(10**6)}" for i in range(n)]


class _Conn:
    """A minimal HTTP/1.1 keep-alive client (the load generator must cost far less than the server)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    async def post(self, body: bytes) -> tuple[int, bytes]:
        head = (
            f"POST /v1/completions HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode()
        self.writer.write(head + body)
        status_line = await self.reader.readline()
        length = 0
        while (line := await self.reader.readline()) not in (b"\r\n", b""):
            if line[:15].lower() == b"content-length:":
                length = int(line[15:])
        return int(status_line.split()[1]), await self.reader.readexactly(length)


async def _drive(url: str, prompts: list[str], concurrency: int) -> tuple[list[float], float]:
    """Send every prompt (max_tokens 1) with ``concurrency`` keep-alive connections; per-request client latency
    and wall time."""
    host, port = url.removeprefix("http://").split(":")
    bodies = iter([json.dumps({"model": "vertumnus-tiny", "prompt": p, "max_tokens": 1}).encode() for p in prompts])
    lat: list[float] = []

    async def client() -> None:
        conn = _Conn(*await asyncio.open_connection(host, int(port)))
        try:
            for body in bodies:
                t0 = time.perf_counter()
                status, data = await conn.post(body)
                lat.append(time.perf_counter() - t0)
                if status != 200:
                    raise RuntimeError(f"bench request failed: {status} {data[:200]!r}")
        finally:
            conn.writer.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    return lat, time.perf_counter() - t0


def run_bench(config: Path, requests: int, concurrency: int, words: int) -> BenchResult:
    """Start the instant-engine server, measure, stop it."""
    from vertumnus.profiling.targets import cpu_description

    cfg = load_config(config, overrides={"controller": {"enabled": False}})
    port = free_port("127.0.0.1")  # the server subprocess binds it later: not from the ephemeral range
    cfg_path = Path(tempfile.mkdtemp(prefix="vertumnus-bench-")) / "bench.json"
    cfg_path.write_text(cfg.model_dump_json())
    code = (
        f"import json,sys;from vertumnus.config import config_from_dict as c;from vertumnus.bench.serve import "
        f"serve_instant as s;s(c(json.load(open(sys.argv[1]))),{port})"
    )
    proc = subprocess.Popen([sys.executable, "-c", code, str(cfg_path)])
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the bench server did not start")
            time.sleep(0.2)
        n_lat = min(requests, 1000)
        asyncio.run(_drive(url, _prompts(200, words, seed=1), 4))  # warm-up (imports, caches, JIT paths)
        client_lat, _ = asyncio.run(_drive(url, _prompts(n_lat, words, seed=2), 1))
        recent = httpx.get(f"{url}/v1/requests", params={"limit": n_lat}, timeout=60).json()["data"]
        router = np.array([t["timing_s"]["router"] for t in recent]) * 1000
        start = np.array([t["timing_s"]["queue"] for t in recent]) * 1000
        cpu0 = _cpu_seconds(proc.pid)
        _, wall = asyncio.run(_drive(url, _prompts(requests, words, seed=3), concurrency))
        cpu1 = _cpu_seconds(proc.pid)
        tokens = recent[0]["prompt_tokens"] if recent else 0
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
    cl = np.array(client_lat) * 1000
    cpu_ms = None if cpu0 is None or cpu1 is None else 1000 * (cpu1 - cpu0) / requests
    return BenchResult(
        n_lat, float(np.percentile(router, 50)), float(np.percentile(router, 99)), float(np.percentile(start, 50)),
        float(np.percentile(start, 99)), float(np.percentile(cl, 50)), float(np.percentile(cl, 99)), requests,
        concurrency, requests / wall, cpu_ms, None if not cpu_ms else 1000 / cpu_ms, tokens, cpu_description(),
        os.getloadavg()[0],
    )  # fmt: skip


def report(res: BenchResult, as_json: bool) -> str:
    if as_json:
        return json.dumps(asdict(res))
    ok_lat = "meets" if res.worker_start_ms_p99 <= 5.0 else "MISSES"
    ok_rps = "meets" if res.throughput_rps >= 500 else "MISSES"
    cpu = "n/a" if res.server_cpu_ms_per_request is None else f"{res.server_cpu_ms_per_request:.2f} ms"
    cap = "n/a" if res.capacity_rps_per_core is None else f"{res.capacity_rps_per_core:.0f} req/s"
    return "\n".join([
        f"vertumnus bench serve — instant engine, real front end + pool ({res.machine})",
        f"  prompts: {res.prompt_tokens} tokens, 8 shared prefixes; controller off",
        f"  HTTP in → placed        p50 {res.router_ms_p50:.2f} ms   p99 {res.router_ms_p99:.2f} ms",
        f"  HTTP in → worker start  p50 {res.worker_start_ms_p50:.2f} ms   p99 {res.worker_start_ms_p99:.2f} ms"
        f"   ({ok_lat} target p99 ≤ 5 ms; {res.requests_latency_phase} sequential requests)",
        f"  client round trip       p50 {res.client_ms_p50:.2f} ms   p99 {res.client_ms_p99:.2f} ms",
        f"  throughput              {res.throughput_rps:.0f} req/s at concurrency {res.concurrency} "
        f"({ok_rps} target ≥ 500 req/s; {res.requests_throughput_phase} requests; load generator on the same "
        f"machine, load average {res.load_average:.1f})",
        f"  server CPU per request  {cpu} → {cap} on one core",
    ])  # fmt: skip
