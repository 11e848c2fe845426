"""What `vertumnus profile` measures: one :class:`ProfilingTarget` per engine.

A target runs *queue-free* prefills — one request at a time on an otherwise idle worker — and returns the
wall-clock seconds of the prefill of ``r`` uncached tokens after a cached prefix of ``p`` tokens. The
measurement loop (:mod:`vertumnus.profiling.measure`) owns warm-up, repeats and medians; a target only knows
how to bring a worker of one degree up (``setup``), time one prefill (``measure``) and take it down
(``teardown``).

Engine-specific imports (torch, vLLM, Ray, AIConfigurator) live in the engine's own target module and are
imported only when that engine is asked for: this package imports neither torch nor ray at module level.

A target may also say where its numbers come from beyond ``engine/model/hardware``: a ``source`` attribute
(default ``measured``; the sim engine ``simulated``, AIConfigurator ``modelled``) and ``notes`` lines that the
profile and its samples CSV carry (:func:`target_source`, :func:`target_notes`).
"""

from __future__ import annotations

import os
import platform
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import numpy as np

from vertumnus.config import VertumnusConfig
from vertumnus.cost_model import CostModel, CostProfile

if TYPE_CHECKING:
    from vertumnus.profiling.aic_target import AicSpec

ENGINES = ("sim", "torch", "vllm", "aiconfigurator")


@runtime_checkable
class ProfilingTarget(Protocol):
    """A worker backend that can be timed queue-free, one degree at a time.

    Protocol: ``setup(C)`` → any number of ``measure(C, r, p)`` → ``teardown(C)``, for one degree at a time.
    ``measure`` must return the time of the prefill of the uncached part only (the prefix is prefilled and
    cached *before* the clock starts), in seconds, > 0.
    """

    engine: str  # "sim" | "torch" | "vllm" | "aiconfigurator"
    model: str  # what was measured (model name and size)
    hardware: str  # where it was measured
    prefix_align: int  # cached prefixes are multiples of this many tokens (engine cache block)
    max_tokens: int  # longest prompt the target runs

    def setup(self, degree: int) -> None: ...

    def measure(self, degree: int, r: int, p: int) -> float: ...

    def teardown(self, degree: int) -> None: ...


def target_source(target: ProfilingTarget) -> str:
    """What kind of numbers the target produces: its ``source`` attribute, else ``measured``."""
    src = getattr(target, "source", None)
    return src if isinstance(src, str) and src else "measured"


def target_notes(target: ProfilingTarget) -> list[str]:
    """Provenance lines the target wants kept with its numbers (its ``notes`` attribute, if any)."""
    notes = getattr(target, "notes", None)
    return [str(n) for n in notes] if isinstance(notes, (list, tuple)) else []


def cpu_description() -> str:
    """CPU model (from /proc/cpuinfo) and the cores this process may use, e.g. ``"AMD EPYC, 2 cores"``."""
    name = platform.processor() or platform.machine() or "unknown CPU"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    name = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return f"{name}, {cores} cores"


class SimTarget:
    """The configured cost profile as a target: E_C(r, p), optionally times seeded multiplicative noise.

    Noise model: each measurement is ``E_C(r, p) · exp(noise · z)`` with z ~ N(0, 1) drawn from
    ``numpy.random.default_rng(seed)`` in call order — so a run is reproducible, ``noise`` is roughly the
    relative standard deviation for small values, and ``noise = 0`` returns the planted model exactly (the
    tests recover planted coefficients through the whole `profile --engine sim` flow this way).
    """

    engine = "sim"
    source = "simulated"
    prefix_align = 1

    def __init__(self, profile: CostProfile, noise: float = 0.0, seed: int = 0, max_tokens: int = 1 << 20) -> None:
        if noise < 0:
            raise ValueError(f"--noise must be ≥ 0, got {noise}")
        self._model = CostModel(profile)
        self._noise = noise
        self._rng = np.random.default_rng(seed)
        self.model = f"{profile.model} (cost profile, {profile.source})"
        self.hardware = f"simulated ({profile.hardware})"
        self.max_tokens = max_tokens

    def setup(self, degree: int) -> None:
        """Check the profile has the degree (a clear error before any measurement)."""
        if degree not in self._model.degrees:
            raise ValueError(f"the sim engine's cost profile has no degree {degree} (has {self._model.degrees})")

    def measure(self, degree: int, r: int, p: int) -> float:
        e = self._model.predict(degree, r, p)
        if self._noise > 0:
            e *= float(np.exp(self._noise * self._rng.standard_normal()))
        return e

    def teardown(self, degree: int) -> None:
        """Nothing to release."""


def make_target(
    engine: str,
    cfg: VertumnusConfig,
    noise: float = 0.0,
    seed: int = 0,
    profile: CostProfile | None = None,
    timing: str = "wall",
    aic: AicSpec | None = None,
) -> ProfilingTarget:
    """The target for ``engine`` built from ``cfg`` (engine modules are imported only here, lazily).

    ``profile``: the sim engine's planted profile (default: ``cfg.cost_model.profile``). ``timing``: the torch
    engine's clock (``wall`` | ``cpu``, see :mod:`vertumnus.profiling.torch_target`). ``aic``: what
    AIConfigurator models (model, system, backend, MoE layout), required for ``engine="aiconfigurator"``.
    """
    if timing != "wall" and engine != "torch":
        raise ValueError("--timing cpu applies to the torch engine only")
    if (aic is not None) != (engine == "aiconfigurator"):
        raise ValueError(
            "--engine aiconfigurator needs --model and --system (and --backend)"
            if aic is None
            else "--system / --backend / --moe apply to --engine aiconfigurator only"
        )
    if engine == "sim":
        prof = profile or CostProfile.load(cfg.resolve_path(cfg.cost_model.profile))
        return SimTarget(prof, noise=noise, seed=seed, max_tokens=cfg.pool.max_model_len)
    if noise:
        raise ValueError("--noise applies to the sim engine only")
    if engine == "torch":
        from vertumnus.profiling.torch_target import TorchTarget

        return TorchTarget(cfg, seed=seed, timing=timing)
    if engine == "vllm":
        from vertumnus.profiling.vllm_target import VllmTarget

        return VllmTarget(cfg)
    if engine == "aiconfigurator":
        from vertumnus.profiling.aic_target import AicTarget

        assert aic is not None
        return AicTarget(aic)
    raise ValueError(f"unknown engine {engine!r}; expected one of {', '.join(ENGINES)}")
