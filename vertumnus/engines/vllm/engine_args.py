"""What a vLLM worker engine is started with: engine arguments, process environment, the model directory.

Everything here is plain data (no vLLM import), so the data plane can build a worker's spec in the server
process and ship it to the engine actor. The engine actor turns :class:`EngineSpec` into ``AsyncEngineArgs``.

Fixed choices (not configurable, because the trie depends on them): prefix caching on with
``prefix_caching_hash_algo="sha256_cbor"`` (reproducible hashes), KV events on, token-id prompts
(``skip_tokenizer_init``), ``prefill_context_parallel_size`` = the worker's CP degree.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vertumnus.config import ModelConfig, VertumnusConfig, VllmConfig


@dataclass(slots=True)
class EngineSpec:
    """One engine: ``kwargs`` for ``AsyncEngineArgs`` (minus the KV-event / KV-transfer configs, built from
    the plain dicts in the actor), the environment of the engine processes, and its KV-event endpoint."""

    kwargs: dict[str, Any]
    env: dict[str, str]
    events_endpoint: str | None = None  # where the engine's PUB socket connects (the subscriber's SUB)
    topic: str = ""
    replay_host: str = "127.0.0.1"  # the engine binds its replay ROUTER here, on a port it picks
    kv_transfer: dict[str, Any] | None = None
    label: str = ""


def tiny_model_dir(model: ModelConfig, max_model_len: int) -> str:
    """A Llama config.json built from the ``model:`` section (random weights: load with ``load_format=dummy``),
    in a temp directory named by its content, so every process and restart sees the same model."""
    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": model.vocab_size,
        "hidden_size": model.hidden_size,
        "intermediate_size": model.intermediate_size,
        "num_hidden_layers": model.num_layers,
        "num_attention_heads": model.num_heads,
        "num_key_value_heads": model.num_kv_heads,
        "max_position_embeddings": max_model_len,
        "rope_theta": model.rope_theta,
        "rms_norm_eps": 1e-5,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "torch_dtype": model.dtype,
        "bos_token_id": 256,
        "eos_token_id": 257,
    }
    text = json.dumps(cfg, sort_keys=True, indent=1)
    digest = hashlib.sha1(text.encode()).hexdigest()[:12]
    path = Path(tempfile.gettempdir()) / f"vertumnus-vllm-tiny-{digest}"
    path.mkdir(parents=True, exist_ok=True)
    target = path / "config.json"
    if not target.exists() or target.read_text() != text:
        tmp = path / f"config.json.{os.getpid()}"
        tmp.write_text(text)
        tmp.replace(target)  # atomic: concurrent writers produce the same bytes
    return str(path)


def model_source(cfg: VertumnusConfig) -> tuple[str, str]:
    """(model path or hub id, load_format) of the configured engines."""
    v = cfg.vllm
    if v.model:
        return v.model, v.load_format
    return tiny_model_dir(cfg.model, cfg.pool.max_model_len), "dummy"


def model_label(cfg: VertumnusConfig) -> str:
    """Human-readable name of what the engines run."""
    if cfg.vllm.model:
        return cfg.vllm.model
    m = cfg.model
    return (
        f"tiny Llama (hidden {m.hidden_size}, {m.num_layers} layers, {m.num_heads}/{m.num_kv_heads} heads, "
        f"vocab {m.vocab_size}, random weights)"
    )


def kv_transfer_dict(v: VllmConfig, role: str) -> dict[str, Any] | None:
    """``KVTransferConfig`` fields for ``role``, or None without a connector."""
    if not v.kv_connector:
        return None
    extra = dict(v.kv_connector_extra_config)
    return {"kv_connector": v.kv_connector, "kv_role": role, "kv_connector_extra_config": extra}


def engine_env(v: VllmConfig, degree: int, cores: list[int] | None) -> dict[str, str]:
    """Environment of one engine's processes (``cores``: the worker's CPU slots, None on GPU)."""
    env = {"HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "1"), "TOKENIZERS_PARALLELISM": "false"}
    if v.hash_seed is not None:
        env["PYTHONHASHSEED"] = v.hash_seed
    if cores is not None:
        env["VLLM_CPU_KVCACHE_SPACE"] = str(v.kv_cache_space_gib)
        bind = v.cpu_threads_bind
        if bind == "slots":
            bind = ",".join(str(c) for c in cores)
        env["VLLM_CPU_OMP_THREADS_BIND"] = bind
    return env


def engine_kwargs(cfg: VertumnusConfig, degree: int, use_gpu: bool) -> dict[str, Any]:
    """``AsyncEngineArgs`` keyword arguments of a degree-``degree`` worker (see module docstring)."""
    v = cfg.vllm
    model, load_format = model_source(cfg)
    kw: dict[str, Any] = {
        "model": model,
        "load_format": load_format,
        "dtype": v.dtype,
        "block_size": v.block_size,
        "enable_prefix_caching": True,
        "prefix_caching_hash_algo": "sha256_cbor",
        "enforce_eager": v.enforce_eager,
        "max_model_len": cfg.pool.max_model_len,
        "skip_tokenizer_init": True,
        "trust_remote_code": v.trust_remote_code,
        "prefill_context_parallel_size": degree,
        "disable_log_stats": True,  # engine-side stats stay off; num_cached_tokens is reported regardless
    }
    if degree > 1:
        kw["distributed_executor_backend"] = "mp"  # inside a Ray actor vLLM would otherwise pick its Ray executor
    if use_gpu:
        kw["gpu_memory_utilization"] = v.gpu_memory_utilization
    if v.max_num_batched_tokens is not None:
        kw["max_num_batched_tokens"] = v.max_num_batched_tokens
    kw.update(v.engine_args)
    return kw


@dataclass(slots=True)
class DecodeSpec:
    """The embedded decode engine: same model, no KV events, ``kv_consumer`` when a connector is set."""

    kwargs: dict[str, Any]
    env: dict[str, str]
    kv_transfer: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def decode_spec(cfg: VertumnusConfig, use_gpu: bool) -> DecodeSpec:
    """Spec of the embedded vLLM decode engine (degree 1; prefix caching stays on for multi-turn reuse)."""
    kw = engine_kwargs(cfg, 1, use_gpu)
    kw["prefill_context_parallel_size"] = 1
    env = engine_env(cfg.vllm, 1, None if use_gpu else [0])
    if not use_gpu and cfg.vllm.cpu_threads_bind == "slots":
        env["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"  # decode has no rank slot of its own
    role = "kv_consumer" if cfg.vllm.kv_connector else ""
    return DecodeSpec(kw, env, kv_transfer_dict(cfg.vllm, role) if role else None)
