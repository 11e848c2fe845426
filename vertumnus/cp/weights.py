"""Weights of the Llama-style reference model: random from a seed, or read from a local safetensors directory.

A local directory written by ``transformers``' ``save_pretrained`` for a ``LlamaForCausalLM`` (``config.json``
plus ``model.safetensors`` or sharded ``model-0000x-of-0000y.safetensors``) is read with the HF parameter names
mapped as below; nothing is downloaded. Linear weights keep the HF ``[out_features, in_features]`` layout.

    model.embed_tokens.weight                      -> embed
    model.layers.{i}.input_layernorm.weight        -> layers[i].attn_norm
    model.layers.{i}.self_attn.{q,k,v,o}_proj.*    -> layers[i].wq / wk / wv / wo (+ optional biases)
    model.layers.{i}.post_attention_layernorm.*    -> layers[i].mlp_norm
    model.layers.{i}.mlp.{gate,up,down}_proj.weight -> layers[i].w_gate / w_up / w_down
    model.norm.weight                              -> norm
    lm_head.weight (absent when tied)              -> lm_head
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:  # runtime needs only torch (benchmarks/gpu_check.py runs without the config stack)
    from vertumnus.config import ModelConfig

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(slots=True, frozen=True)
class ModelDims:
    """Shape of the reference model (what the forward needs; plain data so it pickles to rank processes)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float = 10000.0
    rms_eps: float = 1e-6
    dtype: str = "float32"

    @property
    def torch_dtype(self) -> torch.dtype:
        return _DTYPES[self.dtype]

    @property
    def group(self) -> int:
        """Query heads per KV head (GQA)."""
        return self.num_heads // self.num_kv_heads

    @staticmethod
    def from_config(cfg: ModelConfig) -> ModelDims:
        return ModelDims(
            vocab_size=cfg.vocab_size,
            hidden_size=cfg.hidden_size,
            intermediate_size=cfg.intermediate_size,
            num_layers=cfg.num_layers,
            num_heads=cfg.num_heads,
            num_kv_heads=cfg.num_kv_heads,
            head_dim=cfg.hidden_size // cfg.num_heads,
            rope_theta=cfg.rope_theta,
            dtype=cfg.dtype,
        )


@dataclass(slots=True)
class LayerWeights:
    attn_norm: torch.Tensor
    wq: torch.Tensor
    wk: torch.Tensor
    wv: torch.Tensor
    wo: torch.Tensor
    mlp_norm: torch.Tensor
    w_gate: torch.Tensor
    w_up: torch.Tensor
    w_down: torch.Tensor
    bq: torch.Tensor | None = None
    bk: torch.Tensor | None = None
    bv: torch.Tensor | None = None
    bo: torch.Tensor | None = None


