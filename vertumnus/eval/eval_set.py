"""An evaluation set (``configs/eval/*.yaml``): source traces, the request range drawn from, and workloads.

Schema::

    name: test
    description: ...
    traces: {conversation: ../shared/traces/conversation_first15min.jsonl, synthetic: ...}
    requests: [0.5, 1.0]          # fraction range of each trace's requests (arrival order) this set draws from
    start: 4xCP4+3xCP8            # default starting composition of the adaptive policy
    replicates: 3                 # optional (default 1): independent request streams per workload, see below
    workloads:
      - {name: alt-a, pattern: alternating, seed: 1001, traces: [conversation], start: 6xCP4+2xCP8,
         params: {...},           # params: see vertumnus.eval.protocol (one model per pattern)
         hot_prefixes: {count: 16, min_tokens: 2048, max_tokens: 8192, share: 0.6, zipf: 1.0}}  # optional

Replicates: with ``replicates: R`` every run (the policy and each fixed composition) is repeated on R independent
request streams of the workload (seeds: the workload's own, then seed·1000+k), all policies on the same streams;
the evaluation's figures are the means over them (:func:`vertumnus.eval.evaluate.mean_digest`). One stream decides a
controller threshold by noise: on the tuning set the geometric-mean ratio to the best fixed composition moved by
1–3% from one stream to the next, as much as the settings being compared differed.

Validated on load (pydantic; unknown keys, unknown patterns and bad pattern parameters are errors naming the
workload). Trace paths are relative to the repository root unless absolute or present from the CWD.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from vertumnus.config import VertumnusConfig
from vertumnus.cost_model import CostModel
from vertumnus.eval.load_patterns import LoadPhase, build_phases
from vertumnus.eval.protocol import Generated, HotPrefixes, generate, load_pool, replicate_seed
from vertumnus.sim.inputs import resolve

_M = TypeVar("_M", bound=BaseModel)


class WorkloadSpec(BaseModel):
    """One workload of a set."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.\-]+$")
    pattern: str
    seed: int = Field(ge=0)
    traces: tuple[str, ...] = Field(min_length=1)
    start: str | None = None
    description: str = ""
    params: dict[str, Any] = Field(default_factory=dict)
    hot_prefixes: HotPrefixes | None = None

    def phases(self) -> list[LoadPhase]:
        """The workload's phases (ValueError naming the workload on bad parameters)."""
        try:
            return build_phases(self.pattern, self.params)
        except ValueError as e:
            raise ValueError(f"workload {self.name!r}: {e}") from None


class EvalSet(BaseModel):
    """A named set of workloads drawing from one request range of the traces."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    description: str = ""
    traces: dict[str, str] = Field(min_length=1)
    requests: tuple[float, float]
    start: str = "4xCP4+3xCP8"
    replicates: int = Field(1, ge=1, le=20, description="Independent request streams per run (module docstring).")
    workloads: tuple[WorkloadSpec, ...] = Field(min_length=1)
    source: str = ""  # the YAML file (set by load_eval_set)

    @model_validator(mode="after")
    def _check(self) -> EvalSet:
        a, b = self.requests
        if not 0 <= a < b <= 1:
            raise ValueError(f"requests must be a range 0 ≤ start < end ≤ 1, got {[a, b]}")
        names = [w.name for w in self.workloads]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"duplicate workload names {dup}")
        for w in self.workloads:
            unknown = sorted(set(w.traces) - set(self.traces))
            if unknown:
                raise ValueError(f"workload {w.name!r} names traces {unknown} not in traces {sorted(self.traces)}")
            w.phases()  # unknown pattern / bad parameters fail on load, not mid-run
        return self

    def workload(self, name: str) -> WorkloadSpec:
        for w in self.workloads:
            if w.name == name:
                return w
        raise ValueError(f"set {self.name!r} has no workload {name!r}; it has {[w.name for w in self.workloads]}")

    def start_of(self, w: WorkloadSpec) -> str:
        return w.start or self.start

    def trace_paths(self, names: tuple[str, ...]) -> dict[str, Path]:
        paths = {n: resolve(self.traces[n]) for n in names}
        missing = [str(p) for p in paths.values() if not p.is_file()]
        if missing:
            raise ValueError(f"set {self.name!r}: trace file(s) not found: {', '.join(missing)}")
        return paths

    def generate(self, name: str, cfg: VertumnusConfig, cost: CostModel, replicate: int = 0) -> Generated:
        """The requests of workload ``name`` under ``cfg`` / ``cost`` (the load → rate rule uses both), drawn
        with replicate ``replicate``'s seed (0: the workload's own; any k ≥ 0, so a caller may run more streams
        than the set's ``replicates``)."""
        w = self.workload(name)
        pool = load_pool(self.trace_paths(w.traces), self.requests, cfg, cost)
        return generate(w.name, w.phases(), pool, replicate_seed(w.seed, replicate), cfg, w.hot_prefixes, cost)


def load_set(path: str | Path, model: type[_M], what: str) -> _M:
    """Read a YAML set and validate it as ``model`` (ValueError naming each bad key); ``what`` names the kind
    of set in messages. The model gets ``source`` = ``path``."""
    p = resolve(str(path))
    if not p.is_file():
        raise ValueError(f"{what} not found: {path}")
    try:
        data = yaml.safe_load(p.read_text())
    except yaml.YAMLError as e:
        raise ValueError(f"{what} {p} is not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{what} {p}: expected a mapping")
    try:
        return model.model_validate({**data, "source": str(path)})
    except ValidationError as e:
        lines = [f"invalid {what} {p}:"]
        for err in e.errors():
            key = ".".join(str(x) for x in err["loc"]) or "<root>"
            msg = "unknown key" if err["type"] == "extra_forbidden" else err["msg"]
            lines.append(f"  {key}: {msg}")
        raise ValueError("\n".join(lines)) from None


def load_eval_set(path: str | Path) -> EvalSet:
    """Read and validate an evaluation set YAML (ValueError with the reason)."""
    return load_set(path, EvalSet, "evaluation set")
