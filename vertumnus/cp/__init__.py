"""Zigzag context-parallel prefill data plane in PyTorch (DESIGN.md §4).

- :mod:`~vertumnus.cp.zigzag`: partition / restore of the uncached tokens over C ranks;
- :mod:`~vertumnus.cp.model` / :mod:`~vertumnus.cp.weights`: Llama-style reference model (single-process forward
  with a KV cache, prefill + decode; Llama, Qwen3, Qwen3-MoE) and its weights (seeded random or a local
  safetensors directory);
- :mod:`~vertumnus.cp.moe`: the Qwen3-MoE sparse MLP (router, top-k, tokens grouped by expert);
- :mod:`~vertumnus.cp.attention`: reference and per-chunk attention kernels;
- :mod:`~vertumnus.cp.cp_forward`: one rank's CP forward and the prefix-block gather;
- :mod:`~vertumnus.cp.block_index`: a worker's replicated block index (owners, LRU, capacity, split / merge);
- :mod:`~vertumnus.cp.comm`: the worker group's collectives.
"""
