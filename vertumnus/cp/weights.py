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

Qwen3 (``model_type`` "qwen3") adds per-head q/k RMSNorm and an explicit ``head_dim``; Qwen3-MoE ("qwen3_moe")
replaces the MLP of its sparse layers by a router and E SwiGLU experts (:mod:`vertumnus.cp.moe`)::

    model.layers.{i}.self_attn.{q,k}_norm.weight                 -> layers[i].q_norm / k_norm   ([head_dim])
    model.layers.{i}.mlp.gate.weight                             -> layers[i].moe.router        ([E, hidden])
    model.layers.{i}.mlp.experts.{e}.{gate,up,down}_proj.weight  -> layers[i].moe.w_gate/w_up/w_down[e]
    (or the fused model.layers.{i}.mlp.experts.gate_up_proj [E, 2F, hidden] / .down_proj [E, hidden, F])

A layer is sparse when it is not in ``mlp_only_layers`` and ``(i + 1) % decoder_sparse_step == 0`` (as in
``transformers``' Qwen3MoeDecoderLayer); the others keep the dense MLP of ``intermediate_size``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from vertumnus.cp.moe import MoEWeights

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
    model_type: str = "llama"  # "llama" (Llama family), "qwen3", "qwen3_moe"
    qk_norm: bool = False  # Qwen3: RMSNorm over head_dim on every q and k head, before RoPE
    tie_embeddings: bool = False  # random weights: lm_head is the embedding matrix
    num_experts: int = 0  # Qwen3-MoE: experts per sparse layer (0: dense model)
    top_k: int = 0  # experts per token
    moe_intermediate_size: int = 0  # SwiGLU width of one expert
    norm_topk_prob: bool = False  # renormalise the top-k routing weights to sum 1
    sparse_layers: tuple[int, ...] = ()  # layers whose MLP is the MoE block

    def is_sparse(self, layer: int) -> bool:
        """Whether ``layer``'s MLP is the MoE block."""
        return layer in self.sparse_layers

    def describe(self) -> dict[str, object]:
        """The shape as benchmark reports print it (JSON-ready)."""
        return {
            "type": self.model_type, "layers": self.num_layers, "hidden": self.hidden_size, "heads": self.num_heads,
            "kv_heads": self.num_kv_heads, "head_dim": self.head_dim, "intermediate": self.intermediate_size,
            "experts": self.num_experts, "top_k": self.top_k, "expert_intermediate": self.moe_intermediate_size,
            "dtype": self.dtype,
        }  # fmt: skip

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
    w_gate: torch.Tensor | None  # dense SwiGLU (None on a sparse layer)
    w_up: torch.Tensor | None
    w_down: torch.Tensor | None
    bq: torch.Tensor | None = None
    bk: torch.Tensor | None = None
    bv: torch.Tensor | None = None
    bo: torch.Tensor | None = None
    q_norm: torch.Tensor | None = None  # Qwen3 per-head RMSNorm weights [head_dim]
    k_norm: torch.Tensor | None = None
    moe: MoEWeights | None = None  # sparse layer's experts (then w_gate / w_up / w_down are None)


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
                mv_opt(lw.w_gate),
                mv_opt(lw.w_up),
                mv_opt(lw.w_down),
                mv_opt(lw.bq),
                mv_opt(lw.bk),
                mv_opt(lw.bv),
                mv_opt(lw.bo),
                mv_opt(lw.q_norm),
                mv_opt(lw.k_norm),
                None if lw.moe is None else lw.moe.to(device, dtype),
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

    def experts(n: int, out_f: int, in_f: int) -> torch.Tensor:
        return (torch.randn(n, out_f, in_f, generator=g, device=dev) / math.sqrt(in_f)).to(dt)

    layers = []
    for i in range(dims.num_layers):  # draw order: the Llama layout first, so Llama weights stay as they were
        lw = LayerWeights(
            attn_norm=norm_w(h),
            wq=lin(hq * d, h),
            wk=lin(hk * d, h),
            wv=lin(hk * d, h),
            wo=lin(h, hq * d),
            mlp_norm=norm_w(h),
            w_gate=None,
            w_up=None,
            w_down=None,
        )
        if dims.is_sparse(i):
            e, fm = dims.num_experts, dims.moe_intermediate_size
            lw.moe = MoEWeights(lin(e, h), experts(e, fm, h), experts(e, fm, h), experts(e, h, fm))
        else:
            lw.w_gate, lw.w_up, lw.w_down = lin(f, h), lin(f, h), lin(h, f)
        if dims.qk_norm:
            lw.q_norm, lw.k_norm = norm_w(d), norm_w(d)
        layers.append(lw)
    embed = torch.randn(dims.vocab_size, h, generator=g, device=dev).to(dt)
    norm = norm_w(h)
    lm_head = embed if dims.tie_embeddings else lin(dims.vocab_size, h)
    return LlamaWeights(dims, embed, layers, norm, lm_head)


_QWEN3 = ("qwen3", "qwen3_moe")


def dims_from_hf_config(config: dict[str, Any], dtype: str | None = None) -> ModelDims:
    """ModelDims from a HF ``config.json`` mapping: ``model_type`` "qwen3" / "qwen3_moe", else the Llama family."""
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type not in ("default", None):
        raise ValueError(f"rope type {rope_type!r} is not supported by the reference model (only default RoPE)")
    heads = int(config["num_attention_heads"])
    hidden = int(config["hidden_size"])
    if config.get("mlp_bias"):
        raise ValueError("mlp_bias=True is not supported by the reference model")
    model_type = str(config.get("model_type") or "llama")
    if config.get("hidden_act", "silu") != "silu":
        raise ValueError(f"hidden_act {config['hidden_act']!r} is not supported by the reference model (only silu)")
    torch_dtype = dtype or str(config.get("dtype") or config.get("torch_dtype") or "float32")
    if torch_dtype not in _DTYPES:
        torch_dtype = "float32"
    layers = int(config["num_hidden_layers"])
    extra: dict[str, Any] = {}
    if model_type in _QWEN3:
        if config.get("use_sliding_window"):
            raise ValueError("use_sliding_window=True is not supported by the reference model (full attention only)")
        extra = {"model_type": model_type, "qk_norm": True}
    if model_type == "qwen3_moe":
        experts = int(config.get("num_experts") or config.get("num_local_experts") or 0)
        step = int(config.get("decoder_sparse_step") or 1)
        dense = set(config.get("mlp_only_layers") or [])
        sparse = tuple(i for i in range(layers) if experts > 0 and i not in dense and (i + 1) % step == 0)
        top_k = int(config.get("num_experts_per_tok") or 0)
        if sparse and not 1 <= top_k <= experts:
            raise ValueError(f"num_experts_per_tok must be in 1..num_experts ({experts}), got {top_k}")
        extra |= {
            "num_experts": experts,
            "top_k": top_k,
            "moe_intermediate_size": int(config.get("moe_intermediate_size") or 0),
            "norm_topk_prob": bool(config.get("norm_topk_prob", False)),
            "sparse_layers": sparse,
        }
    return ModelDims(
        vocab_size=int(config["vocab_size"]),
        hidden_size=hidden,
        intermediate_size=int(config["intermediate_size"]),
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=int(config.get("num_key_value_heads") or heads),
        head_dim=int(config.get("head_dim") or hidden // heads),
        rope_theta=float(rope.get("rope_theta", config.get("rope_theta", 10000.0))),
        rms_eps=float(config.get("rms_norm_eps", 1e-6)),
        dtype=torch_dtype,
        tie_embeddings=bool(config.get("tie_word_embeddings", False)),
        **extra,
    )


def _safetensors_files(root: Path) -> list[Path]:
    """The checkpoint's files: those the sharded index names (``model.safetensors.index.json``), else all."""
    index = root / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(json.loads(index.read_text()).get("weight_map", {}).values()))
        missing = [n for n in names if not (root / n).is_file()]
        if missing:
            raise ValueError(f"model path {root}: shard(s) named in the index are missing: {', '.join(missing)}")
        return [root / n for n in names]
    return sorted(root.glob("*.safetensors"))


def load_hf_weights(path: str | Path, dtype: str | None = None) -> LlamaWeights:
    """Read a local ``save_pretrained`` directory of a Llama, Qwen3 or Qwen3-MoE model (no downloads)."""
    from safetensors.torch import load_file

    root = Path(path)
    cfg_file = root / "config.json"
    if not cfg_file.is_file():
        raise ValueError(f"model path {root} has no config.json (expected a save_pretrained directory)")
    config = json.loads(cfg_file.read_text())
    dims = dims_from_hf_config(config, dtype)
    files = _safetensors_files(root)
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

    def experts(p: str) -> MoEWeights:
        router = req(p + "mlp.gate.weight")
        if p + "mlp.experts.gate_up_proj" in sd:  # fused layout [E, 2F, hidden] (gate rows first)
            gate, up = req(p + "mlp.experts.gate_up_proj").chunk(2, dim=1)
            return MoEWeights(router, gate.contiguous(), up.contiguous(), req(p + "mlp.experts.down_proj"))
        e = p + "mlp.experts.{}.{}_proj.weight"
        stack = [
            torch.stack([req(e.format(j, kind)) for j in range(dims.num_experts)]) for kind in ("gate", "up", "down")
        ]
        return MoEWeights(router, *stack)

    layers = []
    for i in range(dims.num_layers):
        p = f"model.layers.{i}."
        sparse = dims.is_sparse(i)
        layers.append(
            LayerWeights(
                attn_norm=req(p + "input_layernorm.weight"),
                wq=req(p + "self_attn.q_proj.weight"),
                wk=req(p + "self_attn.k_proj.weight"),
                wv=req(p + "self_attn.v_proj.weight"),
                wo=req(p + "self_attn.o_proj.weight"),
                mlp_norm=req(p + "post_attention_layernorm.weight"),
                w_gate=None if sparse else req(p + "mlp.gate_proj.weight"),
                w_up=None if sparse else req(p + "mlp.up_proj.weight"),
                w_down=None if sparse else req(p + "mlp.down_proj.weight"),
                bq=take(p + "self_attn.q_proj.bias", False),
                bk=take(p + "self_attn.k_proj.bias", False),
                bv=take(p + "self_attn.v_proj.bias", False),
                bo=take(p + "self_attn.o_proj.bias", False),
                q_norm=req(p + "self_attn.q_norm.weight") if dims.qk_norm else None,
                k_norm=req(p + "self_attn.k_norm.weight") if dims.qk_norm else None,
                moe=experts(p) if sparse else None,
            )
        )
    embed = req("model.embed_tokens.weight")
    lm_head = take("lm_head.weight", False)
    if lm_head is None or dims.tie_embeddings:  # tie_word_embeddings (a saved lm_head then equals the embedding)
        lm_head = embed
    w = LlamaWeights(dims, embed, layers, req("model.norm.weight"), lm_head)
    return w.to("cpu", dims.torch_dtype)


def load_weights(cfg: ModelConfig) -> LlamaWeights:
    """The weights ``cfg`` asks for: ``cfg.path`` (local safetensors directory) or random from ``cfg.seed``."""
    if cfg.path:
        return load_hf_weights(cfg.path, cfg.dtype)
    return random_weights(ModelDims.from_config(cfg), cfg.seed)
