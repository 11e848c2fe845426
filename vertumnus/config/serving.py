"""The HTTP server (``vertumnus serve``) and its decode side."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from vertumnus.config._base import Section


class ServingConfig(Section):
    host: str = Field("127.0.0.1", description="HTTP bind address.")
    port: int = Field(8000, ge=0, le=65535, description="HTTP port (0: pick a free one).")
    cpu_slots: int = Field(4, ge=1, description="CPU rank slots when running without GPUs (one thread each).")
    max_inflight: int = Field(256, ge=1, description="Admission limit; beyond it requests get 429.")
    admin_token: str | None = Field(None, description="Bearer token for /v1/pool/reconfigure; empty: disabled.")
    decode_actors: int = Field(1, ge=0, description="Embedded decode actors (0: use decode_url).")
    decode_url: str | None = Field(None, description="External OpenAI-compatible decode endpoint.")
    kv_export_path: str | None = Field(
        None,
        description="pool.engine torch with decode_url: write each prefill's KV under this directory as vLLM "
        "ExampleConnector files (the decode instance's shared_storage_path, a vLLM CPU build) so it loads the "
        "prompt instead of recomputing it (docs/vllm.md); empty: the decode endpoint recomputes the prompt.",
    )
    kv_export_block_size: int = Field(
        32, ge=1, description="The decode instance's KV block size (vllm serve --block-size); whole blocks export."
    )
    engine_block_tokens: int = Field(16, ge=1, description="Engine KV block size (tokens).")
    default_max_tokens: int = Field(16, ge=1, description="max_tokens when a request does not set it.")
    startup_timeout_s: float = Field(600.0, gt=0, description="Seconds to wait for every rank to come up.")
    test_hooks: bool = Field(
        False,
        description="Tests only: enable /v1/test/hold, /v1/test/release (hold prefills on workers until released) "
        "and /v1/test/fail (fail a worker; it restarts empty); admin token required. Never set in production.",
    )
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="Rank device: auto = one GPU per rank when the Ray cluster has GPUs, else CPU slots."
    )
    tokenizer: str | None = Field(
        None,
        description="Hugging Face tokenizer directory for real models (local files only); empty: the byte-level "
        "tokenizer of the tiny reference model (vertumnus/serving/tokenizer.py).",
    )
    ray_node_resource: str | None = Field(
        None,
        pattern=r"^[A-Za-z_][A-Za-z0-9_.-]*$",
        description="Ray custom resource that marks a Ray node able to host one pool node (one unit per such node, "
        "e.g. `ray start --resources '{\"vertumnus_pool_node\": 1}'`). Each pool node's placement group asks for "
        "one unit, so no two pool nodes share a Ray node and a lost node's pool node is placed again only on such "
        "a node; start-up fails at once, naming the resource, when fewer than pool.nodes such Ray nodes exist. "
        "Empty: no mapping (pool nodes may share a Ray node, e.g. one local cluster).",
    )
