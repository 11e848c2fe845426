"""The prefill pool: nodes, GPUs (rank slots), CP degrees, engine, and how the pool starts."""

from __future__ import annotations

import re
from itertools import pairwise
from typing import Literal

from pydantic import Field, field_validator, model_validator

from vertumnus.config._base import Section

_COMPOSITION_TERM = re.compile(r"^\s*(\d+)\s*[xX*]\s*CP(\d+)\s*$")
# The simulated engine's switch stage, seconds: the predictive controller's default price of a switch too.
SIM_SWITCH_S = 0.8


def parse_composition(text: str) -> dict[int, int]:
    """Parse ``"4xCP4+3xCP8"`` into ``{4: 4, 8: 3}`` (degree -> worker count).

    Raises ValueError with the offending term on bad input.
    """
    out: dict[int, int] = {}
    if not text or not text.strip():
        raise ValueError("empty composition; expected e.g. '4xCP4+3xCP8'")
    for term in text.split("+"):
        m = _COMPOSITION_TERM.match(term)
        if not m:
            raise ValueError(f"bad composition term {term.strip()!r}; expected e.g. '4xCP4+3xCP8'")
        count, degree = int(m.group(1)), int(m.group(2))
        if count <= 0 or degree <= 0:
            raise ValueError(f"bad composition term {term.strip()!r}: count and degree must be positive")
        out[degree] = out.get(degree, 0) + count
    return out


def format_composition(counts: dict[int, int]) -> str:
    """Inverse of :func:`parse_composition`, degrees ascending (``{4: 4, 8: 3}`` -> ``"4xCP4+3xCP8"``)."""
    return "+".join(f"{n}xCP{c}" for c, n in sorted(counts.items()) if n > 0)


class PoolConfig(Section):
    nodes: int = Field(1, ge=1, description="Number of nodes in the prefill pool.")
    gpus_per_node: int = Field(8, ge=1, description="GPU (or CPU slot) ranks per node.")
    degrees: list[int] = Field(
        default_factory=lambda: [4, 8],
        description="Allowed CP degrees: powers of two dividing gpus_per_node, each twice the previous one.",
    )
    initial_composition: str | None = Field(
        None,
        description="Initial composition such as '4xCP4+3xCP8'. Empty: chosen from the history trace "
        "(pool.history_trace) or, without one, all GPUs in the largest degree.",
    )
    initial_headroom: float = Field(
        0.2, ge=0, description="An initial composition chosen from the history needs K ≥ (1 + this)·D̄."
    )
    history_trace: str | None = Field(
        None,
        description="Mooncake trace used to pick the initial composition (a relative path: the CWD if it exists "
        "there, else the repo root).",
    )
    engine: Literal["sim", "torch", "vllm"] = Field("sim", description="Worker backend.")
    max_model_len: int = Field(131072, ge=1, description="Longest prompt (tokens) a worker accepts.")
    kv_capacity_blocks_per_rank: int = Field(
        2048, ge=1, description="KV capacity of one rank, in cache blocks (cache.block_tokens tokens each)."
    )
    sim_switch_s: float = Field(
        SIM_SWITCH_S,
        ge=0,
        description="engine sim: the simulated engine's switch stage (seconds); set apart from "
        "controller.predictive.switch_s to simulate an engine whose switch the controller was not told.",
    )

    @field_validator("degrees")
    @classmethod
    def _degrees_powers_of_two(cls, v: list[int]) -> list[int]:
        if not v:
            raise ValueError("degrees must not be empty")
        for d in v:
            if d < 1 or d & (d - 1):
                raise ValueError(f"degree {d} is not a power of two")
        if len(set(v)) != len(v):
            raise ValueError(f"degrees contain duplicates: {v}")
        v = sorted(v)
        # Split / merge move between C and 2C only: a gap (e.g. [2, 8]) leaves the lattice without an operation
        # between the states of the two degrees, and the controller would silently never act.
        for lo, hi in pairwise(v):
            if hi != 2 * lo:
                chain = [lo << k for k in range((hi // lo).bit_length())]
                raise ValueError(
                    f"degrees {v} are not adjacent: split / merge only go between C and 2C, so no operation "
                    f"connects CP{lo} and CP{hi} (each degree must be twice the previous one, e.g. {chain})"
                )
        return v

    @model_validator(mode="after")
    def _degrees_fit_node(self) -> PoolConfig:
        if self.sim_switch_s != SIM_SWITCH_S and self.engine != "sim":
            # a real engine's switch is what it takes (the controller observes it); a knob that did nothing
            # would let an operator believe they had set it
            raise ValueError(f"sim_switch_s applies to engine sim only (engine is {self.engine}); remove it")
        for d in self.degrees:
            if self.gpus_per_node % d:
                raise ValueError(f"degree {d} does not divide gpus_per_node={self.gpus_per_node}")
        if self.initial_composition:
            counts = parse_composition(self.initial_composition)
            for d in counts:
                if d not in self.degrees:
                    raise ValueError(f"initial_composition uses degree {d} not in degrees {self.degrees}")
            used = sum(d * n for d, n in counts.items())
            if used != self.total_gpus:
                raise ValueError(
                    f"initial_composition {self.initial_composition!r} uses {used} GPUs, "
                    f"pool has {self.total_gpus} (nodes × gpus_per_node)"
                )
        return self

    @property
    def total_gpus(self) -> int:
        return self.nodes * self.gpus_per_node
