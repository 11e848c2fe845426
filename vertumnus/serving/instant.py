"""The trivial decode of ``vertumnus bench serve`` (beside :class:`~vertumnus.engines.sim.instant.InstantDataPlane`):
it measures the front end + pool, not a model. :class:`InstantDecode` answers every request with one ``<|eos|>``
token."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from vertumnus.serving.handoff import DecodeChunk, DecodeRequest
from vertumnus.serving.tokenizer import EOS


class InstantDecode:
    """Answers each request with a single ``<|eos|>`` (finish_reason "stop")."""

    async def start(self) -> None:
        return None

    async def stream(self, req: DecodeRequest) -> AsyncIterator[DecodeChunk]:
        yield DecodeChunk([EOS], "stop")

    async def abort(self, request_id: str) -> None:
        return None

    async def stats(self) -> dict[str, Any]:
        return {"backend": "instant", "active": 0}

    async def close(self) -> None:
        return None
