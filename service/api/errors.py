"""Every error leaves the service as ``{"error": {"code", "message", "details"}}``."""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Callable
from typing import Any, Literal

import psycopg2
import psycopg2.extensions
from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel, Field
from sqlalchemy.exc import DBAPIError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from backfill_core.protocol import ErrorBody as ProtocolErrorBody
from service.api.epochs import EpochJson
from service.api.rules import RULE
from service.errors import ServiceError

log = logging.getLogger(__name__)


class ErrorBody(BaseModel):
    code: str
    message: str
    details: Any = None


class ErrorResponse(BaseModel):
    error: ErrorBody


class _ErrorJSON(JSONResponse):
    """ASCII-escaped: an error may quote hostile input (a lone surrogate, say), and the
    answer must still be valid UTF-8."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=True, separators=(",", ":"), default=str).encode()


def error_response(
    status: int,
    code: str,
    message: str,
    details: Any = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    body = ProtocolErrorBody(code, message, jsonable_encoder(details)).to_json()
    return _ErrorJSON(status_code=status, content=body, headers=headers)


def service_error_response(exc: ServiceError) -> JSONResponse:
    """The one mapping of the service's errors to HTTP."""
    if exc.status >= 500:
        log.error("service error: %s", exc.message)
    return error_response(exc.status, exc.code, exc.message, exc.details, exc.headers)


class GoneDetails(BaseModel):
    oldest_readable_epoch: EpochJson = Field(description="read at this epoch or later")


class GoneBody(ErrorBody):
    code: Literal["gone"]
    details: GoneDetails


class GoneResponse(BaseModel):
    error: GoneBody


# a read at an epoch (`?epoch=`) whose versions were garbage-collected
EPOCH_GONE: dict[int | str, dict[str, Any]] = {
    410: {"model": GoneResponse, "description": "The epoch was garbage-collected"}
}
RETRY_AFTER_S = 1
UNAVAILABLE_DESCRIPTION = "The catalog database is unavailable (`database_unavailable`): retry"

# declared on every router so the OpenAPI document shows the real error shape
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorResponse, "description": text}
    for status, text in (
        (400, "Malformed request"),
        (404, "Not found"),
        (409, "Conflict with the current state"),
        (413, "Request body too large"),
        (422, "Validation error"),
    )
}

_HTTP_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: "payload_too_large",
    415: "unsupported_media_type",
}


def _database_away(exc: BaseException) -> bool:
    """A lost or refused connection to Postgres (not a bad statement)."""
    original = exc.orig if isinstance(exc, DBAPIError) else exc
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return True
    return isinstance(original, psycopg2.OperationalError | psycopg2.InterfaceError) and not (
        isinstance(original, psycopg2.extensions.QueryCanceledError)
    )


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ServiceError)
    async def _service_error(_: Request, exc: ServiceError) -> JSONResponse:
        return service_error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        if exc.errors() and all(e.get("type") == RULE for e in exc.errors()):
            return _broken_rule(exc.errors()[0])
        errors = [
            {"loc": list(e.get("loc", ())), "msg": e.get("msg", ""), "type": e.get("type", "")}
            for e in exc.errors()
        ]
        if any(e["type"] == "json_invalid" for e in errors):
            return error_response(
                400, "malformed_json", "the request body is not valid JSON", errors
            )
        return error_response(
            422, "validation_error", "the request does not match the schema", errors
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = _HTTP_CODES.get(exc.status_code, "error")
        headers = exc.headers
        if exc.status_code == 405:  # the router names one route's methods: name the path's
            headers = {**(headers or {}), "Allow": ", ".join(allowed_methods(app, request))}
        return error_response(exc.status_code, code, str(exc.detail), headers=headers)

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        if _database_away(exc):  # a restart or failover of Postgres: worth a retry
            log.warning("database unavailable: %s", str(exc).splitlines()[0] if str(exc) else exc)
            return error_response(
                503,
                "database_unavailable",
                "the catalog database is unavailable; retry shortly",
                headers={"Retry-After": str(RETRY_AFTER_S)},
            )
        log.exception("unhandled error")
        return error_response(500, "internal", "internal error", {"type": type(exc).__name__})


def _broken_rule(error: Any) -> JSONResponse:
    """A request model's rule (``service.api.rules``), answered as the service's own
    checks answer: 422 ``invalid`` naming the field."""
    ctx = error.get("ctx") or {}
    field = ctx.get("field") or _field_path(error.get("loc", ()))
    return error_response(422, RULE, ctx.get("message") or error.get("msg", ""), {"field": field})


def _field_path(loc: Any) -> str:
    """``("body", "columns", 0, "name")`` as ``columns[0].name``."""
    out = ""
    for part in list(loc)[1:]:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def allowed_methods(app: FastAPI, request: Request) -> list[str]:
    """The methods the routes of the request's path take (those of the document)."""
    methods: set[str] = set()
    for route in app.router.routes:
        if isinstance(route, APIRoute) and route.matches(request.scope)[0] != Match.NONE:
            methods |= route.methods
    return sorted(methods)


def document_unavailable(app: FastAPI, without_database: frozenset[str]) -> None:
    """Every operation but those of ``without_database`` (operation ids) may answer 503
    ``database_unavailable`` with ``Retry-After``: say so in the document."""
    base: Callable[[], dict[str, Any]] = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        doc = base()
        for operations in doc.get("paths", {}).values():
            for op in operations.values():
                if op.get("operationId") not in without_database:
                    # a copy each: a shared object would be a YAML alias in openapi.yaml
                    op["responses"].setdefault("503", copy.deepcopy(_UNAVAILABLE))
        return doc

    app.openapi = openapi  # type: ignore[method-assign]


_UNAVAILABLE = {
    "description": UNAVAILABLE_DESCRIPTION,
    "headers": {
        "Retry-After": {
            "description": "seconds to wait before a retry",
            "schema": {"type": "integer", "minimum": 0},
        }
    },
    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}},
}
