"""Commands registered by a later part of the pipeline."""

from __future__ import annotations

import typer


def register(app: typer.Typer, bench_app: typer.Typer) -> None:
    """Nothing registered yet."""
