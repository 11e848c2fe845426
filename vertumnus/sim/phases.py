"""Seeded time-varying workload: alternating phases of request rate and long-request share.

Like the paper's Tool-Agent experiment (high-rate phases dominated by short requests, low-rate phases with more
long ones). Requests share prefixes so caching matters: every request belongs to a prefix *group* (a shared
system prompt / tool list for short requests, a shared document for long ones) chosen by a Zipf law, followed by
a unique suffix. Output is Mooncake-style :class:`~vertumnus.sim.workload.TraceRecord` s, so generated and
recorded workloads go through the same request builder.

Spec string (``--workload``)::

    phases:DUR@RATE/LONG,DUR@RATE/LONG,...[;key=value...]
    e.g. phases:300@24/0.02,300@6/0.25,300@24/0.02;seed=7

DUR seconds at RATE requests/s with a LONG share of long (> 32K-token) requests. Keys: ``seed``,
``short_groups``, ``long_groups``, ``zipf``. A YAML file (``configs/workloads/*.yaml``) holds the same fields.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from vertumnus.sim.workload import TRACE_BLOCK_TOKENS, TraceRecord


@dataclass(slots=True, frozen=True)
class Phase:
    """``duration_s`` seconds of Poisson arrivals at ``rate_rps`` with ``long_share`` long requests."""

    duration_s: float
    rate_rps: float
    long_share: float

    def __post_init__(self) -> None:
        if not self.duration_s > 0:
            raise ValueError(f"phase duration must be > 0, got {self.duration_s}")
        if self.rate_rps < 0:
            raise ValueError(f"phase rate must be ≥ 0, got {self.rate_rps}")
        if not 0 <= self.long_share <= 1:
            raise ValueError(f"phase long share must be in [0, 1], got {self.long_share}")


@dataclass(slots=True)
class PhaseWorkload:
    """Generator parameters. Lengths are tokens; prefix lengths are 512-token blocks."""

    phases: list[Phase]
    seed: int = 0
    short_groups: int = 64
    long_groups: int = 24
    zipf: float = 1.1
    short_prefix_blocks: tuple[int, int] = (2, 12)  # shared system prompt / tools
    short_suffix_tokens: tuple[int, int] = (256, 8192)
    long_prefix_blocks: tuple[int, int] = (64, 160)  # shared document: 32K..80K tokens
    long_suffix_tokens: tuple[int, int] = (1024, 16384)
    name: str = "phases"
    description: str = field(default="")

    def __post_init__(self) -> None:
        if not self.phases:
            raise ValueError("a phase workload needs at least one phase")
        if self.short_groups < 1 or self.long_groups < 1:
            raise ValueError("short_groups and long_groups must be ≥ 1")
        for name in ("short_prefix_blocks", "short_suffix_tokens", "long_prefix_blocks", "long_suffix_tokens"):
            lo, hi = getattr(self, name)
            if not 0 < lo <= hi:
                raise ValueError(f"{name} must be a range 0 < lo ≤ hi, got {(lo, hi)}")

    @property
    def duration_s(self) -> float:
        return sum(p.duration_s for p in self.phases)

    def phase_bounds(self) -> list[tuple[float, float]]:
        """(start, end) seconds of each phase."""
        out, t = [], 0.0
        for p in self.phases:
            out.append((t, t + p.duration_s))
            t += p.duration_s
        return out


_KEYS = {"seed": int, "short_groups": int, "long_groups": int, "zipf": float}


def parse_phase_spec(spec: str) -> PhaseWorkload:
    """Parse ``phases:300@24/0.02,300@6/0.25;seed=7`` (see module docstring)."""
    body = spec.strip()
    if not body.startswith("phases:"):
        raise ValueError(f"bad workload {spec!r}; expected 'phases:DUR@RATE/LONG,...' or a YAML file")
    parts = body[len("phases:") :].split(";")
    phases: list[Phase] = []
    for term in parts[0].split(","):
        try:
            dur, rest = term.split("@")
            rate, long_share = rest.split("/")
            phases.append(Phase(float(dur), float(rate), float(long_share)))
        except ValueError as e:
            raise ValueError(f"bad phase {term.strip()!r} in {spec!r}; expected DUR@RATE/LONG ({e})") from None
    kwargs: dict[str, Any] = {}
    for kv in parts[1:]:
        if not kv.strip():
            continue
        key, _, val = kv.partition("=")
        key = key.strip()
        if key not in _KEYS:
            raise ValueError(f"unknown workload key {key!r}; known: {sorted(_KEYS)}")
        try:
            kwargs[key] = _KEYS[key](val)
        except ValueError:
            raise ValueError(f"bad value {val!r} for workload key {key!r}") from None
    return PhaseWorkload(phases=phases, **kwargs)


def load_workload_yaml(path: str | Path) -> PhaseWorkload:
    """Read a phase workload from YAML (same fields as :class:`PhaseWorkload`)."""
    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text())
    except FileNotFoundError:
        raise ValueError(f"workload file not found: {p}") from None
    except yaml.YAMLError as e:
        raise ValueError(f"workload file {p} is not valid YAML: {e}") from None
    if not isinstance(data, dict) or not isinstance(data.get("phases"), list):
        raise ValueError(f"workload file {p}: expected a mapping with a 'phases' list")
    known = {f.name for f in fields(PhaseWorkload)}
    unknown = set(data) - known
    if unknown:
        raise ValueError(f"workload file {p}: unknown keys {sorted(unknown)}")
    try:
        phases = [
            Phase(float(ph["duration_s"]), float(ph["rate_rps"]), float(ph["long_share"])) for ph in data["phases"]
        ]
        kw: dict[str, Any] = {k: (tuple(v) if isinstance(v, list) else v) for k, v in data.items() if k != "phases"}
        kw.setdefault("name", p.stem)
        return PhaseWorkload(phases=phases, **kw)
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"workload file {p}: {e}") from None


def load_workload(spec: str) -> PhaseWorkload:
    """``phases:...`` spec string or a YAML path."""
    return parse_phase_spec(spec) if spec.strip().startswith("phases:") else load_workload_yaml(spec)


def _zipf_probs(n: int, s: float) -> np.ndarray:
    w = 1.0 / np.arange(1, n + 1, dtype=np.float64) ** s
    return w / w.sum()


def _log_uniform(rng: np.random.Generator, lo: int, hi: int) -> int:
    return round(float(np.exp(rng.uniform(np.log(lo), np.log(hi)))))


def generate(w: PhaseWorkload) -> list[TraceRecord]:
    """Draw the workload's requests (deterministic for a given seed)."""
    rng = np.random.default_rng(w.seed)
    b = TRACE_BLOCK_TOKENS
    next_id = 0

    def fresh(n: int) -> tuple[int, ...]:
        nonlocal next_id
        ids = tuple(range(next_id, next_id + n))
        next_id += n
        return ids

    short_prefix = [
        fresh(int(rng.integers(w.short_prefix_blocks[0], w.short_prefix_blocks[1] + 1))) for _ in range(w.short_groups)
    ]
    long_prefix = [
        fresh(int(rng.integers(w.long_prefix_blocks[0], w.long_prefix_blocks[1] + 1))) for _ in range(w.long_groups)
    ]
    p_short, p_long = _zipf_probs(w.short_groups, w.zipf), _zipf_probs(w.long_groups, w.zipf)
    out: list[TraceRecord] = []
    line = 0
    for (start, end), ph in zip(w.phase_bounds(), w.phases, strict=True):
        t = start
        while ph.rate_rps > 0:
            t += float(rng.exponential(1.0 / ph.rate_rps))
            if t >= end:
                break
            is_long = bool(rng.random() < ph.long_share)
            if is_long:
                prefix = long_prefix[int(rng.choice(w.long_groups, p=p_long))]
                suffix = _log_uniform(rng, *w.long_suffix_tokens)
            else:
                prefix = short_prefix[int(rng.choice(w.short_groups, p=p_short))]
                suffix = _log_uniform(rng, *w.short_suffix_tokens)
            length = len(prefix) * b + suffix
            n_blocks = -(-length // b)  # Mooncake: one id per (possibly partial) block
            line += 1
            out.append(TraceRecord(line, t, length, 1, prefix + fresh(n_blocks - len(prefix))))
    return out
