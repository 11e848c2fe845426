"""``vertumnus demo``: a short mixed workload through the official ``openai`` client, then tables of per-request
TTFT breakdowns, prefix-cache hits and the pool composition.

Workload (deterministic text, byte tokenizer): a few long shared "documents" each asked several questions
(prefix reuse), short chats (streamed), and long one-off prompts. The first question of every document goes
first, so the others can hit its cached prefix. Without ``--url`` the demo starts ``vertumnus serve`` on a free
port, runs, and stops it.
"""

from __future__ import annotations

import asyncio
import random
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

WORDS = [
    "prefill",
    "pool",
    "context",
    "parallel",
    "zigzag",
    "split",
    "merge",
    "epoch",
    "cache",
    "prefix",
    "block",
    "rank",
    "worker",
    "decode",
    "token",
    "window",
    "demand",
    "capacity",
    "latency",
    "ray",
    "gloo",
    "attention",
    "query",
    "key",
    "value",
]


@dataclass(slots=True)
class DemoRequest:
    kind: str  # "doc-q" | "chat" | "long"
    prompt: str
    stream: bool
    request_id: str = ""
    cached: int = 0
    prompt_tokens: int = 0
    client_ttft_s: float = 0.0
    timing: dict[str, Any] | None = None
    error: str | None = None


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def build_workload(n: int, seed: int = 0) -> list[list[DemoRequest]]:
    """Two waves: the first question of each document, then everything else (shuffled)."""
    rng = random.Random(seed)
    docs = [f"Document {d}: " + _text(rng, 160 + 80 * d) for d in range(3)]
    first = [DemoRequest("doc-q", f"{doc}\nQuestion 0: what is said about {rng.choice(WORDS)}?", False) for doc in docs]
    rest: list[DemoRequest] = []
    for i in range(n - len(first)):
        k = i % 4
        if k in (0, 1):
            doc = docs[i % len(docs)]
            rest.append(
                DemoRequest("doc-q", f"{doc}\nQuestion {i + 1}: what is said about {rng.choice(WORDS)}?", i % 3 == 0)
            )
        elif k == 2:
            rest.append(DemoRequest("chat", f"Tell me about {rng.choice(WORDS)} and {rng.choice(WORDS)}.", True))
        else:
            rest.append(DemoRequest("long", f"Unique {i}: " + _text(rng, 300), False))
    rng.shuffle(rest)
    return [first, rest]


async def _send(client: Any, model: str, r: DemoRequest) -> None:
    t0 = time.perf_counter()
    try:
        if r.kind == "chat":
            stream = await client.chat.completions.create(
                model=model,
                messages=[{"role": "user", "content": r.prompt}],
                max_tokens=16,
                temperature=0.7,
                seed=1,
                stream=True,
                stream_options={"include_usage": True},
            )
            async for chunk in stream:
                if not r.request_id:
                    r.request_id = chunk.id
                    r.client_ttft_s = time.perf_counter() - t0
                if chunk.usage is not None:
                    r.prompt_tokens = chunk.usage.prompt_tokens
                    details = chunk.usage.prompt_tokens_details
                    r.cached = (details.cached_tokens or 0) if details else 0
            return
        resp = await client.completions.create(model=model, prompt=r.prompt, max_tokens=16, temperature=0)
        r.client_ttft_s = time.perf_counter() - t0
        r.request_id = resp.id
        assert resp.usage is not None
        r.prompt_tokens = resp.usage.prompt_tokens
        details = resp.usage.prompt_tokens_details
        r.cached = (details.cached_tokens or 0) if details else 0
    except Exception as e:  # a demo reports failures in its table instead of stopping
        r.error = f"{type(e).__name__}: {e}"


