"""`vertumnus config show|validate`."""

from __future__ import annotations

from pathlib import Path

import typer

from vertumnus.config import dump_config, load_config


def register(app: typer.Typer, bench_app: typer.Typer) -> None:
    config_app = typer.Typer(help="Inspect configuration.", no_args_is_help=True)
    app.add_typer(config_app, name="config")

    @config_app.command("show")
    def show(config: Path | None = typer.Option(None, "--config", "-c", help="YAML config file.")) -> None:
        """Print the resolved config (defaults filled in) as YAML."""
        typer.echo(dump_config(load_config(config)), nl=False)

    @config_app.command("validate")
    def validate(config: Path = typer.Option(..., "--config", "-c", help="YAML config file.")) -> None:
        """Validate a config file; exit non-zero naming the bad key."""
        load_config(config)
        typer.echo(f"{config}: ok")
