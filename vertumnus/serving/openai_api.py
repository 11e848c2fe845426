"""``POST /v1/completions`` and ``POST /v1/chat/completions``: parse, tokenize, admit, place, decode, format.

The body is read and validated inside the handler (not by FastAPI's dependency layer) so that the request's
arrival instant precedes parsing (the router-overhead measurement starts at "HTTP in") and so that malformed
JSON (400) and schema violations (422) get OpenAI-style bodies from one place.

Behaviour a client can rely on:

- ``X-Request-Id`` (optional, ``[A-Za-z0-9._:-]{1,128}``) names the request: its id is ``cmpl-<X-Request-Id>``
  (``chatcmpl-…``), it is echoed in the response's ``X-Request-Id`` header and ``/v1/requests/{id}`` finds it; an
  id still in flight is a 400 (``duplicate_request_id``). Without it the server makes one up.
- A streamed response's first event is sent when the first token exists (for chat: the role and the first
  token's text together), so a client's time-to-first-chunk is the server's TTFT, not the time to the headers.
- A non-streamed request whose client disconnects is cancelled at once (prefill hand-off dropped, decode
  aborted, outcome ``cancelled``) instead of being decoded to the end for nobody.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ValidationError
from starlette.background import BackgroundTask

from vertumnus.serving.errors import APIError, check_model
from vertumnus.serving.logprobs import LogprobFormatter
from vertumnus.serving.runtime import ServingRuntime, Submission
from vertumnus.serving.sampling import SamplingParams, TokenLogprob
from vertumnus.serving.schemas import (
    AssistantMessage,
    ChatChoice,
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionChoice,
    CompletionRequest,
    CompletionResponse,
    Usage,
    _SamplingFields,
)
from vertumnus.serving.tokenizer import ChatTurn, TextStream, Tokenizer

B = TypeVar("B", bound=BaseModel)
S = TypeVar("S", bound=_SamplingFields)

_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")


async def parse_body(raw: Request, model: type[B]) -> B:
    """Validate the JSON body: 400 when it is not JSON, 422 (param = field path) when it breaks the schema."""
    data = await raw.body()
    try:
        return model.model_validate_json(data)
    except ValidationError as e:
        first = e.errors()[0]
        if first["type"] == "json_invalid":
            raise APIError(400, f"request body is not valid JSON: {first['msg']}", code="invalid_json") from None
        param = ".".join(str(p) for p in first["loc"]) or None
        msg = "field required" if first["type"] == "missing" else first["msg"]
        raise APIError(422, f"{param}: {msg}" if param else msg, param=param, code="invalid_value") from None


class OpenAIHandlers:
    """The two generation endpoints over one :class:`ServingRuntime`."""

    def __init__(self, runtime: ServingRuntime, tokenizer: Tokenizer) -> None:
        self.rt = runtime
        self.tok = tokenizer
        self.model_name = runtime.cfg.model.name
        self.default_max_tokens = runtime.cfg.serving.default_max_tokens
        self.max_model_len = runtime.cfg.pool.max_model_len
        self._live: set[str] = set()  # request ids in flight (X-Request-Id uniqueness)

    # -- endpoints ------------------------------------------------------------------------------------------
    async def completions(self, raw: Request) -> Any:
        arrival = self.rt.clock()
        body = await self._parse(raw, CompletionRequest)
        if isinstance(body.prompt, str):
            ids = self.tok.encode(body.prompt)
            echo = body.prompt
        else:
            ids = list(body.prompt)  # type: ignore[arg-type]
            try:
                self.tok.check_ids(ids)
            except ValueError as e:
                self.rt.metrics.requests.labels("invalid").inc()
                raise APIError(400, str(e), param="prompt", code="invalid_token_ids") from None
            echo = self.tok.decode(ids)
        if body.echo and body.logprobs is not None:
            self.rt.metrics.requests.labels("invalid").inc()
            raise APIError(
                400, "echo with logprobs (prompt logprobs) is not supported", param="echo",
                code="unsupported_parameter",
            )  # fmt: skip
        return await self._run(
            raw, body, ids, self.tok.eos_ids, "cmpl", arrival, chat=False, echo=echo if body.echo else ""
        )

    async def chat(self, raw: Request) -> Any:
        arrival = self.rt.clock()
        body = await self._parse(raw, ChatCompletionRequest)
        ids = self.tok.apply_chat_template([ChatTurn(m.role, m.text()) for m in body.messages])
        if body.max_completion_tokens is not None:
            body.max_tokens = body.max_completion_tokens
        return await self._run(raw, body, ids, self.tok.chat_end_ids, "chatcmpl", arrival, chat=True)

    # -- shared ---------------------------------------------------------------------------------------------
    async def _parse(self, raw: Request, model: type[S]) -> S:
        """Body + model name + unsupported-option check; failures count as outcome "invalid"."""
        try:
            body = await parse_body(raw, model)
            check_model(body.model, self.model_name)
            field = body.unsupported()
            if field is not None:
                raise APIError(
                    400,
                    f"{field}={getattr(body, field)!r} is not supported by this server; omit it or send its default",
                    param=field,
                    code="unsupported_parameter",
                )
        except APIError:
            self.rt.metrics.requests.labels("invalid").inc()
            raise
        return body

    def _token_text(self, body: _SamplingFields) -> Callable[[int], str]:
        """How logprobs name a token: its own decoding, or ``token_id:N`` (vLLM's return_tokens_as_token_ids)."""
        if body.return_tokens_as_token_ids:
            return lambda i: f"token_id:{i}"
        return lambda i: self.tok.decode([i])

    def _request_id(self, raw: Request, prefix: str) -> tuple[str, str | None]:
        """(request id, the client's X-Request-Id or None)."""
        client = raw.headers.get("x-request-id")
        if client is None:
            return self.rt.new_request_id(prefix), None
        if not _REQUEST_ID.fullmatch(client):
            raise APIError(
                400, "X-Request-Id must be 1-128 characters of [A-Za-z0-9._:-]", param="X-Request-Id",
                code="invalid_request_id",
            )  # fmt: skip
        rid = f"{prefix}-{client}"
        if rid in self._live:
            raise APIError(
                400, f"X-Request-Id {client!r} is already in use by a request in flight", param="X-Request-Id",
                code="duplicate_request_id",
            )  # fmt: skip
        return rid, client

    async def _run(
        self,
        raw: Request,
        body: _SamplingFields,
        ids: list[int],
        ends: frozenset[int],
        prefix: str,
        arrival: float,
        chat: bool,
        echo: str = "",
    ) -> Any:
        rt = self.rt
        try:
            rid, client_id = self._request_id(raw, prefix)
        except APIError:
            rt.metrics.requests.labels("invalid").inc()
            raise
        rt.check_length(len(ids))
        max_tokens = body.max_tokens or self.default_max_tokens
        if len(ids) + max_tokens > self.max_model_len:
            raise APIError(
                400,
                f"prompt ({len(ids)} tokens) + max_tokens ({max_tokens}) exceeds the context "
                f"limit of {self.max_model_len} tokens",
                param="max_tokens",
                code="context_length_exceeded",
            )
        eos = frozenset() if body.ignore_eos else ends
        stop_ids = frozenset(body.stop_token_ids or ())
        k = body.logprobs_k()
        params = SamplingParams(max_tokens, body.temperature, body.top_p, body.seed, stop_ids, logprobs=k)
        lp_fmt = None if k is None else LogprobFormatter(self._token_text(body), start_offset=len(echo))
        rt.admit()
        try:
            slo = None if body.ttft_slo_ms is None else body.ttft_slo_ms / 1000.0
            sub = rt.submit(rid, ids, max_tokens, slo, body.user, arrival)
        except BaseException:
            rt.release()
            raise
        self._live.add(rid)
        gen = _Generation(rt, sub, params, eos | stop_ids, TextStream(self.tok, body.stop_list()), self._live)
        headers = {"X-Request-Id": client_id} if client_id is not None else {}
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            fmt = _ChatChunks(rid, self.model_name, lp_fmt, k) if chat else _TextChunks(rid, self.model_name, lp_fmt)
            return StreamingResponse(
                _sse(gen, fmt, include_usage, body.return_token_ids, echo),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache", **headers},
                background=BackgroundTask(gen.close),
            )
        collected = await _unless_disconnected(raw, gen)
        if collected is None:  # the client left: nothing to send (the connection is gone)
            return Response(status_code=499)
        text, token_ids, reason = collected
        text = echo + text
        usage = Usage(
            prompt_tokens=len(ids),
            completion_tokens=len(token_ids),
            total_tokens=len(ids) + len(token_ids),
            prompt_tokens_details={"cached_tokens": sub.timeline.cached_tokens},
        )
        tids = token_ids if body.return_token_ids else None
        resp: BaseModel
        lps = None
        if lp_fmt is not None:
            lps = lp_fmt.chat(token_ids, gen.logprobs, k or 0) if chat else lp_fmt.completion(token_ids, gen.logprobs)
        if chat:
            resp = ChatCompletionResponse(
                id=rid,
                model=self.model_name,
                usage=usage,
                choices=[
                    ChatChoice(
                        message=AssistantMessage(content=text), finish_reason=reason, token_ids=tids, logprobs=lps
                    )
                ],
            )
        else:
            resp = CompletionResponse(
                id=rid,
                model=self.model_name,
                usage=usage,
                choices=[CompletionChoice(text=text, finish_reason=reason, token_ids=tids, logprobs=lps)],
            )
        data = resp.model_dump()
        if not body.return_token_ids:
            for c in data["choices"]:
                c.pop("token_ids", None)
        return JSONResponse(data, headers=headers)


async def _unless_disconnected(raw: Request, gen: _Generation) -> tuple[str, list[int], str | None] | None:
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


class _Generation:
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
        self.rt.release()

    async def collect(self) -> tuple[str, list[int], str | None]:
        async for _ in self.deltas():
            pass
        return self.text.text, self.token_ids, self.finish_reason


_Tokens = tuple[list[int], list[TokenLogprob]]  # a chunk's token ids and their logprobs


class _TextChunks:
    def __init__(self, rid: str, model: str, lp: LogprobFormatter | None = None) -> None:
        self.base = {"id": rid, "object": "text_completion", "created": int(time.time()), "model": model}
        self.lp = lp

    def delta(
        self, text: str, reason: str | None, ids: list[int] | None, first: bool = False, toks: _Tokens | None = None
    ) -> dict[str, Any]:
        logprobs = self.lp.completion(*toks) if self.lp is not None and toks is not None else None
        choice: dict[str, Any] = {"index": 0, "text": text, "finish_reason": reason, "logprobs": logprobs}
        if ids is not None:
            choice["token_ids"] = ids
        return {**self.base, "choices": [choice]}


class _ChatChunks:
    def __init__(self, rid: str, model: str, lp: LogprobFormatter | None = None, k: int | None = None) -> None:
        self.base = {"id": rid, "object": "chat.completion.chunk", "created": int(time.time()), "model": model}
        self.lp, self.k = lp, k or 0

    def delta(
        self, text: str, reason: str | None, ids: list[int] | None, first: bool = False, toks: _Tokens | None = None
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


async def _sse(
    gen: _Generation, fmt: _TextChunks | _ChatChunks, include_usage: bool, with_ids: bool, echo: str = ""
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
