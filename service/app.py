"""The HTTP API (docs/design.md section 6): `create_app()` builds the app with its engine and job queue.

Run it with `uvicorn --factory service.app:create_app` (or `vips serve` / `vips up`, which migrate the
control database first: the app assumes a migrated database). OpenAPI at /docs.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi_offline import FastAPIOffline
from sqlalchemy import Engine
from sqlalchemy.exc import InterfaceError, OperationalError
from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from control.errors import BudgetRefused, ServiceError, SpecError, StorageFull
from control.jobs.periodic import run_every
from control.jobs.queue import CeleryQueue, JobQueue
from control.jobs.reaper import start_reaper_thread
from control.rate_limits import KeyInFlight, KeyRateLimiter
from control.settings import ServiceSettings, get_settings
from control.store.db import create_control_engine
from service.http.limits import BodyLimit, ErrorBoundary, HeaderLimit, validation_errors
from service.http.proxies import ForwardedHeaders
from service.http.redoc import redoc_router
from service.routes import budgets, datasets, health, jobs, key_ledger, keys, posteriors
from service.ui import routes as ui_routes
from service.ui.views import warm_spend_curves

log = logging.getLogger(__name__)

API_PREFIX = "/v1"

DESCRIPTION = """Differentially private Bayesian model fitting (VIPS) as a service.

Authenticate with `Authorization: Bearer <API key>`. Every released value is the output of a Gaussian
mechanism whose privacy cost was first reserved in the dataset's budget ledger. The posterior documents
are described in the repository's docs/posterior-format.md (and below, one schema per model family); the
dashboard for people is at /ui."""


#: The API's documentation pages load only from this host (ReDoc's bundle is served without the logo it
#: would fetch from cdn.redoc.ly: service.http.redoc); the policy refuses anything else. Swagger UI and ReDoc
#: start from inline scripts and styles, ReDoc searches in a blob: worker.
DOCS_POLICY = (
    "default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; font-src 'self' data:; worker-src 'self' blob:; connect-src 'self'; "
    "frame-ancestors 'none'; base-uri 'none'"
)
DOCS_PAGES = ("/docs", "/redoc")
#: Where fastapi_offline serves Swagger UI's files and the favicon.
DOCS_ASSETS = "/docs-assets"


class DocsPolicy:
    """Send DOCS_POLICY with the documentation pages (a pure ASGI middleware: bodies pass untouched)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] not in DOCS_PAGES:
            await self.app(scope, receive, send)
            return

        async def with_policy(message: Message) -> None:
            if message["type"] == "http.response.start":
                MutableHeaders(scope=message)["Content-Security-Policy"] = DOCS_POLICY
            await send(message)

        await self.app(scope, receive, with_policy)


async def _service_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ServiceError)
    if isinstance(exc, BudgetRefused | StorageFull):
        return JSONResponse(jsonable_encoder(exc.refusal), status_code=exc.status_code)
    return JSONResponse({"detail": exc.detail}, status_code=exc.status_code, headers=exc.headers)


async def _spec_error(_: Request, exc: Exception) -> JSONResponse:
    """Checks that need the dataset or the server's limits answer like FastAPI's own 422s."""
    assert isinstance(exc, SpecError)
    detail = [{"type": "value_error", "loc": ["body", *loc], "msg": msg} for loc, msg in exc.errors]
    return JSONResponse({"detail": detail}, status_code=422)


async def _validation_error(_: Request, exc: Exception) -> JSONResponse:
    """FastAPI's 422 with loc, msg and type, quoting at most a short excerpt of each rejected input
    (never the whole body back) and safe to encode when the input was not finite."""
    assert isinstance(exc, RequestValidationError)
    return JSONResponse({"detail": validation_errors(exc.errors())}, status_code=422)


async def _database_error(_: Request, exc: Exception) -> JSONResponse:
    log.error("control database error: %s", type(exc).__name__, exc_info=exc)
    return JSONResponse({"detail": "the control database is unavailable; try again later"}, status_code=503)


def create_app(
    settings: ServiceSettings | None = None, *, queue: JobQueue | None = None, engine: Engine | None = None
) -> FastAPI:
    """The API with its own engine and queue (both replaceable, e.g. by a recording queue in tests)."""
    settings = settings if settings is not None else get_settings()
    engine = engine if engine is not None else create_control_engine(settings)
    queue = queue if queue is not None else CeleryQueue(settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # The reaper runs here too, so a job whose worker died is sent again, and budget reserved by a job
        # no worker will run is refunded, even when no worker is alive (control.jobs.reaper).
        stop = (
            start_reaper_thread(
                engine,
                settings.reaper_interval_seconds,
                settings.heartbeat_timeout_seconds,
                settings.queued_timeout_seconds,
                queue.holds,
                queue.send_run_job,
            )
            if settings.reaper_interval_seconds > 0
            else None
        )
        warmer = (
            run_every(settings.ui_warm_interval_seconds, lambda: warm_spend_curves(engine), "ui-warmer")
            if settings.ui_warm_interval_seconds > 0
            else None
        )
        try:
            yield
        finally:
            for thread in (stop, warmer):
                if thread is not None:
                    thread.set()
            app.state.queue.close()
            app.state.engine.dispose()

    # Swagger UI and ReDoc from fastapi_offline's own copies, served here: /docs and /redoc work offline
    # (/redoc from service.http.redoc, which drops the bundle's one request to another host).
    app = FastAPIOffline(
        redoc_url=None,
        title="VIPS",
        version="1",
        description=DESCRIPTION,
        lifespan=lifespan,
        swagger_ui_parameters={"validatorUrl": None},  # never ask validator.swagger.io
        static_url=DOCS_ASSETS,
    )
    app.state.settings = settings
    app.state.engine = engine
    app.state.queue = queue
    # Each key's reads, in this process (service.http.auth.read_slot; writes have their own limits).
    app.state.read_limiter = KeyRateLimiter(
        settings.read_rate_per_key, settings.read_burst_per_key, what="reads"
    )
    app.state.reads_in_flight = KeyInFlight(settings.reads_in_flight_per_key, what="reads")
    app.add_exception_handler(ServiceError, _service_error)
    app.add_exception_handler(SpecError, _spec_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(OperationalError, _database_error)  # unreachable, locked, gone away
    app.add_exception_handler(InterfaceError, _database_error)
    # Unexpected errors: a JSON 500 that keeps the connection usable; bodies above the limit: 413.
    app.add_middleware(ErrorBoundary)
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    app.add_middleware(HeaderLimit, max_bytes=settings.max_header_bytes)
    app.add_middleware(DocsPolicy)
    # Outermost: scheme and client from X-Forwarded-* only when the peer is in VIPS_TRUSTED_PROXIES.
    app.add_middleware(ForwardedHeaders, networks=settings.trusted_networks())
    app.include_router(redoc_router(app.openapi_url or "/openapi.json", DOCS_ASSETS, app.title))
    app.include_router(health.router)
    for resource in (datasets, budgets, key_ledger, jobs, posteriors, keys):
        app.include_router(resource.router, prefix=API_PREFIX)
    app.include_router(ui_routes.router)
    return app
