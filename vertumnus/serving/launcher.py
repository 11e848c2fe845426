"""``vertumnus serve``: build the runtime for a config and run the HTTP server on one asyncio loop.

Engine factory (``pool.engine``):

- ``torch``: :class:`~vertumnus.serving.ray_data_plane.RayDataPlane` — one Ray rank actor per GPU / CPU slot
  hosting the CP engine's rank worker;
- ``vllm``: ``vertumnus.engines.vllm.serving.build_data_plane(cfg, hosting, clock)`` (the vLLM engine's seam;
  its decode side: ``build_decode(cfg, hosting)``);
- ``sim`` is the simulator's virtual-clock engine and cannot serve.

Decode: ``serving.decode_url`` set → :class:`~vertumnus.serving.external_decode.ExternalDecode`; otherwise the
embedded decode pool (``serving.decode_actors`` Ray actors with the reference model).
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import uvicorn

from vertumnus.config import VertumnusConfig
from vertumnus.cost_model import CostModel
from vertumnus.interfaces import DataPlane
from vertumnus.serving.app import create_app
from vertumnus.serving.handoff import DecodeBackend
from vertumnus.serving.hosting import RayHosting, start_hosting
from vertumnus.serving.runtime import ServingRuntime
from vertumnus.serving.tokenizer import make_tokenizer

log = logging.getLogger("vertumnus.serving")


def make_data_plane(cfg: VertumnusConfig, hosting: RayHosting, clock: Callable[[], float]) -> DataPlane:
    """The DataPlane of ``cfg.pool.engine`` (see module docstring)."""
    engine = cfg.pool.engine
    if engine == "torch":
        from vertumnus.serving.ray_data_plane import RayDataPlane

        return RayDataPlane(cfg, hosting, clock)
    if engine == "vllm":
        return _vllm_seam().build_data_plane(cfg, hosting, clock)  # type: ignore[no-any-return]
    raise ValueError(f"pool.engine {engine!r} cannot serve (it is the simulator's engine); use 'torch' or 'vllm'")


def make_decode(cfg: VertumnusConfig, hosting: RayHosting) -> DecodeBackend:
    """External endpoint when ``serving.decode_url`` is set; else the engine's embedded decode: the reference
    model's decode actors (torch) or ``vertumnus.engines.vllm.serving.build_decode(cfg, hosting)`` (vllm)."""
    if cfg.serving.decode_url:
        from vertumnus.serving.external_decode import ExternalDecode

        return ExternalDecode(cfg.serving.decode_url, cfg.model.name)
    if cfg.pool.engine == "vllm":
        return _vllm_seam().build_decode(cfg, hosting)  # type: ignore[no-any-return]
    if cfg.serving.decode_actors < 1:
        raise ValueError("set serving.decode_url or serving.decode_actors ≥ 1: requests need a decode side")
    from vertumnus.serving.decode_pool import EmbeddedDecode

    return EmbeddedDecode(cfg.model, cfg.serving.decode_actors, hosting.use_gpu)


def _vllm_seam() -> Any:
    try:
        return importlib.import_module("vertumnus.engines.vllm.serving")
    except ImportError as e:
        raise ValueError(f"pool.engine 'vllm' is not available here: {e}") from None


def build_runtime(cfg: VertumnusConfig, address: str | None = None) -> tuple[ServingRuntime, RayHosting]:
    """Start / join Ray, then assemble pool + engine + decode (nothing runs until ``runtime.start()``)."""
    if cfg.pool.engine == "sim":
        raise ValueError("pool.engine 'sim' is the simulator's virtual-clock engine; serve with 'torch' or 'vllm'")
    token = os.environ.get("VERTUMNUS_ADMIN_TOKEN")
    if token:  # e.g. from a Kubernetes Secret; overrides serving.admin_token
        cfg.serving.admin_token = token
    cost = CostModel.from_file(cfg.resolve_path(cfg.cost_model.profile))
    check_vocab(cfg)  # before Ray: a mismatch is a configuration error, reported at once
    hosting = start_hosting(cfg, address, cfg.serving.startup_timeout_s)
    try:
        clock = time.monotonic
        data_plane = make_data_plane(cfg, hosting, clock)
        decode = make_decode(cfg, hosting)
        runtime = ServingRuntime(cfg, data_plane, decode, cost, cfg.pool.engine, clock)
        return runtime, hosting
    except BaseException:
        hosting.close()
        raise


