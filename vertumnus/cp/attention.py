"""Attention kernels: the reference (single process) and the per-chunk kernel of the zigzag CP forward.

A CP rank attends each of its two query chunks separately. For a chunk of ``s`` queries the visible keys are
``k[:, :ctx]`` (the cached prefix plus every uncached token before the chunk: fully visible) followed by the
chunk's own ``s`` keys (causal). That is bottom-right-aligned causal attention over ``ctx + s`` keys::

    keys →      ctx (all visible)      │ diagonal (s)
    query 0   ■ ■ ■ ■ ■ ■ ■ ■ ■ ■ ■ ■ │ ■ · · ·
    query 1   ■ ■ ■ ■ ■ ■ ■ ■ ■ ■ ■ ■ │ ■ ■ · ·
    ...                                │
    query s−1 ■ ■ ■ ■ ■ ■ ■ ■ ■ ■ ■ ■ │ ■ ■ ■ ■

Three implementations of :data:`ChunkAttention`, picked once at construction (:func:`chunk_attention`):

- ``mask``: one ``F.scaled_dot_product_attention`` call with an explicit boolean mask (portable reference form;
  the kernel still computes the masked upper triangle).
- ``flash_lse`` (CPU default): two calls of the CPU flash kernel that also return the log-sum-exp — the context
  block without a mask, the diagonal block with ``is_causal`` — merged exactly by their LSEs. No masked work is
  computed, which matters for the CP speed-up (CPU SDPA does not skip fully masked tiles).
- ``causal_lr`` (CUDA default): SDPA with ``causal_lower_right`` (the fused kernels skip masked tiles).

GQA: query head h uses KV head h // G (HF layout). For the unmasked context block the G query heads of one KV
head are folded into the sequence axis (``[Hkv, G·s, D]``), so the long K and V are never copied per query
head; ``mask`` passes ``enable_gqa``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

# (q [H, s, D], k [Hkv, ctx + s, D], v [Hkv, ctx + s, D]) -> out [H, s, D]
ChunkAttention = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
AttnImpl = Literal["auto", "mask", "flash_lse", "causal_lr"]

_flash_cpu = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def bottom_right_mask(s: int, t: int, device: torch.device | None = None) -> torch.Tensor:
    """Boolean [s, t] mask, True where query i (the i-th of the last s positions) may see key j."""
    return torch.arange(t, device=device)[None, :] <= torch.arange(s, device=device)[:, None] + (t - s)


def reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal attention of the last ``T`` positions (q [H, T, D]) over all keys (k, v [Hkv, S, D], S ≥ T).

    The single-process reference: KV heads expanded to query heads, explicit mask, one SDPA call.
    """
    h, t, _ = q.shape
    g = h // k.shape[0]
    kx = k.repeat_interleave(g, dim=0)[None]
    vx = v.repeat_interleave(g, dim=0)[None]
    mask = None if t == 1 else bottom_right_mask(t, k.shape[1], q.device)
    return F.scaled_dot_product_attention(q[None], kx, vx, attn_mask=mask)[0]


def _fold(q: torch.Tensor, hkv: int) -> torch.Tensor:
    h, s, d = q.shape
    return q.reshape(hkv, (h // hkv) * s, d)


def attend_mask(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    mask = bottom_right_mask(q.shape[1], k.shape[1], q.device)  # [s, ctx + s], shared by all heads
    return F.scaled_dot_product_attention(q[None], k[None], v[None], attn_mask=mask, enable_gqa=True)[0]


def attend_flash_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    assert _flash_cpu is not None
    h, s, d = q.shape
    hkv, t, _ = k.shape
    g = h // hkv
    ctx = t - s
    # Diagonal block: square, so top-left causal == bottom-right causal. Expanding s keys per head is cheap.
    kd = k[:, ctx:].repeat_interleave(g, dim=0)[None]
    vd = v[:, ctx:].repeat_interleave(g, dim=0)[None]
    out_d, lse_d = _flash_cpu(q[None], kd, vd, 0.0, True)
    if ctx == 0:
        return out_d[0]
    # The flash kernel crashes on empty inputs; ctx > 0 and s > 0 here.
    out_c, lse_c = _flash_cpu(_fold(q, hkv)[None], k[None, :, :ctx], v[None, :, :ctx], 0.0, False)
    out_c = out_c[0].reshape(h, s, d)
    lse_c = lse_c[0].reshape(h, s, 1)
    lse_d = lse_d[0].reshape(h, s, 1)
    # softmax over the union of both key sets = LSE-weighted mix of the two partial softmaxes.
    m = torch.maximum(lse_c, lse_d)
    w_c = torch.exp(lse_c - m)
    w_d = torch.exp(lse_d - m)
    out = (out_c.float() * w_c + out_d[0].float() * w_d) / (w_c + w_d)
    return out.to(q.dtype)


def attend_causal_lr(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    h, s, _ = q.shape
    g = h // k.shape[0]
    kx = k.repeat_interleave(g, dim=0)[None]
    vx = v.repeat_interleave(g, dim=0)[None]
    return F.scaled_dot_product_attention(q[None], kx, vx, attn_mask=causal_lower_right(s, k.shape[1]))[0]


_IMPLS: dict[str, ChunkAttention] = {
    "mask": attend_mask,
    "flash_lse": attend_flash_lse,
    "causal_lr": attend_causal_lr,
}


def resolve_impl(impl: str, device: torch.device | str) -> str:
    """The concrete implementation name for ``impl`` on ``device`` (``auto``: flash_lse on CPU, causal_lr else)."""
    dev = torch.device(device)
    if impl == "auto":
        if dev.type == "cpu":
            return "flash_lse" if _flash_cpu is not None else "mask"
        return "causal_lr"
    if impl not in _IMPLS:
        raise ValueError(f"unknown attention implementation {impl!r}; expected one of auto, {', '.join(_IMPLS)}")
    if impl == "flash_lse" and (dev.type != "cpu" or _flash_cpu is None):
        raise ValueError("attention implementation 'flash_lse' needs the CPU flash kernel (device cpu)")
    return impl


def chunk_attention(impl: str, device: torch.device | str) -> ChunkAttention:
    """The chunk kernel for ``impl`` (see module docstring), chosen once."""
    return _IMPLS[resolve_impl(impl, device)]
