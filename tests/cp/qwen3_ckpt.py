"""Tiny random Qwen3 / Qwen3-MoE checkpoints written with ``transformers`` (the independent reference; no downloads).

head_dim 32 ≠ hidden / heads = 16, GQA 4/2 heads, vocab 256, fp32. The MoE model has 8 experts, top-2,
``norm_topk_prob``, and layer 1 dense through ``mlp_only_layers``. Parameters are redrawn at O(1) scale (norm
weights around 1, linear and expert weights N(0, 1/fan_in), a random router) so a wrong name mapping, norm order,
RoPE convention or routing shows in the logits.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

VOCAB = 256
COMMON: dict[str, Any] = {
    "vocab_size": VOCAB,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "rope_theta": 1000.0,
    "max_position_embeddings": 512,
}


def _redraw(model: torch.nn.Module, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5)


def hf_qwen3(seed: int = 0, **overrides: Any) -> Any:
    """A random ``Qwen3ForCausalLM`` (tied embeddings, 2 layers)."""
    import transformers

    cfg = transformers.Qwen3Config(
        **{**COMMON, "intermediate_size": 96, "num_hidden_layers": 2, "tie_word_embeddings": True, **overrides}
    )
    model = transformers.Qwen3ForCausalLM(cfg).eval()
    _redraw(model, seed)
    return model


def hf_qwen3_moe(seed: int = 0, **overrides: Any) -> Any:
    """A random ``Qwen3MoeForCausalLM`` (3 layers, layer 1 dense, 8 experts top-2, untied head)."""
    import transformers

    cfg = transformers.Qwen3MoeConfig(
        **{
            **COMMON,
            "intermediate_size": 80,
            "moe_intermediate_size": 48,
            "num_hidden_layers": 3,
            "num_experts": 8,
            "num_experts_per_tok": 2,
            "norm_topk_prob": True,
            "mlp_only_layers": [1],
            "tie_word_embeddings": False,
            **overrides,
        }
    )
    model = transformers.Qwen3MoeForCausalLM(cfg).eval()
    _redraw(model, seed)
    return model


def save(model: Any, path: Path, **kw: Any) -> Path:
    model.save_pretrained(path, **kw)
    return path
