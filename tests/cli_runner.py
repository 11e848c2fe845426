"""What the shared ``cli`` fixture (tests/conftest.py) returns: an in-process run of the `vertumnus` CLI."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class Result:
    """What an in-process run of the CLI gave."""

    returncode: int
    stdout: str
    stderr: str


Cli = Callable[..., Result]
