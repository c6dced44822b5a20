"""The ``Idempotency-Key`` header of the creates (tables, sources, jobs).

A retry with the same key and the same request (method, path, canonical JSON body) gets
the first answer again, byte for byte with its status, marked ``Idempotent-Replayed:
true``, and creates nothing. The same key with another request is a 422
``idempotency_key_reused``. A retry that arrives while the first request with its key
is still running waits for that one's answer (the create is then committed, so this is
usually milliseconds) for up to ``IN_PROGRESS_WAIT_S``, then is a 409
``idempotency_key_in_progress`` with ``Retry-After`` (e.g. a foreground job that waits
for its backfill).
Errors are not remembered, so a client may fix its request and retry with the same key.
How the key and the create commit together: ``service/catalog/idempotency.py``.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

from fastapi import Depends, Header, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from service.catalog import idempotency
from service.context import ServiceContext
from service.errors import Conflict, Invalid

MAX_KEY_LENGTH = 200
KEY_PATTERN = r"^[!-~]+$"  # printable ASCII, no spaces
REPLAYED_HEADER = "Idempotent-Replayed"
IN_PROGRESS_WAIT_S = 2.0  # a retry waits this long for the first request's answer
KEY_DESCRIPTION = (
    "Makes the create safe to retry. A retry with the same key and the same request "
    "(method, path, JSON body) creates nothing and gets the first answer again (same "
    f"status and body, with `{REPLAYED_HEADER}: true`); the same key with a different "
    "request is a 422 `idempotency_key_reused`; while the first request is still "
    "running, a 409 `idempotency_key_in_progress`. Errors are not remembered. Keys are "
    "kept for `BACKFILL_IDEMPOTENCY_TTL_S` (default 24 h). Up to 200 printable ASCII "
    "characters, no spaces (a UUID is a good key)."
)

T = TypeVar("T")


@dataclass(frozen=True)
class KeyedRequest:
    key: str
    fingerprint: str
    method: str
    path: str


def fingerprint(method: str, path: str, body: bytes) -> str:
    """sha256 of the method, the path and the canonical JSON body (keys sorted, no
    spaces), so a retry that re-serializes the same document still matches."""
    try:
        canonical = json.dumps(
            json.loads(body), sort_keys=True, separators=(",", ":"), ensure_ascii=True
        ).encode()
    except (ValueError, RecursionError):
        canonical = body  # not JSON: the request fails validation anyway
    return hashlib.sha256(f"{method} {path}\n".encode() + canonical).hexdigest()


async def keyed_request(
    request: Request,
    # typed `str` (not `str | None`) so the OpenAPI schema is a plain string
    idempotency_key: Annotated[  # type: ignore[assignment]
        str,
        Header(
            alias="Idempotency-Key",
            min_length=1,
            max_length=MAX_KEY_LENGTH,
            pattern=KEY_PATTERN,
            description=KEY_DESCRIPTION,
        ),
    ] = None,
) -> KeyedRequest | None:
    if idempotency_key is None:
        return None
    method, path = request.method, request.url.path
    body = await request.body()
    return KeyedRequest(idempotency_key, fingerprint(method, path, body), method, path)


IdempotencyHeader = Annotated[KeyedRequest | None, Depends(keyed_request)]


def idempotent(
    ctx: ServiceContext,
    keyed: KeyedRequest | None,
    create: Callable[[idempotency.Claim | None], T],
    respond: Callable[[T], tuple[int, BaseModel]],
    reload: Callable[[dict[str, Any]], T],
    respond_within_s: float = 60.0,
) -> Response:
    """Run a create at most once per key: ``create`` claims the key in its transaction,
    ``respond`` renders the created object, ``reload`` finds it again from what the key
    recorded (to answer for a first request that died between its commit and its answer)."""
    if keyed is None:
        status, view = respond(create(None))
        return JSONResponse(status_code=status, content=view.model_dump(mode="json"))
    for _ in range(3):
        found = idempotency.find(ctx.db, keyed.key)
        if found is not None:
            return _replay(ctx, keyed, found, respond, reload)
        claim = idempotency.Claim(
            keyed.key,
            keyed.fingerprint,
            keyed.method,
            keyed.path,
            ctx.settings.idempotency_ttl_s,
            respond_within_s,
        )
        try:
            created = create(claim)
        except idempotency.KeyTaken:
            continue  # a concurrent request with this key committed first: replay it
        return _answer(ctx, keyed, *respond(created), replayed=False)
    raise _in_progress()


def _replay(
    ctx: ServiceContext,
    keyed: KeyedRequest,
    found: idempotency.Recorded,
    respond: Callable[[T], tuple[int, BaseModel]],
    reload: Callable[[dict[str, Any]], T],
) -> Response:
    if found.fingerprint != keyed.fingerprint:
        raise Invalid(
            "this Idempotency-Key was already used with a different request (method, path "
            "or body); use a new key for a new request",
            {"header": "Idempotency-Key"},
            code="idempotency_key_reused",
        )
    deadline = time.monotonic() + IN_PROGRESS_WAIT_S
    while found.status_code is None and not found.overdue and time.monotonic() < deadline:
        time.sleep(0.02)  # the first request usually answers within milliseconds
        found = idempotency.find(ctx.db, keyed.key) or found
    if found.status_code is not None and found.response is not None:
        return _response(found.status_code, found.response, replayed=True)
    if not found.overdue or found.resource is None:
        raise _in_progress()
    # the first request committed its create but never answered (it died): answer for it
    return _answer(ctx, keyed, *respond(reload(found.resource)), replayed=True)


def _answer(
    ctx: ServiceContext, keyed: KeyedRequest, status: int, view: BaseModel, *, replayed: bool
) -> Response:
    body = JSONResponse(content=view.model_dump(mode="json")).body
    text = bytes(body).decode()
    kept = idempotency.record(ctx.db, keyed.key, keyed.fingerprint, status, text)
    if kept.status_code is None or kept.response is None:
        return _response(status, text, replayed=replayed)
    # an earlier answer wins, so every retry sees the same one
    return _response(kept.status_code, kept.response, replayed=replayed or kept.response != text)


def _response(status: int, body: str, *, replayed: bool) -> Response:
    headers = {REPLAYED_HEADER: "true"} if replayed else None
    return Response(
        content=body, status_code=status, media_type="application/json", headers=headers
    )


def _in_progress() -> Conflict:
    return Conflict(
        "a request with this Idempotency-Key is still in progress; retry in a moment",
        {"header": "Idempotency-Key"},
        code="idempotency_key_in_progress",
        headers={"Retry-After": "1"},
    )
