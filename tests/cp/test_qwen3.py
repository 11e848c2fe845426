"""Qwen3 and Qwen3-MoE in the reference model equal ``transformers``' Qwen3ForCausalLM / Qwen3MoeForCausalLM
(fp32, ≤ 1e-4) on tiny random checkpoints: single file, sharded with an index, the fused expert layout, the KV
cache path, the sparse-layer rule, and random weights from a config."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from qwen3_ckpt import VOCAB, hf_qwen3, hf_qwen3_moe, save

from vertumnus.config import ModelConfig
from vertumnus.cp.model import KVCache, ReferenceModel
from vertumnus.cp.moe import MoEWeights, moe_forward
from vertumnus.cp.weights import dims_from_hf_config, load_hf_weights, random_weights

pytest.importorskip("transformers")
TOL = 1e-4


def _ids(n: int, seed: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed))


def _hf_logits(hf: Any, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return hf(ids[None]).logits[0]


def _check(hf: Any, mine: ReferenceModel, ids: torch.Tensor) -> None:
    ref = _hf_logits(hf, ids)
    assert ref.abs().max() > 1.0  # O(1) logits: a wrong mapping could not hide below the tolerance
    full = mine.forward(ids, KVCache(mine.dims))
    assert (full - ref).abs().max().item() <= TOL
    cache = KVCache(mine.dims, capacity=4)  # the cached path (grows, continues at positions > 0) agrees too
    parts = torch.cat([mine.forward(ids[a:b], cache) for a, b in [(0, 13), (13, 14), (14, ids.numel())]])
    assert (parts - ref).abs().max().item() <= TOL


def test_qwen3_dense_equals_transformers(tmp_path: Path) -> None:
    hf = hf_qwen3()
    mine = ReferenceModel(load_hf_weights(save(hf, tmp_path)))
    d = mine.dims
    assert (d.model_type, d.qk_norm, d.head_dim, d.tie_embeddings, d.sparse_layers) == ("qwen3", True, 32, True, ())
    assert mine.w.layers[0].q_norm is not None and mine.w.layers[0].q_norm.shape == (32,)
    _check(hf, mine, _ids(37, 1))
    via_config = ReferenceModel.from_config(ModelConfig(path=str(tmp_path)))  # the engine's path (model.path)
    assert torch.equal(via_config.prefill(_ids(9, 2))[0], mine.prefill(_ids(9, 2))[0])


def test_qwen3_moe_sharded_equals_transformers(tmp_path: Path) -> None:
    hf = hf_qwen3_moe()
    save(hf, tmp_path, max_shard_size="100KB")
    shards = sorted(p.name for p in tmp_path.glob("*.safetensors"))
    assert len(shards) > 2 and (tmp_path / "model.safetensors.index.json").is_file()
    mine = ReferenceModel(load_hf_weights(tmp_path))
    d = mine.dims
    assert (d.model_type, d.num_experts, d.top_k, d.norm_topk_prob, d.sparse_layers) == (
        "qwen3_moe",
        8,
        2,
        True,
        (0, 2),
    )
    assert mine.w.layers[1].moe is None and mine.w.layers[1].w_gate is not None
    moe = mine.w.layers[0].moe
    assert moe is not None and moe.w_gate.shape == (8, 48, 64) and moe.w_down.shape == (8, 64, 48)
    _check(hf, mine, _ids(41, 3))


def test_qwen3_moe_without_topk_renorm_and_fused_expert_layout(tmp_path: Path) -> None:
    """``norm_topk_prob`` false, every layer sparse; tensors saved in transformers' in-memory fused layout."""
    from safetensors.torch import save_file

    hf = hf_qwen3_moe(seed=5, norm_topk_prob=False, mlp_only_layers=[], num_hidden_layers=2)
    sd = {k: v.contiguous() for k, v in hf.state_dict().items()}
    assert any(k.endswith("mlp.experts.gate_up_proj") for k in sd)  # the fused form is what is on disk here
    save_file(sd, str(tmp_path / "model.safetensors"))
    hf.config.to_json_file(str(tmp_path / "config.json"))
    mine = ReferenceModel(load_hf_weights(tmp_path))
    assert mine.dims.sparse_layers == (0, 1) and not mine.dims.norm_topk_prob
    _check(hf, mine, _ids(29, 4))


