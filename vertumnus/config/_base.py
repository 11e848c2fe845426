"""The base of every config section and the error a cross-section check raises."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict

REPO_ROOT = Path(__file__).resolve().parents[2]


class Section(BaseModel):
    """A config section: unknown keys are errors, and assignments are validated like loads."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class KeyedError(ValueError):
    """A validator's failure that names its keys itself (a section-wide validator has no location of its own):
    one or more ``(full dotted key, message)`` pairs, each printed on its own line."""

    def __init__(self, key: str, message: str, *more: tuple[str, str]) -> None:
        self.items: tuple[tuple[str, str], ...] = ((key, message), *more)
        super().__init__("; ".join(f"{k}: {m}" for k, m in self.items))
        self.key = key
        self.message = message
