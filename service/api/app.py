"""The FastAPI application factory."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service import migrate
from service.api import (
    changes,
    dashboard,
    dml_bodies,
    events,
    exports,
    health,
    imports,
    jobs,
    metrics,
    sources,
    tables,
    worker_list,
    workers,
)
from service.api.auth import BearerAuth, configured_tokens, document_security
from service.api.bodies import document_components, document_raw_bodies
from service.api.errors import document_unavailable, install_error_handlers
from service.api.event_hub import EventHub
from service.api.event_schemas import event_components
from service.api.limits import BodySizeLimit, reject_unknown_query
from service.api.request_ids import RequestIds
from service.catalog.tokens import EMBEDDED_WORKER, TokenAuthority
from service.context import ServiceContext
from service.db import Database
from service.meta import metrics as meta_metrics
from service.meta.loop import MetaLoop
from service.meta.spawner import EmbeddedWorkerSpawner
from service.settings import Settings, load_settings

log = logging.getLogger(__name__)

API_VERSION = "0.1.0"
# the document's groups (a generated client's API classes), one per resource; `internal`
# is the worker protocol's, whose operations are also marked `x-internal`
OPENAPI_TAGS: list[dict[str, Any]] = [
    {"name": "tables", "description": "Tables, their DML and their rows at an epoch."},
    {
        "name": "exports",
        "description": "A table's or view's snapshot at an epoch written as Parquet by Spark.",
    },
    {
        "name": "imports",
        "description": "Parquet, CSV or JSON files loaded into a table by Spark, at one epoch.",
    },
    {"name": "sources", "description": "Kafka topics of JSON objects, read as tables."},
    {"name": "jobs", "description": "Materialized views and their online backfill."},
    {"name": "events", "description": "What happens to jobs, as Server-Sent Events."},
    {"name": "workers", "description": "The workers, their capacity and their actors."},
    {"name": "health", "description": "Liveness and readiness probes."},
    {"name": "metrics", "description": "Prometheus metrics."},
    {"name": "internal", "description": "The worker protocol: for workers only."},
]


def create_app(settings: Settings | None = None, db: Database | None = None) -> FastAPI:
    """Build the app; the database (embedded unless configured) starts with the app."""
    settings = settings or load_settings()
    authority = TokenAuthority(configured_tokens(settings)) if settings.auth else None

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        database = db or Database.from_settings(settings)
        if settings.auto_migrate:
            migrate.upgrade(database.engine)
        ctx = ServiceContext(settings=settings, db=database, auth=authority)
        app.state.ctx = ctx
        worker_token = None
        if authority is not None:
            authority.start(database)
        spawner = None
        if settings.embedded and settings.spawn_embedded_worker:
            if authority is not None:  # one per start; the spawned worker's only token
                worker_token = authority.issue("worker", EMBEDDED_WORKER)
            spawner = EmbeddedWorkerSpawner(lambda: ctx.base_url, worker_token)
        loop = (
            MetaLoop(settings, database, ctx.clock, ctx.signal, spawner)
            if settings.run_barrier_loop
            else None
        )
        app.state.meta_loop = loop
        app.state.spawner = spawner
        app.state.event_hub = EventHub(database, settings.max_event_streams_per_token)
        if loop is not None:
            loop.start()
        try:
            yield
        finally:
            if loop is not None:
                loop.stop()
            if authority is not None:  # the embedded worker's and a demo's
                authority.retire_issued()
            if db is None:
                database.close()

    app = FastAPI(
        title="MV backfill service",
        version=API_VERSION,
        description="Create materialized views over live tables and Kafka sources, "
        "backfilled online with exactly-once results at every committed epoch.",
        lifespan=lifespan,
        openapi_tags=OPENAPI_TAGS,
        dependencies=[Depends(reject_unknown_query)],
    )
    install_error_handlers(app)
    app.add_middleware(
        BodySizeLimit,
        max_bytes=settings.max_body_bytes,
        streamed_max_bytes=settings.max_bulk_body_bytes,
        streamed=dml_bodies.is_streamed,
    )
    if authority is not None:  # outside the body limit: anonymous bodies are never read
        app.add_middleware(BearerAuth, authority=authority, open_paths=settings.open_paths)
        document_security(app, settings.open_paths)
    app.add_middleware(MeasureRequests)  # counts the 401s and 413s too
    app.add_middleware(RequestIds)  # outermost: every line and answer has its id
    app.include_router(health.router)
    app.include_router(tables.router)
    app.include_router(changes.router)
    app.include_router(exports.router)
    app.include_router(imports.router)
    app.include_router(sources.router)
    app.include_router(jobs.router)
    app.include_router(events.router)
    app.include_router(worker_list.router)
    app.include_router(workers.router)
    app.include_router(metrics.router)
    app.include_router(dashboard.router)
    document_raw_bodies(app, [*workers.RAW_BODY_MODELS, tables.DmlRequest])
    document_components(app, event_components)
    # every operation reads the catalog but the liveness probe (and the readiness
    # probe's 503 is its own)
    document_unavailable(app, frozenset({"getHealth", "getReadiness"}))
    return app


class MeasureRequests:
    """Pure ASGI middleware (no task and no stream per request, unlike Starlette's
    ``BaseHTTPMiddleware``): count and time requests per route template (never per raw
    path: ids would make every job its own time series)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            template = getattr(scope.get("route"), "path", "unmatched")
            method = scope["method"]
            meta_metrics.HTTP_REQUESTS.labels(template, method, str(status)).inc()
            meta_metrics.HTTP_LATENCY.labels(template, method).observe(
                time.perf_counter() - started
            )
