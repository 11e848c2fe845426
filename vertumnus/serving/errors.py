"""OpenAI-style error bodies and the exception handlers that produce them.

Every failure the front end reports has the body ``{"error": {"message", "type", "param", "code"}}``:

=====  ======================  ==========================================================================
 400   invalid_request_error   body is not valid JSON; prompt too long (message names the limit); bad ids
 401   authentication_error    admin endpoint without the right Bearer token
 403   permission_error        admin endpoint while no admin token is configured (disabled)
 404   invalid_request_error   unknown model (code ``model_not_found``); unknown request / route
 409   invalid_request_error   reconfiguration refused by the controller (e.g. worker not splittable)
 422   invalid_request_error   JSON that does not match the schema (``param`` = the offending field)
 429   rate_limit_error        over ``serving.max_inflight`` (``Retry-After`` header set)
 500   server_error            anything unexpected (logged; the server keeps serving)
 503   service_unavailable     the pool cannot take requests right now (starting / shutting down)
=====  ======================  ==========================================================================
"""

from __future__ import annotations

import json
import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger("vertumnus.serving")

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    409: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "service_unavailable",
}


class APIError(Exception):
    """An error the front end reports to the client with ``status`` and an OpenAI-style body."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers

    def body(self) -> dict[str, dict[str, str | None]]:
        return error_body(self.status, self.message, self.param, self.code)


def check_model(name: str | None, served: str) -> None:
    """404 ``model_not_found`` unless ``name`` is the served model (None: the request named no model)."""
    if name is not None and name != served:
        raise APIError(
            404, f"The model `{name}` does not exist; this server serves `{served}`", param="model",
            code="model_not_found",
        )  # fmt: skip


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    """The OpenAI error object for ``status``."""
    return {
        "error": {"message": message, "type": _TYPES.get(status, "invalid_request_error"), "param": param, "code": code}
    }


def error_response(err: APIError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers)


def _validation_error(exc: RequestValidationError) -> APIError:
    errors = exc.errors()
    first = errors[0] if errors else {}
    if first.get("type") == "json_invalid":
        return APIError(
            400,
            f"request body is not valid JSON: {first.get('ctx', {}).get('error', 'parse error')}",
            code="invalid_json",
        )
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    param = ".".join(loc) or None
    msg = first.get("msg", "invalid request")
    if first.get("type") == "missing":
        msg = "field required"
    text = f"{param}: {msg}" if param else msg
    return APIError(422, text, param=param, code="invalid_value")


def install_error_handlers(app: FastAPI) -> None:
    """Route every error path of ``app`` through :func:`error_response`."""

    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(_validation_error(exc))

    @app.exception_handler(json.JSONDecodeError)
    async def _bad_json(_: Request, exc: json.JSONDecodeError) -> JSONResponse:
        return error_response(APIError(400, f"request body is not valid JSON: {exc.msg}", code="invalid_json"))

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return error_response(APIError(exc.status_code, str(exc.detail), headers=getattr(exc, "headers", None)))

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error while serving a request")
        return error_response(APIError(500, f"internal error: {type(exc).__name__}"))
