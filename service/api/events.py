"""Job events as Server-Sent Events: ``GET /v1/events`` and ``GET /v1/jobs/{id}/events``.

Events are stored, so a client that reconnects with ``Last-Event-ID`` (or ``?after=``)
gets exactly what it missed. ``follow=false`` sends what exists and ends the stream.
Epochs in the data (``epoch``, ``..._epoch``) are decimal strings (``service.api.epochs``).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Annotated

from fastapi import APIRouter, Depends, Header, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import StreamingResponse
from pydantic import WithJsonSchema

from service.api.deps import get_ctx
from service.api.epochs import epochs_as_text
from service.api.errors import ERROR_RESPONSES
from service.api.event_schemas import EVENT_SCHEMA
from service.catalog import events
from service.context import ServiceContext
from service.errors import BadRequest
from service.usecases import jobs

router = APIRouter(tags=["events"], responses=ERROR_RESPONSES)
Ctx = Annotated[ServiceContext, Depends(get_ctx)]

POLL_S = 0.25
KEEPALIVE_S = 15.0
SSE_RESPONSE = {
    200: {
        "description": "a text/event-stream of events: `id`, `event` (the kind), `data` "
        "(JSON; epochs as decimal strings). The schema is one event's: a branch per kind, "
        "its `data` the JSON of the kind's model (`JobCreatedEvent`, `PausedEvent`, ...)",
        "content": {"text/event-stream": {"schema": EVENT_SCHEMA}},
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
    last = start
    idle = 0.0
    yield "retry: 2000\n\n"
    while True:
        batch = await run_in_threadpool(events.after, ctx.db, last, job_id)
        for e in batch:
            # stored with integer epochs; sent as strings, as in every answer
            data = {"job_id": e.job_id, "at": e.created_at.isoformat(), **epochs_as_text(e.data)}
            yield f"id: {e.id}\nevent: {e.kind}\ndata: {json.dumps(data)}\n\n"
            last = e.id
        if batch:
            idle = 0.0
            continue
        if not follow or await request.is_disconnected():
            return
        await asyncio.sleep(POLL_S)
        idle += POLL_S
        if idle >= KEEPALIVE_S:
            idle = 0.0
            yield ": keep-alive\n\n"


def _response(gen: AsyncIterator[str]) -> StreamingResponse:
    return StreamingResponse(
        gen,
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


@dataclass
class StreamFrom:
    """Where a stream starts (``Last-Event-ID`` wins over ``after``) and whether it follows."""

    start: int
    follow: bool


def stream_from(
    after: Annotated[int | None, Query(ge=0, description="start after this event id")] = None,
    follow: Annotated[bool, Query(description="keep the stream open for new events")] = True,
    last_event_id: Annotated[
        str | None,
        Header(description="an event id: resume after it (wins over `after`)"),
        WithJsonSchema({"type": "string", "pattern": "^[0-9]{1,18}$"}),
    ] = None,
) -> StreamFrom:
    return StreamFrom(_start(after, last_event_id), follow)


From = Annotated[StreamFrom, Depends(stream_from)]


@router.get(
    "/v1/events",
    response_class=StreamingResponse,
    responses=SSE_RESPONSE,
    operation_id="streamEvents",
)
def all_events(request: Request, ctx: Ctx, at: From) -> StreamingResponse:
    return _response(_stream(request, ctx, at.start, None, at.follow))


@router.get(
    "/v1/jobs/{job_id}/events",
    response_class=StreamingResponse,
    responses=SSE_RESPONSE,
    operation_id="streamJobEvents",
)
def job_events(job_id: int, request: Request, ctx: Ctx, at: From) -> StreamingResponse:
    jobs.get_job(ctx.db, job_id)  # 404 for an unknown job, before the stream starts
    return _response(_stream(request, ctx, at.start, job_id, at.follow))
