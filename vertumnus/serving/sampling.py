"""Token sampling: greedy (temperature 0) or temperature + nucleus (top-p) with a per-request seeded generator.

A request's draws come from its own ``torch.Generator`` seeded with ``seed`` (random when absent), so the same
(prompt, parameters, seed) gives the same tokens whatever else the decode actor is serving.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field

import torch


@dataclass(slots=True, frozen=True)
class SamplingParams:
    """What the decode side needs to generate one request's tokens."""

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop_token_ids: frozenset[int] = field(default_factory=frozenset)
    logprobs: int | None = None  # report each sampled token's logprob and this many alternatives (None: off)

    @property
    def greedy(self) -> bool:
        return self.temperature <= 1e-5


@dataclass(slots=True, frozen=True)
class TokenLogprob:
    """A sampled token's log-probability under the model's raw distribution (before temperature / top-p, as
    vLLM reports by default) and the ``k`` most likely ids with theirs, most likely first."""

    logprob: float
    top: tuple[tuple[int, float], ...] = ()


def token_logprob(logits: torch.Tensor, token: int, k: int) -> TokenLogprob:
    """:class:`TokenLogprob` of ``token`` from a ``[vocab]`` logits vector."""
    lp = torch.log_softmax(logits.float().cpu(), dim=-1)
    top: tuple[tuple[int, float], ...] = ()
    if k > 0:
        vals, ids = torch.topk(lp, min(k, lp.numel()))
        top = tuple(zip(ids.tolist(), vals.tolist(), strict=True))
    return TokenLogprob(float(lp[token]), top)


class Sampler:
    """Samples one request's tokens from last-position logits."""

    __slots__ = ("_gen", "params")

    def __init__(self, params: SamplingParams) -> None:
        self.params = params
        self._gen: torch.Generator | None = None
        if not params.greedy:
            self._gen = torch.Generator(device="cpu")
            self._gen.manual_seed(params.seed if params.seed is not None else secrets.randbits(63))

    def sample(self, logits: torch.Tensor) -> int:
        """Next token id from a ``[vocab]`` logits vector."""
        logits = logits.float().cpu()
        if self._gen is None:
            return int(torch.argmax(logits).item())
        probs = torch.softmax(logits / self.params.temperature, dim=-1)
        if self.params.top_p < 1.0:
            sorted_p, order = torch.sort(probs, descending=True)
            cum = torch.cumsum(sorted_p, dim=-1)
            # keep the smallest prefix whose mass reaches top_p (always at least the most likely token)
            keep = (cum - sorted_p) < self.params.top_p
            sorted_p = torch.where(keep, sorted_p, torch.zeros_like(sorted_p))
            choice = torch.multinomial(sorted_p / sorted_p.sum(), 1, generator=self._gen)
            return int(order[choice].item())
        return int(torch.multinomial(probs, 1, generator=self._gen).item())
