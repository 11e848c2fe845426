"""Profiling target for NVIDIA AIConfigurator (``vertumnus[aic]``): *modelled* prefill times, not measured ones.

AIConfigurator (PyPI ``aiconfigurator``, Apache-2.0) ships per-kernel timings collected on real GPUs (its
"silicon" database, per system / framework / version) and sums them into the time of one engine step. This
target asks its SDK for a batch-1 context step of ``r + p`` tokens of which ``p`` are a cached prefix —
``RuntimeConfig(batch_size=1, isl=r + p, osl=1, prefix=p)`` through ``InferenceSession.run_static(...,
mode="static_ctx")`` — on one worker of degree C:

- ``--backend sglang``: C-way context parallelism (``ModelConfig.cp_size = C``), which AIC models as SGLang's
  AllGather of K/V with a zigzag split of the sequence; the MoE layers are spread over the same C GPUs as
  expert (``--moe ep``, the default) or tensor (``--moe tp``) parallelism.
- ``--backend vllm`` / ``trtllm``: AIC models no prefill context parallelism there, so only C = 1 runs (a
  degree above 1 is refused with a message that says so).

Nothing here measures anything: the numbers are AIC's model of the hardware, optimistic (kernel sums, no
framework overhead) and extrapolated (attention quadratically) beyond the longest prompt in its silicon data.
The profile records all of that (source ``modelled``, AIC's version, the database, the backend, the data range).
No network is used: models must be ones whose configs AIC ships (or a local directory with a config.json).

The SDK is imported only when this target is built (``import vertumnus`` works without the extra).
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import logging
import os
from dataclasses import dataclass
from typing import Any

BACKENDS = ("sglang", "vllm", "trtllm")
MOE_LAYOUTS = ("ep", "tp")
DATABASE_MODE = "SILICON"  # measured kernel rows only (AIC's other modes mix in formulas)
INSTALL_HINT = "pip install 'vertumnus[aic]' (make setup installs it)"
# AIC's op tables whose token axis bounds the silicon data of a prefill: (file, column, what).
_RANGE_TABLES = (
    ("context_attention_perf.parquet", "isl", "context attention"),
    ("moe_perf.parquet", "num_tokens", "MoE"),
)
_AIC_LOGGERS = ("aiconfigurator", "aiconfigurator_core")


class AicError(ValueError):
    """AIConfigurator cannot model what was asked (unknown model / system / backend, no data, no fit)."""


@dataclass(slots=True, frozen=True)
class AicSpec:
    """What to model: a model AIC knows, a system (GPU) in its database, a framework backend and MoE layout."""

    model: str  # HuggingFace name AIC ships a config for (e.g. "Qwen/Qwen3-30B-A3B"), or a local directory
    system: str  # AIC system name, e.g. "h200_sxm"
    backend: str = "sglang"
    moe: str = "ep"  # MoE layers over the C GPUs of a worker: expert ("ep") or tensor ("tp") parallelism
    version: str | None = None  # backend database version; None: AIC's default (current) for the system

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise AicError(f"--backend must be one of {', '.join(BACKENDS)}, got {self.backend!r}")
        if self.moe not in MOE_LAYOUTS:
            raise AicError(f"--moe must be one of {', '.join(MOE_LAYOUTS)}, got {self.moe!r}")


@dataclass(slots=True, frozen=True)
class SiliconRange:
    """The longest prompt AIC's silicon data cover for this database (``None``: not determinable)."""

    max_tokens: int | None
    tables: tuple[str, ...] = ()  # e.g. ("context attention ≤ 16384", "MoE ≤ 16384")

    def describe(self) -> str:
        if self.max_tokens is None:
            return "silicon-data range unknown for this database"
        return (
            f"silicon data up to {self.max_tokens} tokens ({', '.join(self.tables)}); "
            f"extrapolated above {self.max_tokens} tokens (attention quadratically)"
        )


