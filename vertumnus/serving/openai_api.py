"""``POST /v1/completions`` and ``POST /v1/chat/completions``: parse, tokenize, admit, place, decode, format.

The body is read and validated inside the handler (not by FastAPI's dependency layer) so that the request's
arrival instant precedes parsing (the router-overhead measurement starts at "HTTP in") and so that malformed
JSON (400) and schema violations (422) get OpenAI-style bodies from one place.

Behaviour a client can rely on:

- ``X-Request-Id`` (optional, ``[A-Za-z0-9._:-]{1,128}``) names the request: its id is ``cmpl-<X-Request-Id>``
  (``chatcmpl-…``), it is echoed in the response's ``X-Request-Id`` header and ``/v1/requests/{id}`` finds it; an
  id still in flight is a 400 (``duplicate_request_id``). Without it the server makes one up.
- A streamed response's first event is sent when the first token exists (for chat: the role and the first
  token's text together), so a client's time-to-first-chunk is the server's TTFT, not the time to the headers
  (vertumnus/serving/sse.py).
- A non-streamed request whose client disconnects is cancelled at once (prefill hand-off dropped, decode
  aborted, outcome ``cancelled``) instead of being decoded to the end for nobody.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel
from starlette.background import BackgroundTask

from vertumnus.serving.errors import APIError
from vertumnus.serving.generation import Generation, collect_unless_disconnected
from vertumnus.serving.logprobs import LogprobFormatter
from vertumnus.serving.request_validation import client_request_id, parse_generation_body
from vertumnus.serving.runtime import ServingRuntime
from vertumnus.serving.sampling import SamplingParams
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
from vertumnus.serving.sse import ChatChunks, TextChunks, sse_events
from vertumnus.serving.tokenizer import ChatTurn, TextStream, Tokenizer

S = TypeVar("S", bound=_SamplingFields)


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
            return await parse_generation_body(raw, model, self.model_name)
        except APIError:
            self.rt.metrics.requests.labels("invalid").inc()
            raise

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
        return client_request_id(client, prefix, self._live), client

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
        rt.admission.check_length(len(ids))
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
        rt.admission.admit()
        try:
            slo = None if body.ttft_slo_ms is None else body.ttft_slo_ms / 1000.0
            sub = rt.submit(rid, ids, max_tokens, slo, body.user, arrival)
        except BaseException:
            rt.admission.release()
            raise
        self._live.add(rid)
        gen = Generation(rt, sub, params, eos | stop_ids, TextStream(self.tok, body.stop_list()), self._live)
        headers = {"X-Request-Id": client_id} if client_id is not None else {}
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            fmt = ChatChunks(rid, self.model_name, lp_fmt, k) if chat else TextChunks(rid, self.model_name, lp_fmt)
            return StreamingResponse(
                sse_events(gen, fmt, include_usage, body.return_token_ids, echo),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache", **headers},
                background=BackgroundTask(gen.close),
            )
        collected = await collect_unless_disconnected(raw, gen)
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