@dataclass(slots=True)
class LlamaWeights:
    dims: ModelDims
    embed: torch.Tensor
    layers: list[LayerWeights]
    norm: torch.Tensor
    lm_head: torch.Tensor

    def to(self, device: torch.device | str, dtype: torch.dtype | None = None) -> LlamaWeights:
        """A copy on ``device`` (and ``dtype`` for floating tensors)."""

        def mv(t: torch.Tensor) -> torch.Tensor:
            return t.to(device=device, dtype=dtype) if dtype is not None else t.to(device)

        def mv_opt(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else mv(t)

        layers = [
            LayerWeights(
                mv(lw.attn_norm),
                mv(lw.wq),
                mv(lw.wk),
                mv(lw.wv),
                mv(lw.wo),
                mv(lw.mlp_norm),
                mv(lw.w_gate),
                mv(lw.w_up),
                mv(lw.w_down),
                mv_opt(lw.bq),
                mv_opt(lw.bk),
                mv_opt(lw.bv),
                mv_opt(lw.bo),
            )
            for lw in self.layers
        ]
        dims = self.dims
        if dtype is not None:
            dims = replace(dims, dtype=next(k for k, v in _DTYPES.items() if v == dtype))
        return LlamaWeights(dims, mv(self.embed), layers, mv(self.norm), mv(self.lm_head))


def random_weights(dims: ModelDims, seed: int, device: torch.device | str = "cpu") -> LlamaWeights:
    """Deterministic random weights (same seed and device type → same tensors in every process).

    Linear layers are N(0, 1/fan_in) so activations stay O(1) and attention is not uniform — a masking or
    ordering error then shows up in the logits, which is what the correctness tests rely on. ``device``: where
    to draw them (large models on a GPU; the values differ from a CPU draw).
    """
    dev = torch.device(device)
    g = torch.Generator(device=dev).manual_seed(seed)
    h, d, hq, hk, f = dims.hidden_size, dims.head_dim, dims.num_heads, dims.num_kv_heads, dims.intermediate_size

    dt = dims.torch_dtype

    def lin(out_f: int, in_f: int) -> torch.Tensor:
        return (torch.randn(out_f, in_f, generator=g, device=dev) / math.sqrt(in_f)).to(dt)

    def norm_w(n: int) -> torch.Tensor:
        return (1.0 + 0.1 * torch.randn(n, generator=g, device=dev)).to(dt)

    layers = [
        LayerWeights(
            attn_norm=norm_w(h),
            wq=lin(hq * d, h),
            wk=lin(hk * d, h),
            wv=lin(hk * d, h),
            wo=lin(h, hq * d),
            mlp_norm=norm_w(h),
            w_gate=lin(f, h),
            w_up=lin(f, h),
            w_down=lin(h, f),
        )
        for _ in range(dims.num_layers)
    ]
    embed = torch.randn(dims.vocab_size, h, generator=g, device=dev).to(dt)
    return LlamaWeights(dims, embed, layers, norm_w(h), lin(dims.vocab_size, h))


def dims_from_hf_config(config: dict[str, Any], dtype: str | None = None) -> ModelDims:
    """ModelDims from a HF ``config.json`` mapping (Llama family)."""
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type not in ("default", None):
        raise ValueError(f"rope type {rope_type!r} is not supported by the reference model (only default RoPE)")
    heads = int(config["num_attention_heads"])
    hidden = int(config["hidden_size"])
    if config.get("mlp_bias"):
        raise ValueError("mlp_bias=True is not supported by the reference model")
    torch_dtype = dtype or str(config.get("dtype") or config.get("torch_dtype") or "float32")
    if torch_dtype not in _DTYPES:
        torch_dtype = "float32"
    return ModelDims(
        vocab_size=int(config["vocab_size"]),
        hidden_size=hidden,
        intermediate_size=int(config["intermediate_size"]),
        num_layers=int(config["num_hidden_layers"]),
        num_heads=heads,
        num_kv_heads=int(config.get("num_key_value_heads") or heads),
        head_dim=int(config.get("head_dim") or hidden // heads),
        rope_theta=float(rope.get("rope_theta", config.get("rope_theta", 10000.0))),
        rms_eps=float(config.get("rms_norm_eps", 1e-6)),
        dtype=torch_dtype,
    )


def load_hf_weights(path: str | Path, dtype: str | None = None) -> LlamaWeights:
    """Read a local ``save_pretrained`` directory of a Llama-architecture model (no downloads)."""
    from safetensors.torch import load_file

    root = Path(path)
    cfg_file = root / "config.json"
    if not cfg_file.is_file():
        raise ValueError(f"model path {root} has no config.json (expected a save_pretrained directory)")
    config = json.loads(cfg_file.read_text())
    dims = dims_from_hf_config(config, dtype)
    files = sorted(root.glob("*.safetensors"))
    if not files:
        raise ValueError(f"model path {root} has no *.safetensors files")
    sd: dict[str, torch.Tensor] = {}
    for f in files:
        sd.update(load_file(str(f)))

    def take(name: str, required: bool = True) -> torch.Tensor | None:
        t = sd.get(name)
        if t is None and required:
            raise ValueError(f"{root}: missing tensor {name!r}")
        return t

    def req(name: str) -> torch.Tensor:
        t = take(name)
        assert t is not None
        return t

    layers = []
    for i in range(dims.num_layers):
        p = f"model.layers.{i}."
        layers.append(
            LayerWeights(
                attn_norm=req(p + "input_layernorm.weight"),
                wq=req(p + "self_attn.q_proj.weight"),
                wk=req(p + "self_attn.k_proj.weight"),
                wv=req(p + "self_attn.v_proj.weight"),
                wo=req(p + "self_attn.o_proj.weight"),
                mlp_norm=req(p + "post_attention_layernorm.weight"),
                w_gate=req(p + "mlp.gate_proj.weight"),
                w_up=req(p + "mlp.up_proj.weight"),
                w_down=req(p + "mlp.down_proj.weight"),
                bq=take(p + "self_attn.q_proj.bias", False),
                bk=take(p + "self_attn.k_proj.bias", False),
                bv=take(p + "self_attn.v_proj.bias", False),
                bo=take(p + "self_attn.o_proj.bias", False),
            )
        )
    embed = req("model.embed_tokens.weight")
    lm_head = take("lm_head.weight", False)
    if lm_head is None:  # tie_word_embeddings
        lm_head = embed
    w = LlamaWeights(dims, embed, layers, req("model.norm.weight"), lm_head)
    return w.to("cpu", dims.torch_dtype)


def load_weights(cfg: ModelConfig) -> LlamaWeights:
    """The weights ``cfg`` asks for: ``cfg.path`` (local safetensors directory) or random from ``cfg.seed``."""
    if cfg.path:
        return load_hf_weights(cfg.path, cfg.dtype)
    return random_weights(ModelDims.from_config(cfg), cfg.seed)
