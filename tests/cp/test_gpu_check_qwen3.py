"""benchmarks/gpu_check.py's Qwen3-MoE parts on CPU, in process (cheap): the profile loop runs the small
Qwen3-MoE shape over a (R, P) grid with a cached prefix, and the Qwen3-30B-A3B shape it measures on a GPU has the
real model's dimensions."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import torch

from vertumnus.cp.qwen3 import QWEN3_30B_A3B, preset_config
from vertumnus.cp.weights import dims_from_hf_config


def test_profile_loop_runs_the_small_qwen3_moe_with_and_without_a_prefix(
    benchmark_script: Callable[[str], ModuleType],
) -> None:
    gc = benchmark_script("gpu_check")
    small = {"hidden_size": 64, "num_attention_heads": 4, "head_dim": 32, "num_experts": 8, "num_experts_per_tok": 2}
    dims = dims_from_hf_config({**preset_config("tiny-qwen3-moe"), **small})
    assert dims.sparse_layers == (0, 1) and dims.qk_norm
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # many tiny ops: threads only add sync waits on a shared box
    try:
        rows = gc.profile("cpu", dims, [64, 128], [0, 512], 1, 600.0)
    finally:
        torch.set_num_threads(threads)
    assert [(m.point.r, m.point.p) for m in rows] == [(64, 0), (128, 0), (64, 512), (128, 512)]
    assert all(m.point.degree == 1 and m.seconds > 0 for m in rows)


def test_qwen3_30b_a3b_shape() -> None:
    d = dims_from_hf_config(QWEN3_30B_A3B)
    assert (d.num_layers, d.hidden_size, d.num_heads, d.num_kv_heads, d.head_dim) == (48, 2048, 32, 4, 128)
    assert (d.num_experts, d.top_k, d.moe_intermediate_size, len(d.sparse_layers), d.dtype) == (
        128,
        8,
        768,
        48,
        "bfloat16",
    )
    per_layer = 2048 * 128 * (32 + 4 + 4) + 32 * 128 * 2048 + 128 * 3 * 768 * 2048 + 128 * 2048 + 2 * 128
    total = 48 * per_layer + 2 * 151936 * 2048
    assert 30.0e9 < total < 31.0e9  # "30B": the random weights are the real model's size
