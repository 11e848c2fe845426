"""The tiny Qwen3 presets written as checkpoint directories load in transformers with equal logits, and the
bench's MoE-vs-dense comparison runs (figures only, no timing asserted)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from vertumnus.bench.cp import moe_vs_dense
from vertumnus.cp.model import KVCache, ReferenceModel
from vertumnus.cp.qwen3 import dense_equivalent, preset_config, write_preset
from vertumnus.cp.weights import dims_from_hf_config, load_hf_weights


@pytest.mark.parametrize("name", ["tiny-qwen3", "tiny-qwen3-moe"])
def test_preset_checkpoint_loads_in_transformers_with_equal_logits(tmp_path: Path, name: str) -> None:
    transformers = pytest.importorskip("transformers")
    path = write_preset(name, tmp_path / name, seed=3)
    mine = ReferenceModel(load_hf_weights(path))
    assert mine.dims.model_type == preset_config(name)["model_type"] and mine.dims.head_dim == 64
    hf = transformers.AutoModelForCausalLM.from_pretrained(path).eval()
    ids = torch.randint(0, 512, (24,), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = hf(ids[None]).logits[0]
    assert ref.abs().max() > 1.0
    assert (mine.forward(ids, KVCache(mine.dims)) - ref).abs().max().item() <= 1e-4


def test_dense_equivalent_has_the_active_width_and_moe_vs_dense_reports() -> None:
    cfg = preset_config("tiny-qwen3-moe")
    dense = dims_from_hf_config(dense_equivalent(cfg))
    assert (dense.model_type, dense.intermediate_size, dense.sparse_layers, dense.head_dim) == ("qwen3", 512, (), 64)
    res = moe_vs_dense(cfg, tokens=32, repeats=1)
    assert set(res["mlp_us_per_token"]) == {"moe", "dense"} and res["dense_intermediate"] == 512
    assert res["mlp_ratio"] > 0 and res["model_ratio"] > 0
    with pytest.raises(ValueError, match="sparse layers"):
        moe_vs_dense(dense_equivalent(cfg), tokens=8)


def test_bench_cp_rejects_an_unknown_model() -> None:
    out = subprocess.run(
        [str(Path(sys.executable).parent / "vertumnus"), "bench", "cp", "--model", "no-such-model"],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "neither a preset (tiny-qwen3, tiny-qwen3-moe)" in out.stdout + out.stderr
