"""/v1/workers: the protocol between the control plane and the workers.

The pydantic models here are the HTTP edge only: they bound and document the requests,
which are decoded into the protocol's own types (``backfill_core.protocol``) once, here
(``_decoded``); the meta takes and gives those, and the answers are their ``to_json``.
``EDGE_MODELS`` pairs each model with its type (a unit test keeps their fields the same).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query, Response
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, Field

from backfill_core import protocol
from backfill_core.protocol import ErrorCode
from service.api.bodies import RawBody, parse_body, raw_body_openapi
from service.api.claimed import TaskStateJson
from service.api.deps import get_ctx
from service.api.errors import ERROR_RESPONSES, ErrorResponse
from service.api.limits import MAX_BIGINT, MAX_INT32, RequestBody
from service.context import ServiceContext
from service.db import json_text
from service.embedded_pg import to_libpq_url
from service.meta import creating, exports, imports, workers


def _coded(what: str, *codes: ErrorCode) -> dict[str, Any]:
    """An error response whose ``code`` is one of the protocol's: workers branch on it."""
    listed = ", ".join(f"`{c}`" for c in codes)
    return {"model": ErrorResponse, "description": f"{what} (`code`: {listed})"}


router = APIRouter(
    prefix="/v1/workers",
    tags=["internal"],
    responses=ERROR_RESPONSES
    | {
        404: _coded("No such worker", ErrorCode.UNKNOWN_WORKER),
        409: _coded(
            "A collect refused",
            ErrorCode.STALE_COLLECT,
            ErrorCode.STALE_BARRIER,
            ErrorCode.ACTOR_NOT_ASSIGNED,
        ),
        410: _coded("Worker declared dead or stopped: register again", ErrorCode.WORKER_GONE),
    },
)
Ctx = Annotated[ServiceContext, Depends(get_ctx)]
# workers only, not the API's users: generators that honour `x-internal` (openapi-generator)
# leave these operations out of a generated client
INTERNAL: dict[str, Any] = {"x-internal": True}


class RegisterRequest(RequestBody):
    name: str = Field(min_length=1, max_length=200)
    capacity: int = Field(default=4, ge=1, le=1024, description="actors it can run")


class Registration(BaseModel):
    worker_id: int
    lease_ms: int
    database_url: str = Field(description="where the worker reads and writes the state store")


class BarrierMessage(BaseModel):
    prev: int
    curr: int
    kind: Literal["initial", "barrier", "checkpoint"]
    mutation: dict[str, Any] | None = None
    upstream_epoch: int | None = Field(
        default=None,
        description="creating graphs: the upstream's committed epoch when it was injected",
    )
    source_ranges: dict[str, list[int]] | None = Field(
        default=None,
        description="jobs reading a source: split -> [start, end) offsets of the source's "
        "messages in the epoch this barrier opens",
    )


class ActorAssignment(BaseModel):
    actor_id: int
    job_id: int
    graph_id: int
    recovery_seq: int
    vnodes: list[list[int]]
    splits: list[Any]
    job: dict[str, Any]
    barriers: list[BarrierMessage]
    restore: dict[str, Any] | None = Field(
        default=None,
        description="committed progress, sent with an actor's first or initial barrier",
    )


class PollResponse(BaseModel):
    worker_id: int
    lease_ms: int
    assignments: list[ActorAssignment]


class CollectRequest(RequestBody):
    actor_id: int = Field(ge=0, le=MAX_INT32)
    recovery_seq: int = Field(
        ge=0,
        le=MAX_INT32,
        description="The graph's recovery sequence in the assignment the barrier came "
        "with: a recovery may hand out the same epochs again, so the epochs alone do "
        "not tell a collect of the current incarnation from a late one of an earlier "
        "incarnation, which is refused as stale",
    )
    prev_epoch: int = Field(ge=0, le=MAX_BIGINT)
    curr_epoch: int = Field(ge=1, le=MAX_BIGINT)
    progress: dict[str, Any] | None = None
    rows: int = Field(default=0, ge=0, le=MAX_BIGINT)
    finished: bool = False


class CollectResponse(BaseModel):
    status: Literal["accepted", "duplicate"]
    committed_epoch: int


class CollectBatch(RequestBody):
    collects: list[CollectRequest] = Field(min_length=1, max_length=1000)


# collect bodies are parsed on the request's thread, not the event loop (api.bodies)
RAW_BODY_MODELS: list[type[BaseModel]] = [CollectRequest, CollectBatch]


class CollectBatchResponse(BaseModel):
    results: list[CollectResponse]


class FailureReport(RequestBody):
    actor_id: int | None = Field(default=None, ge=0, le=MAX_INT32)
    message: str = Field(max_length=10_000)
    cause_actor_id: int | None = Field(
        default=None,
        ge=0,
        le=MAX_INT32,
        description="the actor whose work raised: the failure counts against its job",
    )
    fatal: bool = Field(default=False, description="true: the job fails at once")