def aic_versions() -> str:
    """``"AIConfigurator 0.12.0 (aiconfigurator-core 0.12.0)"``; AicError when the extra is not installed."""
    try:
        importlib.import_module("aiconfigurator")
        top = importlib.metadata.version("aiconfigurator")
    except (ImportError, importlib.metadata.PackageNotFoundError):
        raise AicError(f"--engine aiconfigurator needs NVIDIA AIConfigurator: {INSTALL_HINT}") from None
    try:
        core = importlib.metadata.version("aiconfigurator-core")
    except importlib.metadata.PackageNotFoundError:
        core = "?"
    return f"AIConfigurator {top} (aiconfigurator-core {core})"


def _quiet_aic() -> None:
    """AIC logs a warning per fallback table it loads; the profile records what matters, so keep the CLI quiet."""
    for name in _AIC_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)


@functools.cache
def supported_databases() -> dict[str, dict[str, list[str]]]:
    """``{system: {backend: [versions]}}`` of the installed AIC database (no data is loaded; cached: ~1 s)."""
    aic_versions()
    _quiet_aic()
    from aiconfigurator.sdk.perf_database import get_supported_databases

    return {s: {b: list(v) for b, v in bv.items() if v} for s, bv in get_supported_databases().items()}


def known_models() -> list[str]:
    """The HuggingFace names whose configs AIC ships (usable without network)."""
    aic_versions()
    from aiconfigurator_core.sdk.common import DefaultHFModels

    return sorted(DefaultHFModels)


def resolve(spec: AicSpec) -> tuple[str, dict[str, list[str]]]:
    """Check model, system, backend and version against the installed database; return (version, backends).

    Raises :class:`AicError` listing what the database offers for the part that is unknown.
    """
    models = known_models()
    if spec.model not in models and not os.path.isfile(os.path.join(spec.model, "config.json")):
        raise AicError(
            f"AIConfigurator has no model {spec.model!r} (it runs without network, so only the configs it ships "
            f"or a local directory with a config.json); installed: {', '.join(models)}"
        )
    dbs = supported_databases()
    if spec.system not in dbs:
        raise AicError(f"AIConfigurator's database has no system {spec.system!r}; installed: {', '.join(sorted(dbs))}")
    backends = dbs[spec.system]
    if spec.backend not in backends:
        offered = "; ".join(f"{b} {', '.join(v)}" for b, v in sorted(backends.items()))
        raise AicError(f"AIConfigurator's database for {spec.system} has no {spec.backend} data; it has: {offered}")
    versions = backends[spec.backend]
    if spec.version is None:
        from aiconfigurator.sdk.perf_database import get_version_slots

        # AIC's own default (get_latest_database_version): the maintained "current" slot, else the newest.
        slots = get_version_slots(spec.system, spec.backend) or {}
        version = slots["current"] if slots.get("current") in versions else versions[-1]
    elif spec.version in versions:
        version = spec.version
    else:
        raise AicError(
            f"AIConfigurator's database for {spec.system}/{spec.backend} has no version {spec.version!r}; "
            f"it has: {', '.join(versions)}"
        )
    return version, backends


@dataclass(slots=True)
class _Worker:
    """One degree's AIC session (model built for cp_size = C) and the layout it was built with."""

    session: Any
    layout: str  # e.g. "CP4 (allgather), TP1, MoE EP4"


