"""Rank-process body of the multi-process Qwen3 / Qwen3-MoE CP test (imported by the child processes).

World of 4 gloo ranks; groups {0,1,2,3}, {0,1}, {2,3}. Every rank loads each checkpoint directory it is given
(weights replicated per rank) and runs every case at C = 4, 2 and 1, with the cached prefix gathered from the
ranks' own blocks, then sends what it computed back.
"""

from __future__ import annotations

from typing import Any

import torch
from cp_mp_cases import finish, gloo_comms, send

from vertumnus.cp.attention import chunk_attention
from vertumnus.cp.block_index import BlockIndex
from vertumnus.cp.cp_forward import cp_prefill, gather_prefix
from vertumnus.cp.model import ReferenceModel
from vertumnus.cp.weights import load_hf_weights

BLOCK = 8
VOCAB = 256
# (total tokens, cached prefix blocks): uncached R = 45, 29, 3 (R < 2C at C = 4), 9 — none a multiple of 2C
CASES = [(45, 0), (45, 2), (19, 2), (9, 0)]


def case_tokens(i: int) -> torch.Tensor:
    total, _ = CASES[i]
    return torch.randint(0, VOCAB, (total,), generator=torch.Generator().manual_seed(200 + i))


def run_rank(rank: int, port: int, paths: list[str], out_q: Any, done: Any) -> None:
    comms = gloo_comms(rank, port)
    attend = chunk_attention("flash_lse", "cpu")
    for m, path in enumerate(paths):
        model = ReferenceModel(load_hf_weights(path))
        d = model.dims
        like = torch.empty(d.num_layers, 2, d.num_kv_heads, BLOCK, d.head_dim)
        for i, (_total, pblocks) in enumerate(CASES):
            ids = case_tokens(i)
            p = pblocks * BLOCK
            prefix_kv = model.prefill(ids[:p])[1].tensor() if p else None
            keys = list(range(1, pblocks + 1))
            for c, comm in comms.items():
                index = BlockIndex(c, 64)
                index.add_path(keys, 0)
                blocks = {
                    k: prefix_kv[:, :, :, b * BLOCK : (b + 1) * BLOCK].clone()  # type: ignore[index]
                    for b, k in enumerate(keys)
                    if index.owner(k) == comm.rank
                }
                prefix = gather_prefix(comm, index, blocks, keys, like)
                out = cp_prefill(model, comm, ids[p:], prefix, attend)
                send(out_q, (m, i, c, rank // c), out, comm)
    finish(out_q, rank, done)
