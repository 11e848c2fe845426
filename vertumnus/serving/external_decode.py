"""Decode on an external OpenAI-compatible endpoint (``serving.decode_url``), e.g. a vLLM decode instance.

After the prefill pool finished a request, the server sends the prompt's token ids to
``{decode_url}/v1/completions`` with ``stream: true`` and ``return_token_ids: true`` and relays the generated ids.
When the prefill engine produced ``kv_transfer_params`` (vLLM P/D connectors) they are forwarded, so the decode
instance pulls the KV instead of recomputing the prompt; otherwise the endpoint recomputes it (the prefill pool
then only warmed its own prefix cache). The endpoint must serve the same model name and return token ids
(``choices[].token_ids``: vLLM's ``return_token_ids`` extension, which Vertumnus' own server also implements).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx

from vertumnus.serving.handoff import DecodeChunk, DecodeRequest
from vertumnus.serving.sampling import TokenLogprob


class ExternalDecode:
    """DecodeBackend over HTTP; abort = closing the streaming response (the endpoint stops generating)."""

    def __init__(self, url: str, model: str, timeout_s: float = 600.0) -> None:
        self.url = url.rstrip("/")
        self.model = model
        self.timeout_s = timeout_s
        self._client: httpx.AsyncClient | None = None
        self._open: dict[str, httpx.Response] = {}

    async def start(self) -> None:
        self._client = httpx.AsyncClient(timeout=httpx.Timeout(self.timeout_s, connect=10.0))

    def body(self, req: DecodeRequest) -> dict[str, Any]:
        p = req.params
        body: dict[str, Any] = {
            "model": self.model,
            "prompt": req.handoff.token_ids,
            "max_tokens": p.max_tokens,
            "temperature": p.temperature,
            "top_p": p.top_p,
            "stream": True,
            "return_token_ids": True,
            "ignore_eos": True,  # ends are decided here: eos_ids below carries EOS unless the client ignores it
            "stop_token_ids": sorted(req.eos_ids),
        }
        if p.seed is not None:
            body["seed"] = p.seed
        if p.logprobs is not None:  # vLLM: ids as "token_id:N" so they need no tokenizer here
            body["logprobs"] = p.logprobs
            body["return_tokens_as_token_ids"] = True
        if req.handoff.kv_transfer_params is not None:
            body["kv_transfer_params"] = req.handoff.kv_transfer_params
        return body

    async def stream(self, req: DecodeRequest) -> AsyncIterator[DecodeChunk]:
        assert self._client is not None, "start() not called"
        rid = req.handoff.request_id
        async with self._client.stream("POST", f"{self.url}/v1/completions", json=self.body(req)) as resp:
            if resp.status_code != 200:
                text = (await resp.aread()).decode(errors="replace")[:500]
                raise RuntimeError(f"decode endpoint answered {resp.status_code}: {text}")
            self._open[rid] = resp
            try:
                async for line in resp.aiter_lines():
                    chunk = _parse_event(line)
                    if chunk is not None:
                        yield chunk
                        if chunk.finish_reason is not None:
                            return
            finally:
                self._open.pop(rid, None)

    async def abort(self, request_id: str) -> None:
        resp = self._open.pop(request_id, None)
        if resp is not None:
            await resp.aclose()

    async def stats(self) -> dict[str, Any]:
        return {"backend": "external", "url": self.url, "active": len(self._open)}

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None


def _parse_event(line: str) -> DecodeChunk | None:
    """One SSE line of a completions stream → a chunk (None for keep-alives, [DONE], usage-only events)."""
    if not line.startswith("data:"):
        return None
    data = line[5:].strip()
    if not data or data == "[DONE]":
        return None
    obj = json.loads(data)
    if "error" in obj:
        raise RuntimeError(f"decode endpoint error: {obj['error'].get('message')}")
    choices = obj.get("choices") or []
    if not choices:
        return None
    ch = choices[0]
    ids = ch.get("token_ids")
    if ids is None:
        if ch.get("text"):
            raise RuntimeError("decode endpoint returned text without token_ids; it must support return_token_ids")
        ids = []  # e.g. the finishing chunk
    return DecodeChunk(list(ids), ch.get("finish_reason"), _parse_logprobs(ch.get("logprobs"), len(ids)))


def _token_id(token: str) -> int:
    if not token.startswith("token_id:"):
        raise RuntimeError(
            f"decode endpoint returned logprob token {token!r}; it must support return_tokens_as_token_ids"
        )
    return int(token[len("token_id:") :])


def _parse_logprobs(obj: dict[str, Any] | None, n: int) -> list[TokenLogprob] | None:
    """A completions chunk's ``logprobs`` object (``tokens`` as ``token_id:N``) → one TokenLogprob per id, its
    alternatives most likely first (vLLM's may include the sampled token itself beyond the k asked for)."""
    if obj is None:
        return None
    lps = obj.get("token_logprobs") or []
    tops = obj.get("top_logprobs") or [None] * len(lps)
    if len(lps) != n:
        raise RuntimeError(f"decode endpoint returned {len(lps)} logprobs for {n} tokens")
    out = []
    for lp, top in zip(lps, tops, strict=True):
        ranked = sorted(((_token_id(t), float(v)) for t, v in (top or {}).items()), key=lambda x: -x[1])
        out.append(TokenLogprob(float(lp), tuple(ranked)))
    return out