class AicTarget:
    """Queue-free prefill times of one worker of degree C, as modelled by AIConfigurator (module docstring)."""

    engine = "aiconfigurator"
    source = "modelled"  # never "measured" or "calibrated": the profile says where its numbers come from
    prefix_align = 1  # AIC models any cached prefix length

    def __init__(self, spec: AicSpec, max_tokens: int = 1 << 20) -> None:
        self.spec = spec
        self.max_tokens = max_tokens
        self.version, _ = resolve(spec)
        _quiet_aic()
        from aiconfigurator.sdk.models import check_is_moe
        from aiconfigurator.sdk.perf_database import get_database_view

        self._db: Any = get_database_view(
            spec.system, spec.backend, self.version, allow_missing_data=False, database_mode=DATABASE_MODE
        )
        if self._db is None:
            raise AicError(f"AIConfigurator could not load its database {self._db_name()}")
        self._is_moe = bool(check_is_moe(spec.model))
        self._gpu_mem_gib = float(self._db.system_spec["gpu"]["mem_capacity"]) / (1 << 30)
        self._worker: dict[int, _Worker] = {}
        self._quant = ""  # precisions AIC resolved (from the first result)
        self.silicon = _silicon_range(self._db, spec.backend, self.version)
        self.model = ""
        self.hardware = ""
        self._label()

    # -- ProfilingTarget ----------------------------------------------------------------------------------------
    def setup(self, degree: int) -> None:
        """Build AIC's model of one degree-C worker (refuses degrees AIC cannot model for this backend)."""
        if degree not in self._worker:
            self._worker[degree] = self._build(degree)

    def measure(self, degree: int, r: int, p: int) -> float:
        """AIC's seconds for the prefill of r tokens after a cached prefix of p tokens (deterministic)."""
        from aiconfigurator.sdk.config import RuntimeConfig
        from aiconfigurator.sdk.errors import PerfDataNotAvailableError

        self.setup(degree)
        rc = RuntimeConfig(batch_size=1, isl=r + p, osl=1, prefix=p)
        try:
            summary = self._worker[degree].session.run_static(rc, mode="static_ctx")
        except PerfDataNotAvailableError as e:
            raise AicError(f"AIConfigurator has no data for degree {degree}, L = {r + p}, P = {p}: {e}") from None
        except (RuntimeError, ValueError) as e:  # its other refusals (interpolation, no result)
            raise AicError(f"AIConfigurator cannot model degree {degree}, L = {r + p}, P = {p}: {e}") from None
        res = summary.get_result_dict() or {}
        if summary.check_oom():
            raise AicError(
                f"{self.spec.model} does not fit one worker of degree {degree} on {self.spec.system} at "
                f"{r + p} tokens per AIConfigurator ({float(res.get('memory', 0.0)):.1f} GiB per GPU needed, "
                f"{self._gpu_mem_gib:.1f} GiB per GPU): give shorter --lengths or larger --degrees"
            )
        if not self._quant:
            self._quant = _precision(res)
            self._label()
        ms = float(res.get("context_latency") or res.get("ttft") or 0.0)
        if not ms > 0:
            raise AicError(f"AIConfigurator returned no prefill time for degree {degree}, L = {r + p}, P = {p}")
        return ms / 1000.0

    def teardown(self, degree: int) -> None:
        """Keep the built model: AIC is deterministic and a worker holds no device."""

    # -- provenance ---------------------------------------------------------------------------------------------
    @property
    def notes(self) -> list[str]:
        """Lines for the profile's notes: what produced the numbers and how far to trust them."""
        layouts = "; ".join(f"C={c}: {w.layout}" for c, w in sorted(self._worker.items()))
        return [
            "MODELLED, NOT MEASURED OR CALIBRATED: prefill times predicted by NVIDIA "
            f"{aic_versions()} from its silicon database {self._db_name()} ({DATABASE_MODE} mode): "
            'RuntimeConfig(batch_size=1, isl=L, osl=1, prefix=P), run_static(mode="static_ctx")',
            f"aic layouts: {layouts or 'none built'}; precision: {self._quant or 'unknown'}",
            f"aic data: {self.silicon.describe()}; kernel sums without framework overhead (optimistic)",
        ]

    def _db_name(self) -> str:
        return f"{self.spec.system}/{self.spec.backend}/{self.version}"

    def _label(self) -> None:
        parts = [self._quant] if self._quant else []
        if self._is_moe:
            parts.append(f"MoE {self.spec.moe.upper()} = C")
        self.model = self.spec.model + (f" ({'; '.join(parts)})" if parts else "")
        ext = f", extrapolated above {self.silicon.max_tokens} tokens" if self.silicon.max_tokens else ""
        self.hardware = (
            f"{self.spec.system} (modelled by AIConfigurator {_top_version()} from its {self.spec.backend} "
            f"{self.version} silicon data{ext}; not measured)"
        )

    def _build(self, degree: int) -> _Worker:
        from aiconfigurator.sdk.backends.factory import get_backend
        from aiconfigurator.sdk.config import ModelConfig
        from aiconfigurator.sdk.inference_session import InferenceSession
        from aiconfigurator.sdk.models import (
            get_model,
            resolve_context_fmha_by_data,
            resolve_dsv4_moe_arch,
            resolve_nvfp4_for_system,
        )
        from aiconfigurator.sdk.moe_comm_resolver import resolve_model_config_moe_comm

        s = self.spec
        if degree > 1 and s.backend != "sglang":
            raise AicError(
                f"AIConfigurator models prefill context parallelism only for the SGLang backend (AllGather of "
                f"K/V); with --backend {s.backend} only degree 1 runs (got degree {degree}): use --backend sglang "
                "or --degrees 1"
            )
        mc = ModelConfig(tp_size=1, pp_size=1, attention_dp_size=1, cp_size=degree)
        if self._is_moe:
            mc.moe_ep_size, mc.moe_tp_size = (degree, 1) if s.moe == "ep" else (1, degree)
        # The same resolution steps as AIC's own static estimate (aiconfigurator.cli.api._run_static_estimate).
        try:
            if self._is_moe:
                resolve_model_config_moe_comm(
                    mc,
                    model_path=s.model,
                    backend_name=s.backend,
                    database=self._db,
                    required_phases=("context",),
                    fmha_quant_mode_explicit=False,
                    kvcache_quant_mode_explicit=False,
                )
            if mc.moe_comm_backend is None:
                resolve_context_fmha_by_data(mc, s.model, self._db, s.backend, is_context_role=True)
            resolve_dsv4_moe_arch(mc, s.model, system_name=s.system, backend_name=s.backend)
            resolve_nvfp4_for_system(mc, s.system, s.model, backend_name=s.backend)
            model = get_model(s.model, mc, s.backend)
        except NotImplementedError as e:  # e.g. a model family without CP modelling
            raise AicError(f"AIConfigurator cannot model degree {degree} of {s.model} on {s.backend}: {e}") from None
        except (ValueError, RuntimeError, AssertionError) as e:
            raise AicError(f"AIConfigurator cannot build {s.model} for degree {degree} on {s.backend}: {e}") from None
        session = InferenceSession(model, self._db, get_backend(s.backend))
        cp = "" if degree == 1 else f"CP{degree} ({mc.cp_style}), "
        moe = f"MoE {s.moe.upper()}{degree}" if self._is_moe else "dense"
        return _Worker(session, f"{cp}TP1, {moe}")


