"""Chunk attention kernels equal the reference causal attention (explicit mask, expanded KV heads)."""

from __future__ import annotations

import pytest
import torch

from vertumnus.cp.attention import chunk_attention, reference_attention, resolve_impl

IMPLS = ["mask", "flash_lse", "causal_lr"]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(("heads", "kv_heads"), [(4, 4), (4, 2), (8, 1)])
@pytest.mark.parametrize(("s", "ctx"), [(1, 0), (5, 0), (7, 3), (16, 40)])
def test_chunk_kernel_matches_reference(impl: str, heads: int, kv_heads: int, s: int, ctx: int) -> None:
    g = torch.Generator().manual_seed(s * 100 + ctx)
    q = torch.randn(heads, s, 16, generator=g)
    k = torch.randn(kv_heads, ctx + s, 16, generator=g)
    v = torch.randn(kv_heads, ctx + s, 16, generator=g)
    out = chunk_attention(impl, "cpu")(q, k, v)
    assert out.shape == (heads, s, 16)
    assert (out - reference_attention(q, k, v)).abs().max().item() <= 1e-5


def test_reference_sees_only_the_past() -> None:
    # Changing a future key/value must not change earlier outputs.
    g = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(2, 6, 8, generator=g), torch.randn(2, 6, 8, generator=g), torch.randn(2, 6, 8, generator=g)
    base = reference_attention(q, k, v)
    k2, v2 = k.clone(), v.clone()
    k2[:, 5] += 3.0
    v2[:, 5] -= 3.0
    changed = reference_attention(q, k2, v2)
    assert torch.equal(base[:, :5], changed[:, :5]) and not torch.equal(base[:, 5], changed[:, 5])


def test_impl_resolution() -> None:
    assert resolve_impl("auto", "cpu") == "flash_lse"
    assert resolve_impl("auto", "cuda") == "causal_lr"
    with pytest.raises(ValueError, match="unknown attention"):
        resolve_impl("nope", "cpu")
    with pytest.raises(ValueError, match="flash_lse"):
        resolve_impl("flash_lse", "cuda")
