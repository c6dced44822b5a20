"""A request id per HTTP request (the client's ``X-Request-ID`` if it is a sane one, else
a new one), echoed in the response and put, with the job or worker the path names, on
every log line of the request (``service/logs.py``)."""

from __future__ import annotations

import re
import uuid

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.logs import set_log_context

HEADER = b"x-request-id"
_SANE = re.compile(rb"^[A-Za-z0-9._:-]{1,64}$")
_PATH_IDS = re.compile(r"^/v1/(jobs|workers)/(\d+)")


class RequestIds:
    """Pure ASGI middleware: the context it sets is the request's own (one task each)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = dict(scope["headers"]).get(HEADER, b"")
        request_id = given.decode() if _SANE.match(given) else uuid.uuid4().hex[:16]
        ids: dict[str, object] = {"request_id": request_id}
        named = _PATH_IDS.match(scope.get("path", ""))
        if named:
            ids["job_id" if named[1] == "jobs" else "worker_id"] = int(named[2])
        set_log_context(**ids)

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message.setdefault("headers", [])
                message["headers"] = [*message["headers"], (HEADER, request_id.encode())]
            await send(message)

        await self.app(scope, receive, send_with_id)
