"""Limits on what a request may carry, checked before anything is parsed or stored.

* ``BodySizeLimit``: a body over ``max_body_bytes`` is a 413 ``payload_too_large``, from
  its ``Content-Length`` before a byte is read, or once a chunked body grows past it.
* ``RequestBody``: the base of every JSON request model: no unknown fields, and no text
  Postgres cannot store (the NUL character, lone surrogates) anywhere in the body, in
  keys or values, so such input is a 422 and never a database error.
* ``reject_unknown_query``: a query parameter the route does not take is a 422.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Annotated, Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationInfo, model_validator
from pydantic_core import PydanticCustomError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.api.errors import service_error_response
from service.errors import BadRequest, PayloadTooLarge, ServiceError

MAX_INT32 = 2**31 - 1  # rate limits and the like are Postgres integers
MAX_BIGINT = 2**63 - 1  # epochs and offsets
# the error type of text Postgres cannot store: refused in any value of any body, which
# a JSON schema of free-form values (a DML row, a filter's value) does not say
UNSTORABLE_TEXT = "unstorable_text"
# validation context of a body whose raw bytes showed no escape of such text
# (``service.api.bodies``): the check of the parsed data is skipped
TEXT_CHECKED = {"text_checked": True}


def _bad_text(value: str) -> str | None:
    if "\x00" in value:
        return "the NUL character"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "a lone surrogate"
    return None


def check_text(data: Any) -> None:
    """Raise ValueError naming the first string (key or value) Postgres cannot store."""
    try:
        escaped = json.dumps(data)  # ASCII: every NUL and surrogate becomes an escape
    except (TypeError, ValueError):
        escaped = None  # not plain JSON data: look at every value
    if escaped is not None and "\\u0000" not in escaped and "\\ud" not in escaped:
        return  # the fast path (in C) for the bodies workers send many times a second
    todo: list[tuple[Any, str]] = [(data, "body")]
    while todo:
        value, path = todo.pop()
        if isinstance(value, str):
            why = _bad_text(value)
            if why:
                raise ValueError(f"{path}: text may not contain {why}")
        elif isinstance(value, dict):
            for k, v in value.items():
                if isinstance(k, str) and (why := _bad_text(k)):
                    raise ValueError(f"{path}: a key may not contain {why}")
                todo.append((v, f"{path}.{k}"))
        elif isinstance(value, list):
            todo.extend((v, f"{path}[{i}]") for i, v in enumerate(value))


# request bodies and their parts take JSON's types as the schema publishes them: no
# true for an integer, no 0 for a boolean, no number for a string
STRICT = ConfigDict(extra="forbid", strict=True)


def _integral(value: Any) -> Any:
    return int(value) if isinstance(value, float) and value.is_integer() else value


def integer(ge: int, le: int) -> Any:
    """An integer of a request body in ``ge..le``, as JSON Schema reads one: ``4.0`` is 4
    (a strict ``int`` would refuse it, and a client or a generator may well send it). The
    bounds go with the type: on the field, beside a validator, they leave the schema."""
    return Annotated[int, Field(ge=ge, le=le), BeforeValidator(_integral)]


class RequestBody(BaseModel):
    model_config = STRICT

    @model_validator(mode="before")
    @classmethod
    def _storable_text(cls, data: Any, info: ValidationInfo) -> Any:
        if not (info.context or {}).get("text_checked"):
            try:
                check_text(data)
            except ValueError as e:
                raise PydanticCustomError(
                    UNSTORABLE_TEXT, "{message}", {"message": str(e)}
                ) from None
        return data


class BodySizeLimit:
    """Pure ASGI middleware: refuse request bodies over ``max_bytes`` with a 413.

    A request that ``streamed(scope)`` names (a bulk DML body) is not read here: it may
    be as large as ``streamed_max_bytes``, and its route reads it as it comes; past the
    limit, reading it raises the 413."""

    def __init__(
        self,
        app: ASGIApp,
        max_bytes: int,
        streamed_max_bytes: int = 0,
        streamed: Callable[[Scope], bool] | None = None,
    ) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.streamed_max_bytes = streamed_max_bytes
        self.streamed = streamed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        streamed = self.streamed is not None and self.streamed(scope)
        limit = self.streamed_max_bytes if streamed else self.max_bytes
        length = headers.get(b"content-length")
        if length is not None:
            try:
                declared = int(length)
            except ValueError:
                await self._refuse(scope, receive, send, BadRequest("invalid Content-Length"))
                return
            if declared > limit:
                await self._refuse(scope, receive, send, self._too_large(limit))
                return
        if streamed:
            await self.app(scope, self._counted(receive, limit), send)
            return
        # read the body here (a chunked one has no length to check), then hand it on
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                break  # the client went away: let the app see that
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await self._refuse(scope, receive, send, self._too_large(self.max_bytes))
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                message = {"type": "http.request", "body": b"".join(chunks), "more_body": False}
                break
        first: list[Message] = [message]

        async def replay() -> Message:
            return first.pop() if first else await receive()

        await self.app(scope, replay, send)

    def _counted(self, receive: Receive, limit: int) -> Receive:
        """``receive`` that raises the 413 once the body grows past ``limit``."""
        size = 0

        async def counted() -> Message:
            nonlocal size
            message = await receive()
            if message["type"] == "http.request":
                size += len(message.get("body", b""))
                if size > limit:
                    raise self._too_large(limit)
            return message

        return counted

    @staticmethod
    def _too_large(limit: int) -> PayloadTooLarge:
        return PayloadTooLarge(
            f"the request body is larger than {limit} bytes",
            {"max_bytes": limit},
            headers={"Connection": "close"},  # the rest of the body is not read
        )

    @staticmethod
    async def _refuse(scope: Scope, receive: Receive, send: Send, exc: ServiceError) -> None:
        response = service_error_response(exc)
        response.headers["Connection"] = "close"  # the rest of the body is not read
        await response(scope, receive, send)


def _query_names(dependant: Any) -> Iterator[str]:
    """The query parameters of a route's dependency tree (FastAPI's ``Dependant``)."""
    yield from (p.alias for p in dependant.query_params)
    for sub in dependant.dependencies:
        yield from _query_names(sub)


async def reject_unknown_query(request: Request) -> None:
    """A query parameter the route does not take is a 422, as an unknown body field is:
    a misspelt filter (``?stat=creating``) must not silently mean no filter."""
    route = request.scope.get("route")
    dependant = getattr(route, "dependant", None)
    if dependant is None or not request.query_params:
        return
    # walked only for requests with a query (few); a cache keyed by id(route) could
    # outlive its route (apps come and go in one process) and answer for another
    known = frozenset(_query_names(dependant))
    unknown = [k for k in request.query_params if k not in known]
    if unknown:
        raise RequestValidationError(
            [
                {
                    "type": "extra_forbidden",
                    "loc": ("query", name),
                    "msg": "Extra inputs are not permitted",
                    "input": request.query_params[name],
                }
                for name in unknown
            ]
        )
