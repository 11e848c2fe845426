"""Checks of the paths given on the command line, made before any work starts (a simulation can run for
minutes before it would fail to write its outputs)."""

from __future__ import annotations

from pathlib import Path

OUT_DIR_HELP = "Output directory (created if missing; outputs of an earlier run there are overwritten)."


def output_dir(out: Path, option: str = "--out") -> Path:
    """``out`` as an output directory: missing (it is created later) or a directory; ValueError otherwise."""
    if out.exists() and not out.is_dir():
        raise ValueError(f"{option} {out} is an existing file; {option} names a directory to write the outputs into")
    for parent in out.parents:
        if parent.exists():
            if not parent.is_dir():
                raise ValueError(f"{option} {out}: {parent} is a file, not a directory")
            break
    return out
