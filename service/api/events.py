"""Job events as Server-Sent Events: ``GET /v1/events`` and ``GET /v1/jobs/{id}/events``.

Events are stored, so a client that reconnects with ``Last-Event-ID`` (or ``?after=``)
gets exactly what it missed. ``follow=false`` sends what exists and ends the stream.
Epochs in the data (``epoch``, ``..._epoch``) are decimal strings (``service.api.epochs``).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Annotated

from fastapi import APIRouter, Depends, Header, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import StreamingResponse
from pydantic import WithJsonSchema

from service.api.deps import get_ctx
from service.api.errors import ERROR_RESPONSES
from service.api.event_hub import EventHub, Sent
from service.api.event_schemas import EVENT_SCHEMA
from service.catalog import events
from service.context import ServiceContext
from service.errors import BadRequest
from service.usecases import jobs

router = APIRouter(tags=["events"], responses=ERROR_RESPONSES)
Ctx = Annotated[ServiceContext, Depends(get_ctx)]

KEEPALIVE_S = 15.0
SSE_RESPONSE = {
    200: {
        "description": "a text/event-stream of events: `id`, `event` (the kind), `data` "
        "(JSON; epochs as decimal strings). The schema is one event's: a branch per kind, "
        "its `data` the JSON of the kind's model (`JobCreatedEvent`, `PausedEvent`, ...)",
        "content": {"text/event-stream": {"schema": EVENT_SCHEMA}},
    }
}

TOO_MANY_STREAMS = {
    429: ERROR_RESPONSES[404]
    | {
        "description": "too many event streams are open for this token (`too_many_streams`); "
        "`Retry-After` says when to try again",
        "headers": {"Retry-After": {"schema": {"type": "integer"}}},
    }
}


def _start(after: int | None, last_event_id: str | None) -> int:
    if last_event_id is not None:
        try:
            value = int(last_event_id)
        except ValueError:
            raise BadRequest(
                "Last-Event-ID must be an event id", {"field": "Last-Event-ID"}
            ) from None
        if value < 0:
            raise BadRequest("Last-Event-ID must be an event id", {"field": "Last-Event-ID"})
        return value
    return after or 0


async def _stream(
    request: Request, ctx: ServiceContext, start: int, job_id: int | None, follow: bool
) -> AsyncIterator[str]:
    """What exists after ``start``, read from the database; then, following, new events
    from the process's hub (``service/api/event_hub.py``), not a poll of its own."""
    last = start
    yield "retry: 2000\n\n"
    hub: EventHub = request.app.state.event_hub
    quiet_since = time.monotonic()
    while True:
        batch = hub.since(last, job_id) if follow else None
        if batch is None:
            batch = [
                Sent.of(e) for e in await run_in_threadpool(events.after, ctx.db, last, job_id)
            ]
        if batch:
            # one write for the batch (the hub's events were formatted once for every stream)
            yield "".join(sent.text for sent in batch)
            last = batch[-1].id
            quiet_since = time.monotonic()
            continue
        if not follow:
            return
        # no look at the connection here: the response ends this generator when the
        # client goes (docs/architecture.md, Events); a look by each stream every second
        # was a thousand wakes a second, each costing more than sending an event
        await hub.wait(max(0.0, quiet_since + KEEPALIVE_S - time.monotonic()))
        if time.monotonic() - quiet_since >= KEEPALIVE_S:
            quiet_since = time.monotonic()
            yield ": keep-alive\n\n"


async def _followed(hub: EventHub, client: str, gen: AsyncIterator[str]) -> AsyncIterator[str]:
    """``gen`` counted as one of its client's open streams for as long as it runs."""
    async with hub.following(client):
        async for chunk in gen:
            yield chunk


def _client_key(request: Request) -> str:
    key = request.scope.get("state", {}).get("client_key")
    if key is None:  # authentication off: its address
        key = f"address:{request.client.host if request.client else '?'}"
    return str(key)


def _response(request: Request, gen: AsyncIterator[str], follow: bool) -> StreamingResponse:
    if follow:  # counted while it runs; refused up front past the client's cap
        hub: EventHub = request.app.state.event_hub
        client = _client_key(request)
        hub.check_cap(client)
        gen = _followed(hub, client, gen)
    return StreamingResponse(
        gen,
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


@dataclass
class StreamFrom:
    """Where a stream starts (``Last-Event-ID`` wins over ``after``, which wins over
    ``recent``) and whether it follows."""

    start: int
    follow: bool
    recent: int | None = None

    def start_for(self, ctx: ServiceContext, job_id: int | None) -> int:
        if self.recent is None:
            return self.start
        return events.before_recent(ctx.db, self.recent, job_id)


async def stream_from(
    after: Annotated[int | None, Query(ge=0, description="start after this event id")] = None,
    follow: Annotated[bool, Query(description="keep the stream open for new events")] = True,
    recent: Annotated[
        int | None,
        Query(
            ge=1,
            le=events.PAGE,
            description="start with the latest `recent` events instead of the first "
            "(a dashboard's first load); `after` and `Last-Event-ID` win over it",
        ),
    ] = None,
    last_event_id: Annotated[
        str | None,
        Header(description="an event id: resume after it (wins over `after`)"),
        WithJsonSchema({"type": "string", "pattern": "^[0-9]{1,18}$"}),
    ] = None,
) -> StreamFrom:
    given = after is not None or last_event_id is not None
    return StreamFrom(_start(after, last_event_id), follow, None if given else recent)


From = Annotated[StreamFrom, Depends(stream_from)]


@router.get(
    "/v1/events",
    response_class=StreamingResponse,
    responses=SSE_RESPONSE | TOO_MANY_STREAMS,
    operation_id="streamEvents",
)
def all_events(request: Request, ctx: Ctx, at: From) -> StreamingResponse:
    start = at.start_for(ctx, None)
    return _response(request, _stream(request, ctx, start, None, at.follow), at.follow)


@router.get(
    "/v1/jobs/{job_id}/events",
    response_class=StreamingResponse,
    responses=SSE_RESPONSE | TOO_MANY_STREAMS,
    operation_id="streamJobEvents",
)
def job_events(job_id: int, request: Request, ctx: Ctx, at: From) -> StreamingResponse:
    jobs.get_job(ctx.db, job_id)  # 404 for an unknown job, before the stream starts
    start = at.start_for(ctx, job_id)
    return _response(request, _stream(request, ctx, start, job_id, at.follow), at.follow)
