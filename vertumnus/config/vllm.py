"""The ``pool.engine: vllm`` backend (vertumnus/engines/vllm; docs/vllm.md)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from vertumnus.config._base import Section


class VllmConfig(Section):
    """Settings of the ``pool.engine: vllm`` backend (vertumnus/engines/vllm; docs/vllm.md)."""

    model: str | None = Field(
        None,
        description="HF model directory or hub id served by every vLLM worker. Empty: a tiny Llama built from "
        "the model section (config.json only, random weights via load_format=dummy) in a temp dir.",
    )
    load_format: Literal["auto", "dummy", "safetensors"] = Field(
        "auto", description="vLLM load_format ('dummy': random weights; forced when model is empty)."
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field("auto", description="vLLM dtype.")
    block_size: int = Field(
        32, ge=1, description="vLLM KV block size in tokens (CPU: multiple of 32); must divide cache.block_tokens."
    )
    kv_cache_space_gib: int = Field(
        1, ge=1, description="CPU: KV cache per worker in whole GiB (VLLM_CPU_KVCACHE_SPACE); unused on GPU."
    )
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1, description="GPU: vLLM gpu_memory_utilization.")
    enforce_eager: bool = Field(True, description="Skip torch.compile / CUDA graphs (fast start-up).")
    max_num_batched_tokens: int | None = Field(None, ge=1, description="vLLM chunked-prefill budget; empty: vLLM's.")
    trust_remote_code: bool = Field(False, description="Passed to vLLM (models with custom code).")
    hash_seed: str | None = Field(
        None,
        description="PYTHONHASHSEED for the engines (vLLM's NONE_HASH seed); empty: vLLM's fixed default seed. "
        "Vertumnus derives the same block hashes with it.",
    )
    events_host: str = Field(
        "127.0.0.1", description="Address the KV-event subscribers bind (engines' ZMQ PUB sockets connect to it)."
    )
    events_resync_s: float = Field(
        2.0, gt=0, description="Seconds between replay polls that recover KV events lost after the last one seen."
    )
    confirm_timeout_s: float = Field(
        30.0, gt=0, description="A replication not confirmed by KV events this long after its prefill fails."
    )
    replication: Literal["recompute", "transfer"] = Field(
        "recompute",
        description="How a cache op copies a prefix: recompute it on the destination (max_tokens=1), or move "
        "KV through the configured connector (kv_connector with kv_role kv_both).",
    )
    kv_connector: str | None = Field(
        None, description="vLLM KV connector for P/D hand-off (e.g. NixlConnector, ExampleConnector); empty: none."
    )
    kv_role: Literal["kv_producer", "kv_both"] = Field(
        "kv_both", description="KV-transfer role of the prefill workers."
    )
    kv_connector_extra_config: dict[str, Any] = Field(
        default_factory=dict, description="kv_connector_extra_config (e.g. shared_storage_path for ExampleConnector)."
    )
    decode_engine: bool = Field(
        True,
        description="Without serving.decode_url: run one embedded vLLM decode engine (kv_consumer when a "
        "connector is set) as the decode side.",
    )
    cpu_threads_bind: str = Field(
        "slots",
        description="CPU: VLLM_CPU_OMP_THREADS_BIND of each engine. 'slots': the cores of the worker's rank "
        "slots (rank mod core count); or vLLM's 'auto', 'nobind', or an explicit core list.",
    )
    start_timeout_s: float = Field(900.0, gt=0, description="Seconds one engine may take to start.")
    token_cache_blocks: int = Field(
        65536, ge=1, description="Cache blocks whose token ids are remembered for replication by recomputation."
    )
    engine_args: dict[str, Any] = Field(
        default_factory=dict, description="Extra vLLM engine arguments passed verbatim (AsyncEngineArgs fields)."
    )