async def run_workload(url: str, n: int, concurrency: int) -> tuple[list[DemoRequest], dict[str, Any]]:
    """Send the workload; return the requests (with server-side timings) and the final /v1/pool."""
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=f"{url}/v1", api_key="none", max_retries=2, timeout=600)
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        model = (await http.get("/v1/models")).json()["data"][0]["id"]
        sem = asyncio.Semaphore(concurrency)

        async def one(r: DemoRequest) -> None:
            async with sem:
                await _send(client, model, r)

        done: list[DemoRequest] = []
        for wave in build_workload(n):
            await asyncio.gather(*(one(r) for r in wave))
            done.extend(wave)
        for r in done:
            if r.request_id:
                got = await http.get(f"/v1/requests/{r.request_id}")
                r.timing = got.json() if got.status_code == 200 else None
        pool = (await http.get("/v1/pool")).json()
    await client.close()
    return done, pool


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{1000 * x:.0f}"


def print_report(reqs: list[DemoRequest], pool: dict[str, Any], console: Console) -> None:
    t = Table(title="Requests (server-side timing, ms; * = streamed)")
    for col in ("#", "kind", "prompt", "cached", "worker", "queue", "prefill", "hand-off", "TTFT"):
        t.add_column(col, justify="right" if col not in ("kind", "worker") else "left")
    for i, r in enumerate(reqs):
        tm = (r.timing or {}).get("timing_s", {})
        worker = "-" if not r.timing else f"w{r.timing['worker']} CP{r.timing['degree']}"
        if r.error:
            t.add_row(str(i), r.kind, "-", "-", "error", "", "", "", r.error[:40])
            continue
        t.add_row(
            str(i),
            r.kind + ("*" if r.stream else ""),
            str(r.prompt_tokens),
            str(r.cached),
            worker,
            _ms(tm.get("queue")),
            _ms(tm.get("prefill")),
            _ms(tm.get("handoff")),
            _ms(tm.get("ttft")),
        )
    console.print(t)
    ok = [r for r in reqs if not r.error and r.timing]
    ttfts = sorted(r.timing["timing_s"]["ttft"] for r in ok if r.timing and r.timing["timing_s"]["ttft"] is not None)
    prompt = sum(r.prompt_tokens for r in ok)
    cached = sum(r.cached for r in ok)
    if ttfts:
        p90 = ttfts[min(len(ttfts) - 1, int(0.9 * len(ttfts)))]
        console.print(
            f"{len(ok)}/{len(reqs)} answered; TTFT mean {_ms(sum(ttfts) / len(ttfts))} ms, "
            f"p90 {_ms(p90)} ms; prefix cache served {cached}/{prompt} prompt tokens "
            f"({100 * cached / max(prompt, 1):.0f}%)"
        )
    p = Table(title=f"Pool {pool['composition']} (epoch {pool['epoch']}, {pool['reconfigs_done']} reconfigurations)")
    for col in ("worker", "degree", "ranks", "state", "epoch", "cached blocks"):
        p.add_column(col)
    for w in pool["workers"]:
        p.add_row(
            str(w["id"]),
            f"CP{w['degree']}",
            ",".join(map(str, w["ranks"])),
            w["state"],
            str(w["epoch"]),
            str(w["cached_blocks"]),
        )
    console.print(p)


def _start_server(config: Path, console: Console) -> tuple[subprocess.Popen[bytes], str, Path]:
    log = Path(tempfile.mkdtemp(prefix="vertumnus-demo-")) / "server.log"
    cmd = [sys.executable, "-m", "vertumnus.cli.main", "serve", "--config", str(config), "--port", "0"]
    console.print(f"starting: {' '.join(cmd[2:])}  (log: {log})")
    proc = subprocess.Popen(cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}; see {log}")
        for line in log.read_text(errors="replace").splitlines():
            if line.startswith("Vertumnus is serving") and " at http" in line:
                return proc, line.split(" at ", 1)[1].split()[0], log
        time.sleep(1.0)
    proc.kill()
    raise RuntimeError(f"the server did not start within 900 s; see {log}")


def run_demo(url: str | None, config: Path, n: int, concurrency: int) -> None:
    """Entry point of ``vertumnus demo``."""
    console = Console()
    proc = None
    if url is None:
        proc, url, _ = _start_server(config, console)
    try:
        reqs, pool = asyncio.run(run_workload(url.rstrip("/"), n, concurrency))
        print_report(reqs, pool, console)
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
