"""Single-process reference answers for the serving tests (same model config, same tokenizer, same sampler)."""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import torch

from vertumnus.config import ModelConfig
from vertumnus.cp.model import ReferenceModel
from vertumnus.serving.sampling import Sampler, SamplingParams
from vertumnus.serving.tokenizer import ByteTokenizer


@lru_cache(maxsize=2)
def model(cfg_json: str) -> ReferenceModel:
    return ReferenceModel.from_config(ModelConfig.model_validate_json(cfg_json))


def generate(
    cfg: ModelConfig, ids: Sequence[int], max_tokens: int, stop_ids: Sequence[int], params: SamplingParams | None = None
) -> list[int]:
    """Tokens the server must produce for ``ids``: greedy by default, else ``params`` (seeded sampling)."""
    m = model(cfg.model_dump_json())
    sampler = Sampler(params or SamplingParams(max_tokens=max_tokens, temperature=0.0))
    with torch.inference_mode():
        logits, cache = m.prefill(list(ids))
        out: list[int] = []
        for _ in range(max_tokens):
            tok = sampler.sample(logits)
            out.append(tok)
            if tok in stop_ids:
                break
            logits = m.forward([tok], cache, last_only=True)[0]
    return out


def tokenizer(cfg: ModelConfig) -> ByteTokenizer:
    return ByteTokenizer(cfg.vocab_size)
