"""Every error leaves the service as ``{"error": {"code", "message", "details"}}``."""

from __future__ import annotations

import json
import logging
from typing import Any

import psycopg2
import psycopg2.extensions
from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from sqlalchemy.exc import DBAPIError
from starlette.exceptions import HTTPException as StarletteHTTPException

from backfill_core.protocol import ErrorBody as ProtocolErrorBody
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
    async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = _HTTP_CODES.get(exc.status_code, "error")
        return error_response(exc.status_code, code, str(exc.detail), headers=exc.headers)

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        if _database_away(exc):  # a restart or failover of Postgres: worth a retry
            log.warning("database unavailable: %s", str(exc).splitlines()[0] if str(exc) else exc)
            return error_response(
                503,
                "database_unavailable",
                "the catalog database is unavailable; retry shortly",
                headers={"Retry-After": "1"},
            )
        log.exception("unhandled error")
        return error_response(500, "internal", "internal error", {"type": type(exc).__name__})
