"""Sparse mixture-of-experts MLP (Qwen3-MoE): router, top-k of E experts, SwiGLU experts, tokens grouped by expert.

Per token t with hidden state x_t::

    p_t = softmax(router · x_t)              over the E experts (float32)
    (w, e) = top_k(p_t)                      renormalised to sum 1 when norm_topk_prob
    y_t = Σ_j w_j · down_e_j(silu(gate_e_j x_t) ⊙ up_e_j x_t)

The forward sorts the T·k (token, expert) assignments by expert (a stable argsort), gathers the tokens once,
runs each expert's SwiGLU on its contiguous segment (one matmul triple per expert that received tokens; a loop
over experts, never over tokens) and scatters the weighted results back with ``index_add_``. Every CP rank holds
all experts and runs only its own tokens (no expert parallelism).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(slots=True)
class MoEWeights:
    """Experts of one sparse layer, stacked: HF ``[out_features, in_features]`` per expert."""

    router: torch.Tensor  # [E, hidden]
    w_gate: torch.Tensor  # [E, F, hidden]
    w_up: torch.Tensor  # [E, F, hidden]
    w_down: torch.Tensor  # [E, hidden, F]

    @property
    def num_experts(self) -> int:
        return int(self.router.shape[0])

    def to(self, device: torch.device | str, dtype: torch.dtype | None = None) -> MoEWeights:
        """A copy on ``device`` (and ``dtype``)."""

        def mv(t: torch.Tensor) -> torch.Tensor:
            return t.to(device=device, dtype=dtype) if dtype is not None else t.to(device)

        return MoEWeights(mv(self.router), mv(self.w_gate), mv(self.w_up), mv(self.w_down))


def route(x: torch.Tensor, router: torch.Tensor, top_k: int, norm_topk_prob: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Routing weights [T, k] (dtype of ``x``) and expert ids [T, k] of hidden states ``x`` [T, hidden]."""
    probs = torch.softmax(F.linear(x, router).float(), dim=-1)
    weights, experts = torch.topk(probs, top_k, dim=-1)
    if norm_topk_prob:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights.to(x.dtype), experts


def moe_forward(x: torch.Tensor, w: MoEWeights, top_k: int, norm_topk_prob: bool) -> torch.Tensor:
    """The sparse MLP's output [T, hidden] of ``x`` [T, hidden] (see module docstring)."""
    weights, experts = route(x, w.router, top_k, norm_topk_prob)
    flat = experts.reshape(-1)  # [T·k]: assignment a = t·k + j
    order = torch.argsort(flat, stable=True)  # assignments grouped by expert
    token_of = order // top_k
    counts = torch.bincount(flat, minlength=w.num_experts).tolist()  # one host sync per layer
    xs = x.index_select(0, token_of)  # [T·k, hidden], expert-contiguous
    ys = torch.empty_like(xs)
    start = 0
    for e, n in enumerate(counts):  # loop over experts; each segment is one batched SwiGLU
        if n == 0:
            continue
        seg = xs[start : start + n]
        ys[start : start + n] = F.linear(F.silu(F.linear(seg, w.w_gate[e])) * F.linear(seg, w.w_up[e]), w.w_down[e])
        start += n
    ys = ys * weights.reshape(-1).index_select(0, order)[:, None]
    return torch.zeros_like(x).index_add_(0, token_of, ys)


def dense_swiglu(x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor) -> torch.Tensor:
    """The dense SwiGLU MLP ``down(silu(gate x) ⊙ up x)``."""
    return F.linear(F.silu(F.linear(x, w_gate)) * F.linear(x, w_up), w_down)
