"""Validation of an API request before any work is queued: the JSON body against its schema, the model name and
unsupported options of a generation request, and a client's ``X-Request-Id``.

Every failure is an :class:`~vertumnus.serving.errors.APIError` with an OpenAI-style body: 400 for malformed JSON,
an unsupported option or a bad request id, 422 (``param`` = the field path) for a schema violation.
"""

from __future__ import annotations

import re
from typing import TypeVar

from fastapi import Request
from pydantic import BaseModel, ValidationError

from vertumnus.serving.errors import APIError, check_model
from vertumnus.serving.schemas import _SamplingFields

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


async def parse_generation_body(raw: Request, model: type[S], served: str) -> S:
    """The body of a generation request (:func:`parse_body`), for the served model, without unsupported options."""
    body = await parse_body(raw, model)
    check_model(body.model, served)
    field = body.unsupported()
    if field is not None:
        raise APIError(
            400,
            f"{field}={getattr(body, field)!r} is not supported by this server; omit it or send its default",
            param=field,
            code="unsupported_parameter",
        )
    return body


def client_request_id(client: str, prefix: str, live: set[str]) -> str:
    """The request id a client's ``X-Request-Id`` names (``<prefix>-<client>``): 400 when the header is not 1-128
    characters of ``[A-Za-z0-9._:-]`` or the id is still in flight (in ``live``)."""
    if not _REQUEST_ID.fullmatch(client):
        raise APIError(
            400, "X-Request-Id must be 1-128 characters of [A-Za-z0-9._:-]", param="X-Request-Id",
            code="invalid_request_id",
        )  # fmt: skip
    rid = f"{prefix}-{client}"
    if rid in live:
        raise APIError(
            400, f"X-Request-Id {client!r} is already in use by a request in flight", param="X-Request-Id",
            code="duplicate_request_id",
        )  # fmt: skip
    return rid
