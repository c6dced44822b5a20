"""``GET /v1/tables/{name}/changes``: a relation's change feed (docs/reading.md), as
newline-delimited JSON or Server-Sent Events as the client's ``Accept`` asks.

Each epoch with changes gives its net changes, then its marker; a piece read ends with
a marker at the committed epoch, so a client resuming ``after`` its last marker (or, for
SSE, with ``Last-Event-ID``: markers carry the epoch as their id) misses and repeats
nothing. ``follow=true`` polls for epochs committed since, as the event streams do.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import StreamingResponse
from pydantic import TypeAdapter, ValidationError, WithJsonSchema

from service.api.deps import get_ctx
from service.api.epochs import EpochAfterQuery
from service.api.errors import ERROR_RESPONSES
from service.api.event_hub import POLL_S
from service.api.events import KEEPALIVE_S
from service.context import ServiceContext
from service.errors import BadRequest, Conflict, Gone, NotFound
from service.usecases.changes import EPOCHS_PER_PIECE, EpochChanges, FeedPiece, read_feed

router = APIRouter(prefix="/v1/tables", tags=["tables"], responses=ERROR_RESPONSES)
Ctx = Annotated[ServiceContext, Depends(get_ctx)]

NDJSON, SSE = "application/x-ndjson", "text/event-stream"
_EPOCH = TypeAdapter(EpochAfterQuery)
FEED_RESPONSE = {
    200: {
        "description": 'each epoch\'s net changes (`{"op": "insert"|"update"|"delete", '
        '"row": {...}}`, an update with `old` too), then its marker (`{"epoch": "..."}`); '
        "NDJSON lines, or SSE events named by `op` and `epoch` (markers carry the epoch as id)",
        "content": {NDJSON: {"schema": {"type": "string"}}, SSE: {"schema": {"type": "string"}}},
    },
    410: ERROR_RESPONSES[404] | {"description": "The epoch was garbage-collected"},
}


def _ndjson(piece: FeedPiece, last: int) -> tuple[str, int]:
    lines = []
    for e in piece.epochs:
        lines += [json.dumps(c) for c in e.changes]
        lines.append(json.dumps({"epoch": str(e.epoch)}))
        last = e.epoch
    return "".join(line + "\n" for line in lines), last


def _sse(piece: FeedPiece, last: int) -> tuple[str, int]:
    out = []
    for e in piece.epochs:
        for c in e.changes:
            data = {k: v for k, v in c.items() if k != "op"}
            out.append(f"event: {c['op']}\ndata: {json.dumps(data)}\n\n")
        out.append(f"id: {e.epoch}\nevent: epoch\ndata: {json.dumps({'epoch': str(e.epoch)})}\n\n")
        last = e.epoch
    return "".join(out), last


def _marked_up_to_committed(piece: FeedPiece) -> FeedPiece:
    """The piece, ending with a marker at the committed epoch (one without changes when
    none reached it): a client resuming there skips the epochs read to no effect."""
    if piece.epochs and piece.epochs[-1].epoch == piece.committed:
        return piece
    return FeedPiece([*piece.epochs, EpochChanges(piece.committed, [])], piece.committed)


async def _stream(
    request: Request,
    ctx: ServiceContext,
    name: str,
    first: FeedPiece,
    after: int,
    follow: bool,
    fmt: Callable[[FeedPiece, int], tuple[str, int]],
) -> AsyncIterator[str]:
    piece, last, quiet, marked = first, after, 0.0, False
    while True:
        more = len(piece.epochs) == EPOCHS_PER_PIECE  # a backlog: read on at once
        # a marker at the committed epoch ends a piece read without following, starts a
        # followed stream, and keeps one alive that has no changes to send
        if not more and (not follow or not marked or quiet >= KEEPALIVE_S):
            if piece.committed > last or not marked:
                piece = _marked_up_to_committed(piece)
            quiet = 0.0
        text, last = fmt(piece, last)
        if piece.epochs:
            marked, quiet = True, 0.0
            yield text
        if not more:
            if not follow or await request.is_disconnected():
                return
            await asyncio.sleep(POLL_S)
            quiet += POLL_S
        try:
            piece = await run_in_threadpool(read_feed, ctx.db, name, last)
        except Conflict:
            # ``last`` above the committed epoch: a view whose snapshot backfill merged
            # into the main graph, behind its creating graph: wait for it to catch up
            piece = FeedPiece([], last)
        except (NotFound, Gone):
            return  # dropped, or collected past ``last``: a client's retry gets the 4xx


def _after(after: int | None, last_event_id: str | None) -> int | None:
    """``Last-Event-ID`` (an SSE client reconnecting) wins over ``after``."""
    if last_event_id is None:
        return after
    try:
        return int(_EPOCH.validate_python(last_event_id))
    except ValidationError:
        raise BadRequest(
            "Last-Event-ID must be an epoch: a decimal string of 1 to 19 digits",
            {"field": "Last-Event-ID"},
        ) from None


@router.get(
    "/{name}/changes",
    response_class=StreamingResponse,
    responses=FEED_RESPONSE,
    operation_id="streamTableChanges",
)
def table_changes(
    name: str,
    request: Request,
    ctx: Ctx,
    after: Annotated[
        EpochAfterQuery | None,
        Query(
            description="the last marker's epoch read (0: from the start, if not collected); "
            "default: the latest committed epoch",
        ),
    ] = None,
    follow: Annotated[bool, Query(description="keep the stream open for new epochs")] = False,
    accept: Annotated[str | None, Header()] = None,
    last_event_id: Annotated[
        str | None,
        Header(
            description="the last marker's epoch (an SSE client reconnecting; wins over `after`)"
        ),
        WithJsonSchema({"type": "string", "pattern": "^[0-9]{1,19}$"}),
    ] = None,
) -> StreamingResponse:
    start = _after(after, last_event_id)
    first = read_feed(ctx.db, name, start)  # 404, 409 and 410 before the stream starts
    begin = first.committed if start is None else start
    sse = SSE in (accept or "")
    fmt: Any = _sse if sse else _ndjson
    gen = _stream(request, ctx, name, first, begin, follow, fmt)
    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return StreamingResponse(gen, media_type=SSE if sse else NDJSON, headers=headers)
