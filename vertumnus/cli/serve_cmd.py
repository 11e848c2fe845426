"""`vertumnus serve` (the HTTP server over the Ray-hosted prefill pool) and `vertumnus demo` (a short mixed
workload against a running server, or against one it starts itself)."""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

import typer

from vertumnus.config import load_config

DEFAULT_CONFIG = Path("configs/local.yaml")


def register(app: typer.Typer, bench_app: typer.Typer) -> None:
    @app.command("serve")
    def serve(
        config: Path = typer.Option(DEFAULT_CONFIG, "--config", "-c", help="YAML config file."),
        host: str | None = typer.Option(None, "--host", help="Bind address (default: serving.host)."),
        port: int | None = typer.Option(
            None, "--port", min=0, max=65535, help="Port (default: serving.port; 0 = any free port)."
        ),
        address: str | None = typer.Option(
            None, "--address", help="Join this Ray cluster (default: $RAY_ADDRESS, else start a local one)."
        ),
    ) -> None:
        """Serve the OpenAI-compatible endpoint over the prefill pool until Ctrl+C."""
        from vertumnus.serving.launcher import serve as run_server

        cfg = load_config(_resolve(config))
        try:
            run_server(cfg, host, port, address)
        except KeyboardInterrupt:  # Ctrl+C: uvicorn re-raises SIGINT once the graceful shutdown is done
            _exit_quietly(130)
        except SystemExit as e:  # start-up failed after Ray came up; uvicorn / the runtime logged why
            _exit_quietly(e.code if isinstance(e.code, int) else 1)
        _exit_quietly(0)

    @app.command("demo")
    def demo(
        url: str | None = typer.Option(None, "--url", help="A running server (default: start one from --config)."),
        config: Path = typer.Option(DEFAULT_CONFIG, "--config", "-c", help="Config of the server to start."),
        requests: int = typer.Option(24, "--requests", "-n", min=4, help="Requests in the mixed workload."),
        concurrency: int = typer.Option(8, "--concurrency", min=1, help="Requests in flight at once."),
    ) -> None:
        """Send a short mixed workload (shared prefixes, long and short prompts, chat, streaming) and print
        TTFTs, cache hits and the pool composition."""
        import httpx

        from vertumnus.serving.demo import run_demo

        if url is None:
            load_config(_resolve(config))  # a bad config fails here, not as "the server exited" later
        try:
            run_demo(url, _resolve(config), requests, concurrency)
        except RuntimeError as e:  # the server it started exited, or did not come up: the message says where
            raise ValueError(str(e)) from None
        except httpx.HTTPError as e:
            raise ValueError(f"the server at {url or 'the one started'} did not answer: {e}") from None


def _exit_quietly(code: int) -> None:
    """End the server process once its shutdown is done (runtime closed, Ray stopped), skipping interpreter
    finalization: there, the nanobind extension that ``import torch`` loads (triton) reports ~30 lines of
    "leaked instance / type / function" for objects that only die with the process. Nothing is left to clean
    up by then; stdio is flushed first."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # closed or broken pipe: nothing more to say
            stream.flush()
    os._exit(code)


def _resolve(config: Path) -> Path:
    """Relative config paths: CWD first, then the repository root (so `vertumnus serve` works anywhere)."""
    from vertumnus.config import REPO_ROOT

    if config.is_absolute() or config.exists():
        return config
    return REPO_ROOT / config
