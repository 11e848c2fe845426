"""Per-GPU KV capacity from a model's KV size and the GPU memory its weights leave (the cache ablation's sizes).

    blocks per GPU = ⌊(gpu_gb · utilisation − weights_gb) · 10⁹ ÷ bytes_per_block⌋

``bytes_per_block`` = ``cache.block_tokens`` × layers × 2 (K and V) × KV heads × head_dim × bytes per element:
for Qwen3-30B-A3B in bf16 (48 layers, 4 KV heads of 128) 512 × 98,304 B = 50.3 MB, the config's default. CP
replicates the weights on every rank and spreads the KV over the ranks, so a degree-C worker holds C times the
per-GPU figure. Activations and the CUDA graphs pool come out of ``utilisation`` (vLLM's gpu_memory_utilization).
"""

from __future__ import annotations

import math


def kv_blocks_per_gpu(gpu_gb: float, weights_gb: float, bytes_per_block: int, utilisation: float = 0.9) -> int:
    """Cache blocks one GPU holds (ValueError when the weights leave no room for one block)."""
    if not 0 < utilisation <= 1:
        raise ValueError(f"utilisation must be in (0, 1], got {utilisation}")
    if bytes_per_block <= 0:
        raise ValueError(f"bytes_per_block must be > 0, got {bytes_per_block}")
    left = gpu_gb * utilisation - weights_gb
    blocks = math.floor(left * 1e9 / bytes_per_block) if left > 0 else 0
    if blocks < 1:
        raise ValueError(
            f"a {gpu_gb:g} GB GPU at utilisation {utilisation:g} leaves {left:.1f} GB after {weights_gb:g} GB of "
            "weights: no room for one KV block"
        )
    return blocks