def test_sparse_layer_rule_matches_transformers() -> None:
    """``mlp_only_layers`` and ``decoder_sparse_step`` pick the same sparse layers as transformers."""
    import transformers

    for step, only in [(2, []), (1, [0, 3]), (3, [2])]:
        hf = hf_qwen3_moe(num_hidden_layers=6, decoder_sparse_step=step, mlp_only_layers=only)
        want = tuple(
            i
            for i, layer in enumerate(hf.model.layers)
            if isinstance(layer.mlp, transformers.models.qwen3_moe.modeling_qwen3_moe.Qwen3MoeSparseMoeBlock)
        )
        assert dims_from_hf_config(hf.config.to_dict()).sparse_layers == want, (step, only)


def test_random_weights_from_a_hf_config_run(tmp_path: Path) -> None:
    """Random weights from a config.json alone (no safetensors): the shapes the checkpoint would have."""
    cfg = hf_qwen3_moe().config.to_dict()
    dims = dims_from_hf_config(cfg)
    w = random_weights(dims, seed=1)
    assert w.layers[1].moe is None and w.layers[0].moe is not None and w.layers[0].moe.router.shape == (8, 64)
    tied = random_weights(dims_from_hf_config({**cfg, "tie_word_embeddings": True}), seed=1)
    assert tied.lm_head is tied.embed and w.lm_head is not w.embed
    model = ReferenceModel(w)
    logits, cache = model.prefill(_ids(20, 6))
    assert logits.shape == (VOCAB,) and cache.tensor().shape == (3, 2, 2, 20, 32)
    assert torch.isfinite(logits).all()


def test_moe_forward_equals_a_per_token_sum() -> None:
    """The grouped (argsort / index_add) MoE equals the definition evaluated token by token."""
    g = torch.Generator().manual_seed(0)
    e, f, h, k = 6, 12, 16, 3
    w = MoEWeights(*(torch.randn(s, generator=g) for s in [(e, h), (e, f, h), (e, f, h), (e, h, f)]))
    x = torch.randn(23, h, generator=g)
    for norm in (True, False):
        got = moe_forward(x, w, k, norm)
        for t in range(x.shape[0]):
            p = torch.softmax(w.router @ x[t], -1)
            top, idx = p.topk(k)
            top = top / top.sum() if norm else top
            want = sum(
                wt * (w.w_down[j] @ (torch.nn.functional.silu(w.w_gate[j] @ x[t]) * (w.w_up[j] @ x[t])))
                for wt, j in zip(top.tolist(), idx.tolist(), strict=True)
            )
            assert (got[t] - want).abs().max().item() <= 1e-4


def test_rejects_unsupported_qwen3_configs(tmp_path: Path) -> None:
    base = hf_qwen3_moe().config.to_dict()
    with pytest.raises(ValueError, match="use_sliding_window"):
        dims_from_hf_config({**base, "use_sliding_window": True})
    with pytest.raises(ValueError, match="num_experts_per_tok"):
        dims_from_hf_config({**base, "num_experts_per_tok": 9})
    with pytest.raises(ValueError, match="hidden_act 'gelu'"):
        dims_from_hf_config({**base, "hidden_act": "gelu"})
    hf = hf_qwen3_moe()
    save(hf, tmp_path, max_shard_size="100KB")
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    missing = sorted(set(index["weight_map"].values()))[0]
    (tmp_path / missing).unlink()
    with pytest.raises(ValueError, match=f"missing: {missing}"):
        load_hf_weights(tmp_path)
