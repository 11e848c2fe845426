"""Server-sent events of a streamed completion or chat completion: the chunk objects and the event stream.

A streamed response's first event goes out with the first token (for chat: the role and the first token's text
together), so a client's time-to-first-chunk is the server's TTFT, not the time to the headers.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

from vertumnus.serving.errors import APIError
from vertumnus.serving.generation import Generation
from vertumnus.serving.logprobs import LogprobFormatter
from vertumnus.serving.sampling import TokenLogprob

Tokens = tuple[list[int], list[TokenLogprob]]  # a chunk's token ids and their logprobs


class TextChunks:
    """The chunk objects of a streamed completion (``text_completion``)."""

    def __init__(self, rid: str, model: str, lp: LogprobFormatter | None = None) -> None:
        self.base = {"id": rid, "object": "text_completion", "created": int(time.time()), "model": model}
        self.lp = lp

    def delta(
        self, text: str, reason: str | None, ids: list[int] | None, first: bool = False, toks: Tokens | None = None
    ) -> dict[str, Any]:
        logprobs = self.lp.completion(*toks) if self.lp is not None and toks is not None else None
        choice: dict[str, Any] = {"index": 0, "text": text, "finish_reason": reason, "logprobs": logprobs}
        if ids is not None:
            choice["token_ids"] = ids
        return {**self.base, "choices": [choice]}


class ChatChunks:
    """The chunk objects of a streamed chat completion (``chat.completion.chunk``)."""

    def __init__(self, rid: str, model: str, lp: LogprobFormatter | None = None, k: int | None = None) -> None:
        self.base = {"id": rid, "object": "chat.completion.chunk", "created": int(time.time()), "model": model}
        self.lp, self.k = lp, k or 0

    def delta(
        self, text: str, reason: str | None, ids: list[int] | None, first: bool = False, toks: Tokens | None = None
    ) -> dict[str, Any]:
        # The first chunk carries the role with the first token's text (possibly "" while a UTF-8 character is
        # incomplete): it is sent when that token exists, never before the prefill.
        delta: dict[str, Any] = {"role": "assistant", "content": text} if first else {"content": text} if text else {}
        logprobs = self.lp.chat(*toks, self.k) if self.lp is not None and toks is not None else None
        choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": reason, "logprobs": logprobs}
        if ids is not None:
            choice["token_ids"] = ids
        return {**self.base, "choices": [choice]}


def _event(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


async def sse_events(
    gen: Generation, fmt: TextChunks | ChatChunks, include_usage: bool, with_ids: bool, echo: str = ""
) -> AsyncIterator[bytes]:
    """Server-sent events: chunks, the finishing chunk, optional usage, ``[DONE]``. The first event goes out
    with the first token (the echoed prompt, if any, in front of it). An error after the headers went out is
    sent as an error event (the status line is already 200)."""
    first = True
    with_lp = fmt.lp is not None
    try:
        async for delta, ids, lps in gen.deltas():
            toks = (ids, lps) if with_lp else None
            if first:
                yield _event(fmt.delta(echo + delta, None, ids if with_ids else None, first=True, toks=toks))
                first = False
            elif delta or with_ids or with_lp:
                yield _event(fmt.delta(delta, None, ids if with_ids else None, toks=toks))
        if first and echo:  # nothing was generated
            yield _event(fmt.delta(echo, None, None, first=True))
        yield _event(fmt.delta("", gen.finish_reason or "stop", None, first=first and not echo))
        if include_usage:
            p, c = gen.sub.timeline.prompt_tokens, len(gen.token_ids)
            yield _event(
                {
                    **fmt.base,
                    "choices": [],
                    "usage": {
                        "prompt_tokens": p,
                        "completion_tokens": c,
                        "total_tokens": p + c,
                        "prompt_tokens_details": {"cached_tokens": gen.sub.timeline.cached_tokens},
                    },
                }
            )
    except APIError as e:
        yield _event(e.body())
    yield b"data: [DONE]\n\n"
