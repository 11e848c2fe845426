"""One generation request's decode stream as the OpenAI handlers consume it: text deltas with stop strings, the
request's admission slot, and cancellation when a non-streaming client disconnects."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from fastapi import Request

from vertumnus.serving.runtime import ServingRuntime, Submission
from vertumnus.serving.sampling import SamplingParams, TokenLogprob
from vertumnus.serving.tokenizer import TextStream


class Generation:
    """One request's decode stream turned into text deltas, with stop strings. Owns the request's admission
    slot: :meth:`close` gives it back exactly once — after the stream ended, or (streaming responses) as the
    response's background task, which also covers a client that left before the stream started."""

    def __init__(
        self,
        rt: ServingRuntime,
        sub: Submission,
        params: SamplingParams,
        eos: frozenset[int],
        text: TextStream,
        live: set[str],
    ) -> None:
        self.rt, self.sub, self.params, self.eos, self.text = rt, sub, params, eos, text
        self._live = live  # the handlers' in-flight ids: this one leaves it on close
        self.token_ids: list[int] = []
        self.logprobs: list[TokenLogprob] = []  # one per token id when the request asked for logprobs
        self.finish_reason: str | None = None
        self._started = False
        self._closed = False

    async def deltas(self) -> AsyncIterator[tuple[str, list[int], list[TokenLogprob]]]:
        """(text delta, new token ids, their logprobs if asked for) triples; sets ``finish_reason`` before the
        iteration ends."""
        self._started = True
        stream = self.rt.stream(self.sub, self.params, self.eos)
        try:
            async for chunk in stream:
                self.token_ids.extend(chunk.token_ids)
                lps = chunk.logprobs or []
                self.logprobs.extend(lps)
                delta = self.text.feed(chunk.token_ids)
                if self.text.stopped:
                    self.finish_reason = "stop"
                    self.rt.finish_early(self.sub, "stop")
                    yield delta, chunk.token_ids, lps
                    return
                if chunk.finish_reason is not None:
                    self.finish_reason = chunk.finish_reason
                    delta += self.text.flush()
                yield delta, chunk.token_ids, lps
        finally:
            await stream.aclose()
            self.close()

    def close(self) -> None:
        """Release the admission slot (idempotent); a stream that never started counts as cancelled."""
        if self._closed:
            return
        self._closed = True
        self._live.discard(self.sub.timeline.request_id)
        if not self._started:
            self.rt.cancel_unstarted(self.sub)
        self.rt.admission.release()

    async def collect(self) -> tuple[str, list[int], str | None]:
        async for _ in self.deltas():
            pass
        return self.text.text, self.token_ids, self.finish_reason


async def collect_unless_disconnected(raw: Request, gen: Generation) -> tuple[str, list[int], str | None] | None:
    """``gen.collect()``, cancelled (and None returned) as soon as the client disconnects.

    The body has been read, so the next ASGI ``receive`` only returns when the client goes away
    (``http.disconnect``); racing it against the generation costs one waiting task, no polling."""

    async def disconnected() -> None:
        while (await raw.receive())["type"] != "http.disconnect":
            pass

    work = asyncio.ensure_future(gen.collect())
    watch = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait((work, watch), return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
    if work.done():
        return work.result()
    work.cancel()  # closes the decode stream: outcome "cancelled", decode aborted
    with contextlib.suppress(asyncio.CancelledError):
        await work
    gen.close()
    return None
