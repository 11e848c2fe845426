"""Admission: whether any worker of the pool could ever serve a request (checked once per placement attempt)."""

from __future__ import annotations

from vertumnus.types import Request


class RequestRejected(ValueError):
    """A request no worker of this pool can ever serve.

    ``reason``: ``"too_long"`` (``limit`` = max_model_len tokens), ``"no_capacity_fit"`` (``limit`` = the
    largest worker KV capacity in blocks), ``"empty"`` (``limit`` = 1 token). ``needed``: the request's value
    in the same unit.
    """

    def __init__(self, request_id: str, reason: str, limit: int, needed: int, message: str) -> None:
        super().__init__(message)
        self.request_id = request_id
        self.reason = reason
        self.limit = limit
        self.needed = needed


def admission_check(request: Request, max_model_len: int, max_capacity: int, block_tokens: int) -> None:
    """Raise :class:`RequestRejected` when the request is empty, longer than ``max_model_len`` tokens, or needs
    more KV blocks than the largest worker holds (``max_capacity``)."""
    rid, n = request.request_id, request.input_len
    if n < 1:
        raise RequestRejected(rid, "empty", 1, n, f"request {rid!r} has no input tokens")
    if n > max_model_len:
        raise RequestRejected(
            rid, "too_long", max_model_len, n,
            f"request {rid!r} has {n} input tokens, more than max_model_len={max_model_len}",
        )  # fmt: skip
    need = -(-n // block_tokens)
    if need > max_capacity:
        raise RequestRejected(
            rid, "no_capacity_fit", max_capacity, need,
            f"request {rid!r} needs {need} KV blocks of {block_tokens} tokens; the largest worker "
            f"holds {max_capacity}",
        )  # fmt: skip
