"""Decode of the embedded default: the reference model continuing from a prefill worker's exported KV.

One :class:`DecodeEngine` holds many sequences; each owns a :class:`~vertumnus.cp.model.KVCache` built from the
full prompt KV the prefill worker exported (``PrefillOutput.kv``, ``[layers, 2, Hkv, T, D]``) and a
:class:`~vertumnus.serving.sampling.Sampler`. The first token is sampled from the prefill's last-position logits
(so TTFT = queue + prefill + KV hand-off + one sampling), every later one costs one single-token forward.

Stopping: after emitting an id in ``eos_ids`` (finish "stop") or ``max_tokens`` ids (finish "length"); the
emitted stop id is part of the output (it decodes to no text).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from vertumnus.config import ModelConfig
from vertumnus.cp.model import KVCache, ReferenceModel
from vertumnus.serving.sampling import Sampler, SamplingParams, TokenLogprob, token_logprob


@dataclass(slots=True)
class PrefillOutput:
    """What a prefill worker hands to decode: the prompt's full KV and its last-position logits."""

    kv: torch.Tensor  # [layers, 2, Hkv, T, D]
    logits: torch.Tensor  # [V] float32

    @property
    def num_tokens(self) -> int:
        return int(self.kv.shape[3])


@dataclass(slots=True)
class KVHandle:
    """A prefill's output as it travels through Ray: the KV stays in the object store (``kv_ref``, put there
    by the prefill rank); only the logits ride along inline."""

    kv_ref: Any  # ray.ObjectRef of the [layers, 2, Hkv, T, D] tensor
    logits: torch.Tensor


@dataclass(slots=True)
class _Sequence:
    cache: KVCache
    sampler: Sampler
    eos_ids: frozenset[int]
    max_tokens: int
    next_logits: torch.Tensor
    emitted: int = 0


class DecodeEngine:
    """Sequences being decoded on one device (one process, one thread)."""

    def __init__(self, model_cfg: ModelConfig, device: str = "cpu") -> None:
        self.model = ReferenceModel.from_config(model_cfg, device)
        self._seqs: dict[str, _Sequence] = {}

    @property
    def active(self) -> int:
        """Sequences holding decode KV right now."""
        return len(self._seqs)

    def open(self, request_id: str, out: PrefillOutput, params: SamplingParams, eos_ids: frozenset[int]) -> None:
        """Adopt a prefill's KV for ``request_id`` (ValueError when the KV does not fit the model)."""
        dims = self.model.dims
        kv = out.kv.to(self.model.device, dims.torch_dtype)
        if kv.dim() != 5 or kv.shape[0] != dims.num_layers or kv.shape[2] != dims.num_kv_heads:
            raise ValueError(f"hand-off KV of shape {tuple(kv.shape)} does not fit the decode model")
        cache = KVCache.from_tensor(kv, dims)
        self._seqs[request_id] = _Sequence(cache, Sampler(params), eos_ids, params.max_tokens, out.logits)

    def step(self, request_id: str) -> tuple[int, str | None, TokenLogprob | None]:
        """Emit the next token of ``request_id``: (id, finish reason or None, its logprob when the request asked
        for them). The sequence is closed once it finished."""
        seq = self._seqs[request_id]
        tok = seq.sampler.sample(seq.next_logits)
        k = seq.sampler.params.logprobs
        lp = None if k is None else token_logprob(seq.next_logits, tok, k)
        seq.emitted += 1
        reason = "stop" if tok in seq.eos_ids else ("length" if seq.emitted >= seq.max_tokens else None)
        if reason is not None:
            self.close(request_id)
        else:
            with torch.inference_mode():
                seq.next_logits = self.model.forward([tok], seq.cache, last_only=True)[0]
        return tok, reason, lp

    def close(self, request_id: str) -> None:
        """Free a sequence's KV (idempotent)."""
        self._seqs.pop(request_id, None)
