"""Bearer-token authentication and roles, enforced in one place: ``BearerAuth``.

Who may call what (``allowed_roles``):

* ``GET``/``HEAD`` of the open paths (``BACKFILL_OPEN_PATHS``, default ``/healthz
  /readyz /metrics``) and of the static files (the dashboard page and its assets, the API
  docs, which hold no data): anyone;
* below ``/v1/workers/`` (the worker protocol): ``worker`` and ``admin``;
* any other ``GET``/``HEAD`` (reads, progress, event streams): ``reader`` and ``admin``;
* everything else (creates, DML, pause, drop, ...): ``admin``.

No or an unknown token is a 401 ``unauthorized`` with ``WWW-Authenticate: Bearer``; a
known token of the wrong role is a 403 ``forbidden``. The check runs before the body is
read, so an anonymous client cannot make the service buffer or parse anything.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI
from fastapi.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Receive, Scope, Send

from service.api.errors import service_error_response
from service.catalog.tokens import ROLES, Role, TokenAuthority, hash_token
from service.errors import Forbidden, ServiceError, Unauthorized
from service.settings import Settings

PUBLIC_PATHS = frozenset(
    {"/dashboard", "/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json"}
)
PUBLIC_PREFIXES = ("/dashboard/assets/",)
WORKER_PREFIX = "/v1/workers"
READS = frozenset({"GET", "HEAD"})
SCHEME = "bearer"


def configured_tokens(settings: Settings) -> dict[Role, str]:
    """The tokens given in settings, by role."""
    out: dict[Role, str] = {}
    for role in ROLES:
        secret = getattr(settings, f"{role}_token")
        if secret is not None:
            out[role] = secret.get_secret_value()
    return out


def allowed_roles(method: str, path: str, open_paths: frozenset[str]) -> frozenset[Role] | None:
    """The roles that may make this request; None: no token needed."""
    public = path in open_paths or path in PUBLIC_PATHS or path.startswith(PUBLIC_PREFIXES)
    if public and method in READS:
        return None
    if path.startswith(WORKER_PREFIX + "/") or (path == WORKER_PREFIX and method not in READS):
        return frozenset({"worker", "admin"})
    if method in READS:
        return frozenset({"reader", "admin"})
    return frozenset({"admin"})


def bearer_token(scope: Scope) -> str | None:
    for name, value in scope["headers"]:
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").strip().partition(" ")
            token = token.strip()
            return token if scheme.lower() == SCHEME and token else None
    return None


class BearerAuth:
    """Pure ASGI middleware: authenticate, then authorize by ``allowed_roles``."""

    def __init__(self, app: ASGIApp, authority: TokenAuthority, open_paths: tuple[str, ...]):
        self.app = app
        self.authority = authority
        self.open_paths = frozenset(open_paths)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        root: str = scope.get("root_path", "")
        if root and path.startswith(root):
            path = path[len(root) :] or "/"
        roles = allowed_roles(scope["method"], path, self.open_paths)
        if roles is None:
            await self.app(scope, receive, send)
            return
        token = bearer_token(scope)
        if token is None:
            await _refuse(scope, receive, send, _unauthorized("a bearer token is required"))
            return
        token_hash = hash_token(token)
        if self.authority.due(token_hash):
            await run_in_threadpool(self.authority.reload_if_due, token_hash)
        role = self.authority.lookup(token_hash)
        if role is None:
            await _refuse(scope, receive, send, _unauthorized("the token is not valid", True))
            return
        # whom a per-client limit counts (the event streams' cap)
        scope.setdefault("state", {})["client_key"] = f"token:{token_hash[:16]}"
        if role not in roles:
            need = sorted(roles)
            exc = Forbidden(
                f"a {role} token may not do this (needs {' or '.join(need)})",
                {"role": role, "allowed": need},
            )
            await _refuse(scope, receive, send, exc)
            return
        await self.app(scope, receive, send)


def _unauthorized(message: str, invalid: bool = False) -> Unauthorized:
    challenge = 'Bearer realm="backfill"' + (', error="invalid_token"' if invalid else "")
    return Unauthorized(message, headers={"WWW-Authenticate": challenge})


async def _refuse(scope: Scope, receive: Receive, send: Send, exc: ServiceError) -> None:
    response = service_error_response(exc)
    headers = dict(scope["headers"])
    if headers.get(b"content-length", b"0") != b"0" or b"transfer-encoding" in headers:
        response.headers["Connection"] = "close"  # its body is never read
    await response(scope, receive, send)


def document_security(app: FastAPI, open_paths: tuple[str, ...]) -> None:
    """Declare the bearer scheme in the OpenAPI document: required everywhere but on the
    open paths, each secured operation documenting its 401 and 403."""
    base: Callable[[], dict[str, Any]] = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        doc = base()
        components = doc.setdefault("components", {})
        components.setdefault("securitySchemes", {})[SCHEME] = {
            "type": "http",
            "scheme": "bearer",
            "description": "an admin, reader or worker token (README, Security)",
        }
        doc["security"] = [{SCHEME: []}]
        for path, operations in doc.get("paths", {}).items():
            for method, op in operations.items():
                if allowed_roles(method.upper(), path, frozenset(open_paths)) is None:
                    op["security"] = []
                    continue
                responses = op.setdefault("responses", {})
                responses.setdefault("401", _error_response("No or unknown token"))
                responses.setdefault("403", _error_response("The token's role may not do this"))
        return doc

    app.openapi = openapi  # type: ignore[method-assign]


def _error_response(description: str) -> dict[str, Any]:
    schema = {"$ref": "#/components/schemas/ErrorResponse"}
    return {"description": description, "content": {"application/json": {"schema": schema}}}
