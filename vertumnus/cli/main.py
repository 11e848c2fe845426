"""Entry point of the `vertumnus` command.

Command modules register themselves on the app (``register(app, bench_app)``), so each part of the pipeline
owns its commands. Errors at the edges (bad config, bad trace, bad arguments) print one clear message and exit
non-zero, never a traceback.
"""

from __future__ import annotations

import importlib
import sys

import typer

from vertumnus.config import ConfigError

app = typer.Typer(
    name="vertumnus",
    help="Adaptive context-parallel prefill-pool controller for P/D-disaggregated LLM serving.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
bench_app = typer.Typer(help="Benchmarks that print measured figures (not tests).", no_args_is_help=True)
app.add_typer(bench_app, name="bench")

# Modules that add commands; each defines register(app, bench_app).
COMMAND_MODULES = (
    "config_cmd",
    "bench_control_plane",
    "simulate_cmd",
    "bench_cp",
    "serve_cmd",
    "bench_serve",
    "profile_cmd",
    "evaluate_cmd",
    "audit_cmd",
    "bench_profile_fit",
    "tokenizer_cmd",
)

for _name in COMMAND_MODULES:
    _mod = importlib.import_module(f"vertumnus.cli.{_name}")
    _mod.register(app, bench_app)


def main() -> None:
    """Run the CLI, turning configuration / input errors into a message and exit code 2."""
    try:
        app()
    except (ConfigError, ValueError, FileNotFoundError) as e:
        typer.secho(f"error: {e}", fg=typer.colors.RED, err=True)
        sys.exit(2)
    except OSError as e:  # a path the checks above did not foresee (a directory, no permission, disk full)
        where = f": {e.filename}" if e.filename else ""
        typer.secho(f"error: {e.strerror or e}{where}", fg=typer.colors.RED, err=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
