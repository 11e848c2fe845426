"""Per-token log-probabilities in the OpenAI response shapes (``logprobs`` of completions and chat).

Values are the model's raw distribution (log-softmax of the logits, before temperature / top-p), as vLLM reports
them by default. Each token's alternatives hold the k most likely ids plus the sampled token itself (so up to
k + 1 entries, as vLLM does). A token's text is its own decoding (a lone byte of a multi-byte UTF-8 character
shows as U+FFFD), or ``token_id:N`` with ``return_tokens_as_token_ids`` (vLLM's extension).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from vertumnus.serving.sampling import TokenLogprob


class LogprobFormatter:
    """Formats one request's logprobs chunk by chunk (keeps the completions ``text_offset`` running)."""

    def __init__(self, token_text: Callable[[int], str], start_offset: int = 0) -> None:
        self.token_text = token_text
        self.offset = start_offset

    def _alternatives(self, tok: int, lp: TokenLogprob) -> list[tuple[int, float]]:
        alts = list(lp.top)
        if all(i != tok for i, _ in alts):
            alts.append((tok, lp.logprob))
        return alts

    def completion(self, ids: Sequence[int], lps: Sequence[TokenLogprob]) -> dict[str, Any]:
        """``{"tokens", "token_logprobs", "top_logprobs", "text_offset"}`` for these tokens."""
        tokens, offsets = [], []
        for i in ids:
            t = self.token_text(i)
            tokens.append(t)
            offsets.append(self.offset)
            self.offset += len(t)
        return {
            "tokens": tokens,
            "token_logprobs": [lp.logprob for lp in lps],
            "top_logprobs": [
                {self.token_text(a): v for a, v in self._alternatives(i, lp)} for i, lp in zip(ids, lps, strict=True)
            ],
            "text_offset": offsets,
        }

    def chat(self, ids: Sequence[int], lps: Sequence[TokenLogprob], k: int) -> dict[str, Any]:
        """``{"content": [{"token", "logprob", "bytes", "top_logprobs": [...k]}]}`` for these tokens."""

        def entry(i: int, v: float) -> dict[str, Any]:
            t = self.token_text(i)
            return {"token": t, "logprob": v, "bytes": list(t.encode())}

        return {
            "content": [
                {**entry(i, lp.logprob), "top_logprobs": [entry(a, v) for a, v in lp.top[:k]]}
                for i, lp in zip(ids, lps, strict=True)
            ]
        }