# each edge model and the protocol's type it is decoded into (or encoded from)
EDGE_MODELS: dict[type[BaseModel], type] = {
    RegisterRequest: protocol.RegisterRequest,
    Registration: protocol.Registration,
    BarrierMessage: protocol.BarrierMessage,
    ActorAssignment: protocol.Assignment,
    PollResponse: protocol.PollAnswer,
    CollectRequest: protocol.CollectRequest,
    CollectResponse: protocol.CollectAnswer,
    CollectBatch: protocol.CollectBatch,
    CollectBatchResponse: protocol.CollectBatchAnswer,
    FailureReport: protocol.FailureReport,
}


def _decoded(item: CollectRequest, loc: tuple[str | int, ...]) -> protocol.CollectRequest:
    """A collect in the protocol's type: its progress, free-form JSON to the edge model,
    decoded (a 422 when it is not the protocol's)."""
    try:
        progress = (
            None if item.progress is None else protocol.CollectProgress.from_json(item.progress)
        )
    except protocol.MalformedMessage as e:
        raise RequestValidationError(
            [
                {
                    "type": "value_error",
                    "loc": ("body", *loc, "progress"),
                    "msg": f"not an actor's progress: {e}",
                    "input": None,
                }
            ]
        ) from None
    return protocol.CollectRequest(
        item.actor_id,
        item.recovery_seq,
        item.prev_epoch,
        item.curr_epoch,
        progress,
        item.rows,
        item.finished,
    )


def _json(answer: Any, status_code: int = 200) -> Response:
    """A protocol type's JSON as the answer (pydantic's encoder, in Rust)."""
    return Response(json_text(answer.to_json()), status_code, media_type="application/json")


@router.post(
    "",
    status_code=201,
    response_model=Registration,
    operation_id="registerWorker",
    openapi_extra=INTERNAL,
)
def register(body: RegisterRequest, ctx: Ctx) -> Response:
    request = protocol.RegisterRequest(body.name, body.capacity)
    w = workers.register(ctx.db, request.name, request.capacity, ctx.settings.worker_lease_ms)
    # the workers' own role when one is configured (docs/operations.md), else ours
    worker_url = ctx.settings.worker_database_url
    url = to_libpq_url(worker_url) if worker_url else ctx.db.libpq_url
    return _json(protocol.Registration(w.id, ctx.settings.worker_lease_ms, url), 201)


@router.post(
    "/{worker_id}/heartbeat",
    status_code=204,
    response_class=Response,
    operation_id="sendWorkerHeartbeat",
    openapi_extra=INTERNAL,
)
def heartbeat(worker_id: int, ctx: Ctx) -> Response:
    workers.heartbeat(ctx.db, worker_id, ctx.settings.worker_lease_ms)
    return Response(status_code=204)


@router.delete(
    "/{worker_id}",
    status_code=204,
    response_class=Response,
    operation_id="deregisterWorker",
    openapi_extra=INTERNAL,
)
def deregister(worker_id: int, ctx: Ctx) -> Response:
    workers.deregister(ctx.db, worker_id)
    return Response(status_code=204)


@router.get(
    "/{worker_id}/barriers",
    response_model=PollResponse,
    operation_id="pollBarriers",
    openapi_extra=INTERNAL,
)
def poll(
    worker_id: int,
    ctx: Ctx,
    timeout_ms: Annotated[int, Query(ge=0, le=60_000)] = 5_000,
    barrier_wanted: Annotated[
        bool,
        Query(
            description="the worker's actors read everything they had to: the barrier "
            "that reports it is wanted now, not at the interval"
        ),
    ] = False,
) -> Response:
    if barrier_wanted:
        ctx.signal.request_barrier()
    r = workers.poll(ctx.db, worker_id, ctx.settings.worker_lease_ms, timeout_ms, signal=ctx.signal)
    # built from the catalog's own rows, so not validated against the response model: an
    # answer carries every actor's job (its JSON built once per job), ten times a second
    return _json(r)


@router.post(
    "/{worker_id}/collect",
    response_model=CollectResponse,
    openapi_extra=raw_body_openapi(CollectRequest) | INTERNAL,
    operation_id="collectBarrier",
)
def collect(worker_id: int, raw: RawBody, ctx: Ctx) -> Response:
    [r] = _collect(ctx, worker_id, [_decoded(parse_body(CollectRequest, raw), ())])
    return _json(r)


@router.post(
    "/{worker_id}/collects",
    response_model=CollectBatchResponse,
    openapi_extra=raw_body_openapi(CollectBatch) | INTERNAL,
    operation_id="collectBarrierBatch",
)
def collect_batch(worker_id: int, raw: RawBody, ctx: Ctx) -> Response:
    """Several collects in one request and one transaction (all or nothing)."""
    body = parse_body(CollectBatch, raw)
    batch = protocol.CollectBatch(
        [_decoded(c, ("collects", i)) for i, c in enumerate(body.collects)]
    )
    return _json(protocol.CollectBatchAnswer(_collect(ctx, worker_id, batch.collects)))


