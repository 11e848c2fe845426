"""The zigzag CP prefill forward of one rank (DESIGN.md §4).

Every rank of a degree-C worker calls :func:`cp_prefill` with the same uncached token ids and the same gathered
prefix KV. Per layer it

1. computes Q, K, V of its 2s zigzag tokens at their absolute positions P + relative (RoPE),
2. AllGathers K and V (one collective per layer) and restores them to sequence order,
3. attends each of its two query chunks to the prefix plus the causally visible uncached keys
   (:mod:`vertumnus.cp.attention`), and
4. finishes the layer (output projection, SwiGLU MLP) on its own tokens only.

The gathered K/V of every layer is kept: after the forward every rank holds the full KV of the uncached tokens
— what it stores into its own cache blocks and what the worker hands to the decode pool.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vertumnus.cp.attention import ChunkAttention
from vertumnus.cp.block_index import BlockIndex
from vertumnus.cp.comm import Comm
from vertumnus.cp.model import ReferenceModel
from vertumnus.cp.zigzag import ZigzagPlan


@dataclass(slots=True)
class CPPrefillOutput:
    logits: torch.Tensor | None  # last-token logits [V] (float32) on the rank holding the last token, else None
    new_kv: torch.Tensor  # [layers, 2, Hkv, n, D]: KV of the uncached tokens in sequence order (every rank)


@torch.inference_mode()
def cp_prefill(
    model: ReferenceModel, comm: Comm, token_ids: torch.Tensor, prefix_kv: torch.Tensor | None, attend: ChunkAttention
) -> CPPrefillOutput:
    """Zigzag CP forward of the uncached ``token_ids`` [n] after ``prefix_kv`` ([layers, 2, Hkv, P, D] or None).

    Collective: every rank of ``comm`` must call it with equal arguments (except nothing rank-specific).
    """
    n = int(token_ids.numel())
    plan = ZigzagPlan(n, comm.size)
    p = 0 if prefix_kv is None else int(prefix_kv.shape[3])
    s = plan.chunk
    dev = model.device
    local_pos = plan.local_positions(comm.rank)
    x = model.embed(plan.partition(token_ids.to(torch.long), comm.rank))
    cos, sin = model.rope(local_pos + p)
    restore = plan.restore_index().to(dev)
    chunk_ends = [p + (j + 1) * s for j in plan.chunks_of(comm.rank)]  # visible keys per local chunk
    layers_kv: list[torch.Tensor] = []
    for i in range(model.dims.num_layers):
        q, k, v = model.qkv(i, x, cos, sin)
        gathered = comm.all_gather(torch.stack([k, v])[None])  # [C, 2, Hkv, 2s, D]
        c, _, hkv, _, d = gathered.shape
        seq = gathered.permute(1, 2, 0, 3, 4).reshape(2, hkv, c * 2 * s, d).index_select(2, restore)
        layers_kv.append(seq)
        kv_all = seq if prefix_kv is None else torch.cat([prefix_kv[i].to(seq.dtype), seq], dim=2)
        out = torch.cat(
            [
                attend(q[:, a * s : (a + 1) * s], kv_all[0, :, :end], kv_all[1, :, :end])
                for a, end in enumerate(chunk_ends)
            ],
            dim=1,
        )
        x = model.finish_layer(i, x, out)
    owner, local_idx = plan.owner_of(n - 1)
    logits = model.logits(x[local_idx : local_idx + 1])[0] if owner == comm.rank else None
    new_kv = torch.stack(layers_kv)[:, :, :, :n]
    return CPPrefillOutput(logits, new_kv)


@torch.inference_mode()
def gather_prefix(
    comm: Comm, index: BlockIndex, blocks: dict[int, torch.Tensor], keys: list[int], like: torch.Tensor
) -> torch.Tensor | None:
    """The worker's cached blocks ``keys`` (a leading path) as [layers, 2, Hkv, len(keys)·B, D] on every rank.

    Each rank contributes the blocks it owns (``blocks``: its local tensors [layers, 2, Hkv, B, D]); one
    AllGather, padded to the largest per-rank count, then blocks are put back in path order. ``like`` is an
    empty tensor with the block shape, dtype and device (a rank may own none of the blocks).
    Collective; every rank passes the same ``keys`` and an identical ``index``.
    """
    if not keys:
        return None
    owners = [index.owner(k) for k in keys]
    slot: list[int] = []  # position of block b inside its owner's contribution
    counts = [0] * comm.size
    for o in owners:
        slot.append(counts[o])
        counts[o] += 1
    width = max(counts)
    local = like.new_zeros((width, *like.shape))
    mine = [blocks[k] for k, o in zip(keys, owners, strict=True) if o == comm.rank]
    if mine:
        local[: len(mine)] = torch.stack(mine)
    gathered = comm.all_gather(local)  # [C·width, layers, 2, Hkv, B, D]
    flat = torch.tensor([o * width + j for o, j in zip(owners, slot, strict=True)], device=gathered.device)
    picked = gathered.index_select(0, flat)  # [nb, layers, 2, Hkv, B, D]
    nb, nl, two, hkv, b, d = picked.shape
    return picked.permute(1, 2, 3, 0, 4, 5).reshape(nl, two, hkv, nb * b, d)
