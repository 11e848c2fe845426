"""The prefill → decode seam: what a finished prefill hands over and what a decode backend must do.

A data plane that produces KV for decode also implements :class:`HandoffSource`; the server takes the hand-off
once the pool reports the prefill done (exactly once per request: the pool reports ``request_done`` once, after
any re-placement). Decode backends (embedded Ray decode actors, an external OpenAI-compatible endpoint, the
benchmark's instant decode) implement :class:`DecodeBackend`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from vertumnus.serving.sampling import SamplingParams, TokenLogprob


@dataclass(slots=True)
class Handoff:
    """A finished prefill, ready for decode.

    ``kv``: engine-specific handle of the request's full KV and last-position logits (the torch engine: a Ray
    ObjectRef of an exported :class:`~vertumnus.serving.decode_engine.PrefillOutput`); None when the decode side
    recomputes or receives KV on its own (``kv_transfer_params``, vLLM-style P/D connectors).
    """

    request_id: str
    token_ids: list[int]
    kv: Any = None
    kv_transfer_params: dict[str, Any] | None = None


@dataclass(slots=True)
class DecodeChunk:
    """Tokens produced since the previous chunk; ``finish_reason`` set on the last one ("stop" | "length")."""

    token_ids: list[int]
    finish_reason: str | None = None
    logprobs: list[TokenLogprob] | None = None  # one per token id when the request asked for logprobs


@dataclass(slots=True, frozen=True)
class DecodeRequest:
    """Everything a decode backend needs for one request."""

    handoff: Handoff
    params: SamplingParams
    eos_ids: frozenset[int] = field(default_factory=frozenset)  # ids that end generation (EOS, <|end|>, stop ids)


@runtime_checkable
class HandoffSource(Protocol):
    def take_handoff(self, request_id: str) -> Handoff | None:
        """Remove and return the hand-off of a finished prefill (None if the engine produced none)."""
        ...


class DecodeBackend(Protocol):
    """Generates a request's tokens after its prefill."""

    async def start(self) -> None: ...

    def stream(self, req: DecodeRequest) -> AsyncIterator[DecodeChunk]:
        """Token chunks of one request; the first chunk carries the first token. Closing the iterator early
        must release the request's decode resources (the server also calls :meth:`abort`)."""
        ...

    async def abort(self, request_id: str) -> None:
        """Stop generating for ``request_id`` and free its KV (idempotent; unknown ids are ignored)."""
        ...

    async def stats(self) -> dict[str, Any]:
        """At least ``{"active": <sequences holding decode KV>}``."""
        ...

    async def close(self) -> None: ...
