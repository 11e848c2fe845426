"""`vertumnus serve` (the HTTP server over the Ray-hosted prefill pool) and `vertumnus demo` (a short mixed
workload against a running server, or against one it starts itself)."""

from __future__ import annotations

from pathlib import Path

import typer

from vertumnus.config import load_config

DEFAULT_CONFIG = Path("configs/local.yaml")


def register(app: typer.Typer, bench_app: typer.Typer) -> None:
    @app.command("serve")
    def serve(
        config: Path = typer.Option(DEFAULT_CONFIG, "--config", "-c", help="YAML config file."),
        host: str | None = typer.Option(None, "--host", help="Bind address (default: serving.host)."),
        port: int | None = typer.Option(None, "--port", help="Port (default: serving.port; 0 = any free port)."),
        address: str | None = typer.Option(
            None, "--address", help="Join this Ray cluster (default: $RAY_ADDRESS, else start a local one)."
        ),
    ) -> None:
        """Serve the OpenAI-compatible endpoint over the prefill pool until Ctrl+C."""
        from vertumnus.serving.launcher import serve as run_server

        cfg = load_config(_resolve(config))
        run_server(cfg, host, port, address)

    @app.command("demo")
    def demo(
        url: str | None = typer.Option(None, "--url", help="A running server (default: start one from --config)."),
        config: Path = typer.Option(DEFAULT_CONFIG, "--config", "-c", help="Config of the server to start."),
        requests: int = typer.Option(24, "--requests", "-n", min=4, help="Requests in the mixed workload."),
        concurrency: int = typer.Option(8, "--concurrency", min=1, help="Requests in flight at once."),
    ) -> None:
        """Send a short mixed workload (shared prefixes, long and short prompts, chat, streaming) and print
        TTFTs, cache hits and the pool composition."""
        from vertumnus.serving.demo import run_demo

        run_demo(url, _resolve(config), requests, concurrency)


def _resolve(config: Path) -> Path:
    """Relative config paths: CWD first, then the repository root (so `vertumnus serve` works anywhere)."""
    from vertumnus.config import REPO_ROOT

    if config.is_absolute() or config.exists():
        return config
    return REPO_ROOT / config
