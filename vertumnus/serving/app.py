"""The FastAPI application: OpenAI-compatible generation, pool introspection, admin reconfiguration, metrics.

Routes::

    POST /v1/completions, /v1/chat/completions   generation (JSON or SSE with "stream": true)
    GET  /v1/models, /v1/models/{id}             the served model (``root``: where its tokenizer is)
    POST /tokenize, /detokenize                  vLLM-style tokenizer endpoints (vertumnus/serving/model_api.py)
    GET  /health, /ready                         200 {"status": "ok"} while a worker can serve; 503 {"status":
                                                 "starting"|"unavailable", "reason": ...} before / while none can
    GET  /live                                   200 while the process and its event loop answer (liveness)
    GET  /metrics                                Prometheus text format (docs/metrics.md)
    GET  /v1/pool                                workers (id, engine, degree, ranks, state, epoch, outstanding
                                                 workload, cached blocks), composition, decode side
    POST /v1/pool/reconfigure                    {"op": "split"|"merge", "worker": id[, "wait": bool]}; needs
                                                 "Authorization: Bearer <serving.admin_token>" (403 when unset)
    GET  /v1/requests/{id}                       timing breakdown of a recent request
    GET  /v1/requests?limit=N                    the N most recent requests' breakdowns, newest first
    POST /v1/test/hold, /v1/test/release         tests only (``serving.test_hooks: true``, admin token): hold /
    GET  /v1/test/holds                          release prefills on workers, fail a worker (it restarts with an
    POST /v1/test/fail                           empty cache); vertumnus/serving/holds.py

The app owns no threads: the runtime, the pool and every engine callback run on uvicorn's event loop.
"""

from __future__ import annotations

import asyncio
import gc
import hmac
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from vertumnus.serving.errors import APIError, install_error_handlers
from vertumnus.serving.holds import HoldAt, HookedDataPlane, PrefillHolds
from vertumnus.serving.model_api import add_model_routes
from vertumnus.serving.openai_api import OpenAIHandlers
from vertumnus.serving.request_validation import parse_body
from vertumnus.serving.runtime import ServingRuntime
from vertumnus.serving.schemas import (
    FailRequest,
    HoldRequest,
    ReconfigureRequest,
    ReleaseRequest,
)
from vertumnus.serving.tokenizer import make_tokenizer
from vertumnus.types import ReconfigKind, ReconfigPlan

PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def create_app(
    runtime: ServingRuntime, manage_runtime: bool = True, on_ready: Callable[[], None] | None = None
) -> FastAPI:
    """Build the app over ``runtime``; with ``manage_runtime`` the app starts and closes it (lifespan);
    ``on_ready`` runs once the pool is up, just before the server accepts requests."""

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        if manage_runtime:
            await runtime.start(runtime.cfg.serving.startup_timeout_s)
        gc.freeze()  # start-up objects (modules, weights' wrappers, tables) leave the collector's working set
        if on_ready is not None:
            on_ready()
        try:
            yield
        finally:
            if manage_runtime:
                await runtime.close()

    app = FastAPI(title="Vertumnus", version="0.1.0", lifespan=lifespan, docs_url=None, redoc_url=None)
    install_error_handlers(app)
    cfg = runtime.cfg
    handlers = OpenAIHandlers(runtime, make_tokenizer(cfg.serving.tokenizer, cfg.model.vocab_size))
    # plain Starlette routes: the handlers parse their own bodies, so FastAPI's dependency solving and response
    # validation would only add per-request cost on the hot path
    app.add_route("/v1/completions", handlers.completions, methods=["POST"])
    app.add_route("/v1/chat/completions", handlers.chat, methods=["POST"])

    add_model_routes(app, cfg, handlers.tok)

    @app.get("/health")
    @app.get("/ready")
    async def health() -> JSONResponse:
        """200 while at least one worker can serve; 503 with the reason while starting or while every worker
        is FAILED (restarting). ``/ready`` is the Kubernetes readiness probe's name for the same check."""
        reason = runtime.admission.unavailable()
        if reason is not None:
            status = "starting" if not runtime.admission.ready else "unavailable"
            return JSONResponse({"status": status, "reason": reason}, status_code=503, headers={"Retry-After": "5"})
        return JSONResponse({"status": "ok"})

    @app.get("/live")
    async def live() -> JSONResponse:
        """Kubernetes liveness: the process is up and its event loop answers (a pool that cannot serve is a
        readiness matter: restarting the process would not bring its workers back any faster)."""
        return JSONResponse({"status": "alive"})

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(runtime.metrics.render(), media_type=PROMETHEUS_CONTENT_TYPE)

    @app.get("/v1/pool")
    async def pool() -> dict[str, Any]:
        snap = runtime.pool.snapshot()
        return {
            "engine": runtime.engine_name,
            "composition": snap.composition,
            "epoch": snap.epoch,
            "workers": [r.as_json() for r in runtime.worker_rows(snap)],
            "backlog": snap.backlog,
            "placed": snap.inflight,
            "inflight": runtime.admission.inflight,
            "reconfiguring": snap.reconfiguring,
            "reconfigs_done": snap.reconfigs_done,
            "last_window": snap.last_window,
            "cache": snap.cache,
            "decode": await runtime.decode.stats(),
            "engine_stats": runtime.engine_stats(),
        }

    @app.get("/v1/requests")
    async def recent_requests(limit: int = 20) -> dict[str, Any]:
        return {"object": "list", "data": [t.as_json() for t in runtime.timelines.recent(max(1, min(limit, 1000)))]}

    @app.get("/v1/requests/{request_id}")
    async def request_timing(request_id: str) -> dict[str, object]:
        tl = runtime.timelines.get(request_id)
        if tl is None:
            raise APIError(404, f"no recent request with id {request_id!r}", param="request_id", code="not_found")
        return tl.as_json()

    @app.post("/v1/pool/reconfigure")
    async def reconfigure(raw: Request) -> dict[str, Any]:
        _check_admin(raw, cfg.serving.admin_token)
        body = await parse_body(raw, ReconfigureRequest)
        try:
            plan = runtime.reconfigure(body.op, body.worker)
        except ValueError as e:
            raise APIError(
                409, f"{body.op} of worker {body.worker} refused: {e}", param="worker", code="reconfiguration_refused"
            ) from None
        if body.wait:
            await _wait_active(runtime, plan, cfg.serving.startup_timeout_s)
        return plan_json(plan)

    if cfg.serving.test_hooks:
        _add_test_hooks(app, runtime)
    return app


