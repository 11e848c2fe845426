"""Llama-style reference model (RMSNorm, RoPE, GQA, SwiGLU) and its single-process forward with a KV cache.

The same forward runs Qwen3 (per-head q/k RMSNorm before RoPE, explicit head_dim, tied embeddings) and Qwen3-MoE
(sparse layers' MLP is :func:`vertumnus.cp.moe.moe_forward`), selected by the weights (:class:`ModelDims`).

The CP forward (:mod:`vertumnus.cp.cp_forward`) and this reference share the token-local pieces
(:meth:`ReferenceModel.qkv`, :meth:`ReferenceModel.finish_layer`, :meth:`ReferenceModel.logits`); only attention
differs, so the CP correctness tests compare exactly the distributed part.

Decode pools use it single-process::

    model = ReferenceModel.from_config(ModelConfig())            # random weights from cfg.seed, or cfg.path
    logits, cache = model.prefill(prompt_ids)                     # last-token logits [V], KVCache
    # or continue from a CP prefill's KV (TorchDataPlane.take_output(request_id)):
    cache = KVCache.from_tensor(out.kv, model.dims); logits = out.logits
    new_ids = model.decode(cache, logits, max_new_tokens=16)      # greedy; temperature>0 samples

KV layout everywhere: per layer K and V as ``[Hkv, T, D]``; a whole sequence as ``[layers, 2, Hkv, T, D]``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from vertumnus.cp.attention import reference_attention
from vertumnus.cp.moe import dense_swiglu, moe_forward
from vertumnus.cp.weights import LlamaWeights, ModelDims, load_weights

if TYPE_CHECKING:
    from vertumnus.config import ModelConfig


class KVCache:
    """Growable per-layer K/V buffers of one sequence (amortised doubling; decode appends one token)."""

    def __init__(self, dims: ModelDims, device: torch.device | str = "cpu", capacity: int = 256) -> None:
        self.dims = dims
        self.length = 0
        shape = (dims.num_layers, 2, dims.num_kv_heads, max(capacity, 1), dims.head_dim)
        self._buf = torch.empty(shape, dtype=dims.torch_dtype, device=device)

    @staticmethod
    def from_tensor(kv: torch.Tensor, dims: ModelDims) -> KVCache:
        """A cache holding ``kv`` ([layers, 2, Hkv, T, D], e.g. a CP prefill's KV)."""
        assert kv.shape[0] == dims.num_layers and kv.shape[2] == dims.num_kv_heads
        cache = KVCache(dims, kv.device, capacity=kv.shape[3] + 64)
        cache._buf[:, :, :, : kv.shape[3]] = kv
        cache.length = kv.shape[3]
        return cache

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write ``k``/``v`` ([Hkv, n, D]) after the current length of ``layer``; return that layer's full K, V.

        The length advances in :meth:`advance` once every layer appended (all layers hold the same tokens).
        """
        n = k.shape[1]
        need = self.length + n
        if need > self._buf.shape[3]:
            grown = torch.empty(
                (*self._buf.shape[:3], max(need, 2 * self._buf.shape[3]), self._buf.shape[4]),
                dtype=self._buf.dtype,
                device=self._buf.device,
            )
            grown[:, :, :, : self.length] = self._buf[:, :, :, : self.length]
            self._buf = grown
        self._buf[layer, 0, :, self.length : need] = k
        self._buf[layer, 1, :, self.length : need] = v
        return self._buf[layer, 0, :, :need], self._buf[layer, 1, :, :need]

    def advance(self, n: int) -> None:
        self.length += n

    def tensor(self) -> torch.Tensor:
        """All cached KV as [layers, 2, Hkv, T, D] (a view)."""
        return self._buf[:, :, :, : self.length]


class ReferenceModel:
    """Forward of the Llama-style model on one device; all methods are pure functions of the weights."""

    def __init__(self, weights: LlamaWeights, device: torch.device | str = "cpu") -> None:
        self.device = torch.device(device)
        self.w = weights.to(self.device)
        self.dims = weights.dims
        d = self.dims.head_dim
        self._inv_freq = 1.0 / (
            self.dims.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float32, device=self.device) / d)
        )

    @staticmethod
    def from_config(cfg: ModelConfig, device: torch.device | str = "cpu") -> ReferenceModel:
        return ReferenceModel(load_weights(cfg), device)

    # -- token-local pieces (shared with the CP forward) --------------------------------------------------

    def rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin tables [T, D] for absolute ``positions`` (HF rotate-half convention)."""
        ang = positions.to(self.device, torch.float32)[:, None] * self._inv_freq[None, :]
        emb = torch.cat([ang, ang], dim=-1)
        dt = self.dims.torch_dtype
        return emb.cos().to(dt), emb.sin().to(dt)

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(token_ids.to(self.device), self.w.embed)

    def _rms(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.dims.rms_eps)
        return weight * xf.to(x.dtype)

    @staticmethod
    def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * cos + rotated * sin

    def qkv(
        self, layer: int, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Q [H, T, D], K, V [Hkv, T, D] of hidden states ``x`` [T, hidden], RoPE applied at their positions."""
        lw = self.w.layers[layer]
        dm = self.dims
        t = x.shape[0]
        xn = self._rms(x, lw.attn_norm)
        q = F.linear(xn, lw.wq, lw.bq).view(t, dm.num_heads, dm.head_dim)
        k = F.linear(xn, lw.wk, lw.bk).view(t, dm.num_kv_heads, dm.head_dim)
        v = F.linear(xn, lw.wv, lw.bv).view(t, dm.num_kv_heads, dm.head_dim).transpose(0, 1)
        if lw.q_norm is not None and lw.k_norm is not None:  # Qwen3: per head over head_dim, before RoPE
            q, k = self._rms(q, lw.q_norm), self._rms(k, lw.k_norm)
        q, k = q.transpose(0, 1), k.transpose(0, 1)
        return self._rotate(q, cos, sin).contiguous(), self._rotate(k, cos, sin).contiguous(), v.contiguous()

    def finish_layer(self, layer: int, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """Residual stream after attention output ``attn`` [H, T, D] and the MLP (SwiGLU, or MoE on sparse layers).

        Token-local: a CP rank runs it on its own tokens only (MoE routing included).
        """
        lw = self.w.layers[layer]
        t = x.shape[0]
        x = x + F.linear(attn.transpose(0, 1).reshape(t, -1), lw.wo, lw.bo)
        xn = self._rms(x, lw.mlp_norm)
        if lw.moe is not None:
            return x + moe_forward(xn, lw.moe, self.dims.top_k, self.dims.norm_topk_prob)
        assert lw.w_gate is not None and lw.w_up is not None and lw.w_down is not None
        return x + dense_swiglu(xn, lw.w_gate, lw.w_up, lw.w_down)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """Logits (float32) of final hidden states ``x`` [T, hidden]."""
        return F.linear(self._rms(x, self.w.norm), self.w.lm_head).float()

    # -- single-process forward ---------------------------------------------------------------------------

    def forward(self, token_ids: torch.Tensor | Sequence[int], cache: KVCache, last_only: bool = False) -> torch.Tensor:
        """Run ``token_ids`` after the ``cache.length`` tokens already in ``cache`` (appending their KV).

        Returns logits [T, V] (or [1, V] with ``last_only``).
        """
        ids = torch.as_tensor(token_ids, dtype=torch.long, device=self.device)
        start = cache.length
        cos, sin = self.rope(torch.arange(start, start + ids.numel(), device=self.device))
        x = self.embed(ids)
        for i in range(self.dims.num_layers):
            q, k, v = self.qkv(i, x, cos, sin)
            k_all, v_all = cache.append(i, k, v)
            x = self.finish_layer(i, x, reference_attention(q, k_all, v_all))
        cache.advance(ids.numel())
        return self.logits(x[-1:] if last_only else x)

    def prefill(
        self, token_ids: torch.Tensor | Sequence[int], cache: KVCache | None = None
    ) -> tuple[torch.Tensor, KVCache]:
        """Last-token logits [V] and the KV cache of a prompt (continuing ``cache`` when given)."""
        ids = torch.as_tensor(token_ids, dtype=torch.long)
        if ids.numel() == 0:
            raise ValueError("prefill needs at least one token")
        cache = cache or KVCache(self.dims, self.device, capacity=ids.numel() + 64)
        return self.forward(ids, cache, last_only=True)[0], cache

    def decode(
        self,
        cache: KVCache,
        logits: torch.Tensor,
        max_new_tokens: int,
        *,
        temperature: float = 0.0,
        seed: int = 0,
        stop_ids: Sequence[int] = (),
    ) -> list[int]:
        """Generate up to ``max_new_tokens`` tokens after a prefill (``logits``: its last-token logits).

        Greedy at ``temperature`` 0, else sampling from softmax(logits / temperature) with a seeded generator.
        Stops after emitting a token in ``stop_ids``. ``cache`` is extended in place.
        """
        gen = torch.Generator(device="cpu").manual_seed(seed)
        out: list[int] = []
        stops = set(stop_ids)
        cur = logits.float().cpu()
        for _ in range(max_new_tokens):  # one token per step: inherent to autoregressive decode
            if temperature <= 0:
                tok = int(torch.argmax(cur))
            else:
                tok = int(torch.multinomial(torch.softmax(cur / temperature, dim=-1), 1, generator=gen))
            out.append(tok)
            if tok in stops or len(out) == max_new_tokens:
                break
            cur = self.forward([tok], cache, last_only=True)[0].cpu()
        return out

    def generate(self, token_ids: Sequence[int], max_new_tokens: int, **kw: object) -> list[int]:
        """Prefill then decode (see :meth:`decode` for keyword arguments)."""
        logits, cache = self.prefill(token_ids)
        return self.decode(cache, logits, max_new_tokens, **kw)  # type: ignore[arg-type]
