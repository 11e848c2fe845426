"""Reference model: KV-cache forward equals the full forward, decode continues a prefill's KV, HF weights load."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from vertumnus.config import ModelConfig
from vertumnus.cp.model import KVCache, ReferenceModel
from vertumnus.cp.weights import dims_from_hf_config, load_hf_weights

CFG = ModelConfig(hidden_size=64, intermediate_size=128, num_heads=4, num_kv_heads=2, vocab_size=200, seed=3)


@pytest.fixture(scope="module")
def model() -> ReferenceModel:
    return ReferenceModel.from_config(CFG)


def _ids(n: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 200, (n,), generator=torch.Generator().manual_seed(seed))


def test_incremental_forward_equals_full_forward(model: ReferenceModel) -> None:
    ids = _ids(40, 1)
    full = model.forward(ids, KVCache(model.dims))
    cache = KVCache(model.dims, capacity=4)  # forces the buffer to grow
    parts = [model.forward(ids[a:b], cache) for a, b in [(0, 17), (17, 18), (18, 40)]]
    assert (torch.cat(parts) - full).abs().max().item() <= 1e-4
    assert cache.length == 40 and cache.tensor().shape == (2, 2, 2, 40, 16)


def test_same_seed_same_weights_and_logits_depend_on_the_seed() -> None:
    a, b = ReferenceModel.from_config(CFG), ReferenceModel.from_config(CFG)
    c = ReferenceModel.from_config(CFG.model_copy(update={"seed": 4}))
    ids = _ids(9, 2)
    assert torch.equal(a.prefill(ids)[0], b.prefill(ids)[0])
    assert not torch.allclose(a.prefill(ids)[0], c.prefill(ids)[0])


def test_decode_continues_from_an_exported_kv(model: ReferenceModel) -> None:
    ids = _ids(30, 3).tolist()
    expected = model.generate(ids, 6)
    logits, cache = model.prefill(ids)
    again = model.decode(KVCache.from_tensor(cache.tensor().clone(), model.dims), logits, 6)
    assert again == expected and len(expected) == 6
    sampled = model.decode(KVCache.from_tensor(cache.tensor().clone(), model.dims), logits, 6, temperature=1.0, seed=7)
    assert sampled == model.decode(
        KVCache.from_tensor(cache.tensor().clone(), model.dims), logits, 6, temperature=1.0, seed=7
    )
    assert model.decode(KVCache.from_tensor(cache.tensor(), model.dims), logits, 6, stop_ids=[expected[0]]) == [
        expected[0]
    ]


def test_loads_a_transformers_save_pretrained_directory(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(
        vocab_size=120,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        rope_theta=500.0,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # O(1) activations so a wrong name mapping or RoPE convention shows in the logits
        for p in hf.parameters():
            p.normal_(0.0, 1.0 / p.shape[-1] ** 0.5 if p.dim() == 2 else 0.1).add_(1.0 if p.dim() == 1 else 0.0)
    hf.save_pretrained(tmp_path)
    mine = ReferenceModel(load_hf_weights(tmp_path))
    assert mine.dims.rope_theta == 500.0 and mine.dims.num_kv_heads == 2
    ids = torch.randint(0, 120, (25,), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        ref = hf(ids[None]).logits[0]
    got = mine.forward(ids, KVCache(mine.dims))
    assert ref.abs().max() > 1.0
    assert (got - ref).abs().max().item() <= 1e-4
    loaded = ReferenceModel.from_config(ModelConfig(path=str(tmp_path)))
    assert torch.equal(loaded.prefill(ids)[0], mine.prefill(ids)[0])


def test_rejects_unsupported_checkpoints(tmp_path: Path) -> None:
    base = {
        "vocab_size": 10,
        "hidden_size": 8,
        "intermediate_size": 8,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
    }
    with pytest.raises(ValueError, match="rope type 'llama3'"):
        dims_from_hf_config({**base, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}})
    with pytest.raises(ValueError, match=r"no config\.json"):
        load_hf_weights(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(base))
    with pytest.raises(ValueError, match=r"no \*.safetensors"):
        load_hf_weights(tmp_path)