def _precision(res: dict[str, Any]) -> str:
    """``"bfloat16"`` when GEMM, MoE, KV cache and attention share one precision, else each named."""
    parts = {k: str(res[k]) for k in ("gemm", "moe", "kvcache", "fmha") if res.get(k)}
    if len(set(parts.values())) == 1:
        return next(iter(parts.values()))
    return ", ".join(f"{k} {v}" for k, v in parts.items())


def _top_version() -> str:
    return importlib.metadata.version("aiconfigurator")


def _silicon_range(db: Any, backend: str, version: str) -> SiliconRange:
    """Longest prompt in the database's context-attention and MoE tables (the prefill's token-bound kernels)."""
    import pyarrow.parquet as pq
    from aiconfigurator_core.sdk.operations.base import resolve_op_data_path

    root = os.path.join(db.systems_root, db.system_spec["data_dir"])
    found: list[tuple[str, int]] = []
    for fname, column, what in _RANGE_TABLES:
        path = resolve_op_data_path(root, backend, version, fname)
        if not path.endswith(".parquet") or not os.path.isfile(path):
            continue
        top = _column_max(pq.ParquetFile(path), column)
        if top is not None:
            found.append((what, top))
    if not found:
        return SiliconRange(None)
    return SiliconRange(min(n for _, n in found), tuple(f"{what} ≤ {n}" for what, n in found))


def _column_max(f: Any, column: str) -> int | None:
    """Max of an integer column from the parquet row-group statistics (reads no data pages), or None."""
    meta = f.metadata
    try:
        j = f.schema_arrow.get_field_index(column)
    except (KeyError, ValueError):
        return None
    if j < 0:
        return None
    tops = []
    for i in range(meta.num_row_groups):
        st = meta.row_group(i).column(j).statistics
        if st is None or not st.has_min_max:
            return None
        tops.append(int(st.max))
    return max(tops) if tops else None