def _collect(
    ctx: ServiceContext, worker_id: int, items: list[protocol.CollectRequest]
) -> list[protocol.CollectAnswer]:
    results = workers.collect(ctx.db, worker_id, items)
    ctx.signal.notify()  # a commit may release barriers to downstream actors
    wanted = frozenset().union(
        *(creating.rounds_wanted(i.progress.report) for i in items if i.progress)
    )
    read = [i.actor_id for i in items if i.progress and creating.snapshot_read(i.progress.report)]
    if read and creating.phase1_over(ctx.db, read):
        wanted |= {"creating"}  # phase 2 may start
    if wanted:
        ctx.signal.request_barrier(wanted)
    return [
        protocol.CollectAnswer(protocol.CollectStatus(r.status), r.committed_epoch) for r in results
    ]


@router.post(
    "/{worker_id}/failures",
    status_code=202,
    response_class=Response,
    operation_id="reportFailure",
    openapi_extra=INTERNAL,
)
def report_failure(worker_id: int, body: FailureReport, ctx: Ctx) -> Response:
    report = protocol.FailureReport(body.message, body.actor_id, body.cause_actor_id, body.fatal)
    workers.report_failure(ctx.db, worker_id, report, ctx.settings, ctx.clock())
    return Response(status_code=202)


# the members every claimed task and every report starts with (protocol.ClaimedTask,
# protocol.TaskReport); no docstring: it would describe each model in the document
class ClaimedTask(BaseModel):
    id: int
    relation: str
    storage_table: str
    table_schema: dict[str, Any]


class TaskReport(RequestBody):
    state: Literal["running", "succeeded", "failed", "cancelled"]
    rows: int | None = Field(default=None, ge=0, le=MAX_BIGINT)
    error: str | None = Field(default=None, max_length=10_000)


class ExportTask(ClaimedTask):
    epoch: int
    format: str
    path: str


class ExportReport(TaskReport):
    pass


class ExportReportAnswer(BaseModel):
    state: TaskStateJson


EDGE_MODELS |= {
    ExportTask: protocol.ExportTask,
    ExportReport: protocol.ExportReport,
    ExportReportAnswer: protocol.ExportReportAnswer,
}


@router.post(
    "/{worker_id}/exports/claim",
    response_model=ExportTask,
    responses={204: {"description": "No export is queued"}},
    operation_id="claimExport",
    openapi_extra=INTERNAL,
)
def claim_export(worker_id: int, ctx: Ctx) -> Response:
    task = exports.claim(ctx.db, worker_id)
    return Response(status_code=204) if task is None else _json(task)


@router.post(
    "/{worker_id}/exports/{export_id}",
    response_model=ExportReportAnswer,
    operation_id="reportExport",
    openapi_extra=INTERNAL,
)
def report_export(worker_id: int, export_id: int, body: ExportReport, ctx: Ctx) -> Response:
    report = protocol.ExportReport(protocol.ExportState(body.state), body.rows, body.error)
    return _json(exports.report(ctx.db, worker_id, export_id, report))


class ImportTask(ClaimedTask):
    format: str
    path: str
    staging_table: str


class ImportReport(TaskReport):
    error_code: str | None = Field(default=None, max_length=100)
    details: dict[str, Any] = Field(default_factory=dict)


class ImportReportAnswer(BaseModel):
    state: TaskStateJson
    error: str | None = None


EDGE_MODELS |= {
    ImportTask: protocol.ImportTask,
    ImportReport: protocol.ImportReport,
    ImportReportAnswer: protocol.ImportReportAnswer,
}


@router.post(
    "/{worker_id}/imports/claim",
    response_model=ImportTask,
    responses={204: {"description": "No import is queued"}},
    operation_id="claimImport",
    openapi_extra=INTERNAL,
)
def claim_import(worker_id: int, ctx: Ctx) -> Response:
    task = imports.claim(ctx.db, worker_id)
    return Response(status_code=204) if task is None else _json(task)


@router.post(
    "/{worker_id}/imports/{import_id}",
    response_model=ImportReportAnswer,
    operation_id="reportImport",
    openapi_extra=INTERNAL,
)
def report_import(worker_id: int, import_id: int, body: ImportReport, ctx: Ctx) -> Response:
    """``succeeded``: the rows are staged; the answer comes once they are published."""
    report = protocol.ImportReport(
        protocol.ImportState(body.state), body.rows, body.error, body.error_code, body.details
    )
    answer = imports.report(
        ctx.db, worker_id, import_id, report, ctx.clock, ctx.settings.barrier_interval_ms
    )
    if answer.state is protocol.ImportState.SUCCEEDED:
        ctx.signal.notify()
    return _json(answer)
