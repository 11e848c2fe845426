"""`vertumnus config show|validate`."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from vertumnus.config import ConfigError, describe_config, dump_config, load_config, missing_files, unread_settings


def register(app: typer.Typer, bench_app: typer.Typer) -> None:
    config_app = typer.Typer(help="Inspect configuration.", no_args_is_help=True)
    app.add_typer(config_app, name="config")

    @config_app.command("show")
    def show(
        config: Path | None = typer.Option(None, "--config", "-c", help="YAML config file (default: all defaults)."),
        values_only: bool = typer.Option(False, "--values-only", help="Plain YAML values, no descriptions."),
        as_json: bool = typer.Option(False, "--json", help="The values as JSON."),
    ) -> None:
        """Print the resolved config (defaults filled in) as YAML, each key with its description and, where the
        file changes it, its default in a comment (the output loads back as a config)."""
        if values_only and as_json:
            raise ValueError("give --values-only or --json, not both")
        cfg = load_config(config)
        if as_json:
            typer.echo(json.dumps(cfg.model_dump(mode="json"), indent=2))
        elif values_only:
            typer.echo(dump_config(cfg), nl=False)
        else:
            source = str(config) if config is not None else "defaults only"
            typer.echo(
                f"# Vertumnus config ({source}); every key with its description.\n" + describe_config(cfg), nl=False
            )

    @config_app.command("validate")
    def validate(config: Path = typer.Option(..., "--config", "-c", help="YAML config file.")) -> None:
        """Validate a config file and the files it names (cost profile, history trace); exit non-zero naming
        the bad key. Notes the keys the configured controller policy does not read."""
        from vertumnus.cost_model import CostProfile

        cfg = load_config(config)
        problems = missing_files(cfg)
        if not problems:
            try:
                CostProfile.load(cfg.resolve_path(cfg.cost_model.profile))
            except ValueError as e:
                problems.append(f"cost_model.profile: {e}")
        if problems:
            raise ConfigError(f"invalid config {config}:\n" + "\n".join(f"  {p}" for p in problems))
        typer.echo(f"{config}: ok")
        for note in unread_settings(cfg):
            typer.echo(f"  note: {note}")