def _add_test_hooks(app: FastAPI, runtime: ServingRuntime) -> None:
    """The test-only hold / release endpoints (``serving.test_hooks``; admin token required)."""
    token = runtime.cfg.serving.admin_token

    def hooked(raw: Request) -> HookedDataPlane:
        _check_admin(raw, token)
        inner = getattr(runtime.data_plane, "inner", runtime.data_plane)
        if not isinstance(inner, HookedDataPlane):
            raise APIError(501, f"the {runtime.engine_name} engine has no test hooks", code="not_supported")
        return inner

    def holds(raw: Request) -> PrefillHolds:
        return hooked(raw).holds

    @app.post("/v1/test/hold")
    async def hold(raw: Request) -> dict[str, Any]:
        h = holds(raw)
        body = await parse_body(raw, HoldRequest)
        h.hold(body.workers, HoldAt.QUEUE if body.at == "queue" else HoldAt.START)
        return h.state()

    @app.post("/v1/test/release")
    async def release(raw: Request) -> dict[str, Any]:
        h = holds(raw)
        body = await parse_body(raw, ReleaseRequest)
        woken = h.release(body.workers)
        return {**h.state(), "woken": woken}

    @app.get("/v1/test/holds")
    async def state(raw: Request) -> dict[str, Any]:
        return holds(raw).state()

    @app.post("/v1/test/fail")
    async def fail(raw: Request) -> dict[str, Any]:
        dp = hooked(raw)
        body = await parse_body(raw, FailRequest)
        try:
            dp.fail_worker(body.worker, "failed by the test hook")
        except KeyError:
            raise APIError(404, f"no worker {body.worker}", param="worker", code="not_found") from None
        return {"failed": body.worker}


def _check_admin(raw: Request, token: str | None) -> None:
    """403 while admin is disabled (no token configured); 401 unless the Bearer token matches."""
    if not token:
        raise APIError(
            403, "pool reconfiguration is disabled (serving.admin_token is not configured)", code="admin_disabled"
        )
    auth = raw.headers.get("authorization", "")
    scheme, _, given = auth.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), token.encode()):
        raise APIError(401, "missing or wrong admin Bearer token", code="invalid_admin_token")


async def _wait_active(runtime: ServingRuntime, plan: ReconfigPlan, timeout_s: float) -> None:
    """Until every target worker of ``plan`` is ACTIVE (its ranks acked the new epoch)."""
    targets = {g.worker_id for g in plan.targets}
    deadline = runtime.clock() + timeout_s
    while runtime.clock() < deadline:
        active = {r.worker_id for r in runtime.worker_rows() if r.state == "active"}
        if targets <= active:
            return
        await asyncio.sleep(0.05)
    raise APIError(500, f"reconfiguration to epoch {plan.epoch} did not complete within {timeout_s:.0f} s")


def plan_json(plan: ReconfigPlan) -> dict[str, Any]:
    """A reconfiguration plan as the admin endpoint returns it."""

    def groups(gs: Any) -> list[dict[str, Any]]:
        return [{"id": g.worker_id, "node": g.node, "degree": g.degree, "ranks": list(g.ranks)} for g in gs]

    return {
        "op": "split" if plan.kind == ReconfigKind.SPLIT else "merge",
        "sources": groups(plan.sources),
        "targets": groups(plan.targets),
        "epoch": plan.epoch,
        "predicted_drain_s": plan.predicted_drain_s,
    }
