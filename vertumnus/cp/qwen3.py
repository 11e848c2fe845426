"""Named tiny Qwen3 / Qwen3-MoE shapes and a writer of Hugging Face checkpoint directories for them.

The torch engine builds its model from ``model.path`` (a ``save_pretrained``-style directory, read by
:func:`vertumnus.cp.weights.load_hf_weights`), so a preset becomes runnable by writing its random weights as such
a directory::

    path = write_preset("tiny-qwen3-moe", tmp_dir)        # config.json + model.safetensors, HF tensor names
    cfg.model.path = str(path)

The directory reads back bit-identically and also loads in ``transformers`` (``Qwen3MoeForCausalLM``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from vertumnus.cp.weights import LlamaWeights, dims_from_hf_config, random_weights

_TINY: dict[str, Any] = {
    "vocab_size": 512,
    "hidden_size": 256,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 64,  # ≠ hidden / heads, as in the real models
    "num_hidden_layers": 2,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
    "rms_norm_eps": 1e-6,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "max_position_embeddings": 65536,
    "dtype": "float32",
}

# Qwen3-30B-A3B in miniature: 32 experts, top-4 (active MLP width 4 × 128 = 512), every layer sparse.
PRESETS: dict[str, dict[str, Any]] = {
    "tiny-qwen3": {
        **_TINY,
        "model_type": "qwen3",
        "architectures": ["Qwen3ForCausalLM"],
        "intermediate_size": 512,
    },
    "tiny-qwen3-moe": {
        **_TINY,
        "model_type": "qwen3_moe",
        "architectures": ["Qwen3MoeForCausalLM"],
        "intermediate_size": 512,
        "moe_intermediate_size": 128,
        "num_experts": 32,
        "num_experts_per_tok": 4,
        "norm_topk_prob": True,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
    },
}


# The shape of Qwen3-30B-A3B (its config.json's architecture fields): for random-weight measurements on a GPU
# (benchmarks/gpu_check.py --model qwen3-30b-a3b); ~30.5 B parameters, ~61 GB in bf16. Not a preset: its
# checkpoint is never written.
QWEN3_30B_A3B: dict[str, Any] = {
    "model_type": "qwen3_moe",
    "architectures": ["Qwen3MoeForCausalLM"],
    "vocab_size": 151936,
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "moe_intermediate_size": 768,
    "num_hidden_layers": 48,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "norm_topk_prob": True,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
    "rms_norm_eps": 1e-6,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "max_position_embeddings": 40960,
    "dtype": "bfloat16",
}


def dense_equivalent(config: dict[str, Any]) -> dict[str, Any]:
    """The dense Qwen3 config of the same active size as a Qwen3-MoE ``config`` (MLP width top_k × expert width)."""
    moe_keys = ("moe_intermediate_size", "num_experts", "num_experts_per_tok", "norm_topk_prob")
    out = {k: v for k, v in config.items() if k not in (*moe_keys, "decoder_sparse_step", "mlp_only_layers")}
    out |= {
        "model_type": "qwen3",
        "architectures": ["Qwen3ForCausalLM"],
        "intermediate_size": int(config["moe_intermediate_size"]) * int(config["num_experts_per_tok"]),
    }
    return out


def preset_config(name: str) -> dict[str, Any]:
    """The HF config mapping of preset ``name``."""
    if name not in PRESETS:
        raise ValueError(f"unknown model preset {name!r}; expected one of {', '.join(PRESETS)}")
    return json.loads(json.dumps(PRESETS[name]))  # a deep copy


def state_dict(w: LlamaWeights) -> dict[str, torch.Tensor]:
    """``w`` under the HF parameter names (per-expert layout; the inverse of ``load_hf_weights``)."""
    sd: dict[str, torch.Tensor] = {"model.embed_tokens.weight": w.embed, "model.norm.weight": w.norm}
    if not w.dims.tie_embeddings:
        sd["lm_head.weight"] = w.lm_head
    for i, lw in enumerate(w.layers):
        p = f"model.layers.{i}."
        named: dict[str, torch.Tensor | None] = {
            "input_layernorm.weight": lw.attn_norm,
            "post_attention_layernorm.weight": lw.mlp_norm,
            "self_attn.q_proj.weight": lw.wq,
            "self_attn.k_proj.weight": lw.wk,
            "self_attn.v_proj.weight": lw.wv,
            "self_attn.o_proj.weight": lw.wo,
            "self_attn.q_proj.bias": lw.bq,
            "self_attn.k_proj.bias": lw.bk,
            "self_attn.v_proj.bias": lw.bv,
            "self_attn.o_proj.bias": lw.bo,
            "self_attn.q_norm.weight": lw.q_norm,
            "self_attn.k_norm.weight": lw.k_norm,
            "mlp.gate_proj.weight": lw.w_gate,
            "mlp.up_proj.weight": lw.w_up,
            "mlp.down_proj.weight": lw.w_down,
        }
        if lw.moe is not None:
            named["mlp.gate.weight"] = lw.moe.router
            for e in range(lw.moe.num_experts):
                named[f"mlp.experts.{e}.gate_proj.weight"] = lw.moe.w_gate[e]
                named[f"mlp.experts.{e}.up_proj.weight"] = lw.moe.w_up[e]
                named[f"mlp.experts.{e}.down_proj.weight"] = lw.moe.w_down[e]
        sd |= {p + k: t for k, t in named.items() if t is not None}
    return {k: v.detach().cpu().contiguous() for k, v in sd.items()}


def write_checkpoint(config: dict[str, Any], path: str | Path, seed: int = 0) -> Path:
    """Write random weights (from ``seed``) of HF ``config`` as a checkpoint directory at ``path``."""
    from safetensors.torch import save_file

    root = Path(path)
    root.mkdir(parents=True, exist_ok=True)
    w = random_weights(dims_from_hf_config(config), seed)
    (root / "config.json").write_text(json.dumps(config, indent=2))
    save_file(state_dict(w), str(root / "model.safetensors"), metadata={"format": "pt"})
    return root


def write_preset(name: str, path: str | Path, seed: int = 0) -> Path:
    """Write preset ``name`` (random weights from ``seed``) as a checkpoint directory at ``path``."""
    return write_checkpoint(preset_config(name), path, seed)