def model_vocab_size(cfg: VertumnusConfig) -> int:
    """The torch engine's vocabulary: ``config.json``'s ``vocab_size`` when ``model.path`` is set (the dims
    are read from there), else ``model.vocab_size`` (random reference weights)."""
    if cfg.model.path:
        path = Path(cfg.resolve_path(cfg.model.path)) / "config.json"
        try:
            return int(json.loads(path.read_text())["vocab_size"])
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ValueError(f"model.path: cannot read vocab_size from {path}: {e}") from None
    return cfg.model.vocab_size


def check_vocab(cfg: VertumnusConfig) -> None:
    """ValueError when the tokenizer can produce token ids the model has no embedding for (a tokenizer
    vocabulary larger than the model's): every prompt with such an id would fail in the engine. With this
    checked once here, the front end's per-request check of prompt ids against the tokenizer's vocabulary
    (``Tokenizer.check_ids``, 400) also keeps them inside the model's. Skipped for the vllm engine (vLLM checks
    prompt ids against its own model)."""
    if cfg.pool.engine != "torch":
        return
    vocab = model_vocab_size(cfg)
    tok = make_tokenizer(cfg.serving.tokenizer, vocab)
    if tok.vocab_size > vocab:
        raise ValueError(
            f"serving.tokenizer {cfg.serving.tokenizer} has a vocabulary of {tok.vocab_size} token ids, the model "
            f"{cfg.model.name!r} only {vocab}: prompts could carry ids the model has no embedding for. Use the "
            "model's own tokenizer (or omit serving.tokenizer for the reference model's byte tokenizer)"
        )


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening socket (port 0: any free port) — bound before start-up so the port is known early.

    It listens at once, not only when uvicorn starts serving: start-up (Ray, its agents, the engines) opens
    ports of its own for tens of seconds, and a socket that is merely bound with SO_REUSEADDR does not stop
    another SO_REUSEADDR socket from binding and listening on the same port first (seen in the test suite: a
    Ray agent's metrics endpoint answered on the server's port). A listening socket does. Connections made
    during start-up wait in the backlog and are answered once the app is up."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(2048)  # uvicorn's default backlog; asyncio listens again with it, which is harmless
    except OSError as e:
        sock.close()
        raise ValueError(f"cannot listen on {host}:{port}: {e.strerror}") from None
    sock.set_inheritable(True)
    return sock


def ready_banner(cfg: VertumnusConfig, url: str, composition: str) -> str:
    """What ``vertumnus serve`` prints once it accepts requests: how to send one."""
    m = cfg.model.name
    return (
        f"Vertumnus is serving {m} at {url}  (pool {composition}, engine {cfg.pool.engine})\n"
        f"  curl {url}/v1/completions -H 'Content-Type: application/json' \\\n"
        f'       -d \'{{"model": "{m}", "prompt": "Hello, Vertumnus", "max_tokens": 16, "temperature": 0}}\'\n'
        f"  python -c \"from openai import OpenAI; c = OpenAI(base_url='{url}/v1', api_key='none'); "
        f"print(c.completions.create(model='{m}', prompt='Hello', max_tokens=16).choices[0].text)\"\n"
        f"  pool: {url}/v1/pool   metrics: {url}/metrics   demo: vertumnus demo --url {url}\n"
        f"Press Ctrl+C to stop."
    )


def serve(cfg: VertumnusConfig, host: str | None = None, port: int | None = None, address: str | None = None) -> None:
    """Run the server until SIGINT / SIGTERM (graceful: the lifespan closes the runtime, then Ray stops)."""
    host = host or cfg.serving.host
    port = cfg.serving.port if port is None else port
    sock = bind_socket(host, port)
    actual = sock.getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{actual}"
    print(f"Vertumnus: starting Ray and {cfg.pool.total_gpus} rank slots on {url} ...", flush=True)
    runtime, hosting = build_runtime(cfg, address)
    print(f"Ray cluster: {hosting.gcs_address} (logs: {hosting.temp_dir or 'the cluster default'})", flush=True)
    try:
        app = create_app(
            runtime, on_ready=lambda: print(ready_banner(cfg, url, runtime.pool.snapshot().composition), flush=True)
        )
        config = uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=5, access_log=False)
        server = uvicorn.Server(config)
        server.run(sockets=[sock])
        if not server.started:
            raise SystemExit(1)  # start-up failed; uvicorn already logged why
    finally:
        sock.close()
        hosting.close()
        sys.stdout.flush()
