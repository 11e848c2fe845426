"""What is served and how fast: the cost profile, the TTFT objective and the torch engine's reference model."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from vertumnus.config._base import Section

DEFAULT_PROFILE = "configs/profiles/qwen3-30b-a3b-h200.yaml"


class CostModelConfig(Section):
    profile: str = Field(
        DEFAULT_PROFILE,
        description="Cost profile YAML (a relative path: the CWD if it exists there, else the repo root).",
    )


class SLOConfig(Section):
    base_s: float = Field(2.0, ge=0, description="TTFT SLO τ = base_s + per_token_s × L.")
    per_token_s: float = Field(0.0002, ge=0, description="Per-input-token part of the TTFT SLO.")
    t_ext_s: float = Field(0.05, ge=0, description="T_ext: KV hand-off plus first decode token, seconds.")
    target_attainment: float = Field(0.9, gt=0, le=1, description="Target token-weighted SLO attainment.")


class ModelConfig(Section):
    name: str = Field("vertumnus-tiny", description="Model name served at /v1/models.")
    path: str | None = Field(None, description="Local safetensors directory; empty: random weights (seed).")
    seed: int = Field(0, description="Seed of the random reference weights.")
    vocab_size: int = Field(512, ge=2, description="Vocabulary size (token ids 0 .. vocab_size-1).")
    hidden_size: int = Field(128, ge=8, description="Hidden (model) dimension.")
    intermediate_size: int = Field(256, ge=8, description="MLP intermediate dimension.")
    num_layers: int = Field(2, ge=1, description="Transformer layers.")
    num_heads: int = Field(4, ge=1, description="Attention (query) heads; must divide hidden_size.")
    num_kv_heads: int = Field(2, ge=1, description="KV heads (grouped-query attention); must divide num_heads.")
    rope_theta: float = Field(10000.0, gt=0, description="RoPE base frequency.")
    dtype: Literal["float32", "bfloat16", "float16"] = Field("float32", description="Weight and activation dtype.")

    @model_validator(mode="after")
    def _heads(self) -> ModelConfig:
        if self.hidden_size % self.num_heads:
            raise ValueError("hidden_size must be a multiple of num_heads")
        if self.num_heads % self.num_kv_heads:
            raise ValueError("num_heads must be a multiple of num_kv_heads")
        return self
