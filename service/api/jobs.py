"""/v1/jobs: create materialized views with their backfill, watch, steer and verify them."""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field, model_serializer, model_validator
from pydantic_core import PydanticCustomError

from service.api.conditional import NOT_MODIFIED, conditional
from service.api.deps import get_ctx
from service.api.epochs import EpochJson, EpochQuery
from service.api.errors import EPOCH_GONE, ERROR_RESPONSES
from service.api.filters import FilterTree
from service.api.idempotency import IdempotencyHeader, idempotent
from service.api.limits import MAX_INT32, STRICT, RequestBody, integer
from service.api.rules import ColumnRef, Name, rule_error
from service.catalog import idempotency
from service.catalog.models import Job
from service.context import ServiceContext
from service.usecases import cdc, jobs, steering
from service.usecases import verify as verification
from service.usecases.jobs import MAX_PARALLELISM
from service.usecases.progress import RECENT_RECOVERIES, Phase, job_progress

router = APIRouter(prefix="/v1/jobs", tags=["jobs"], responses=ERROR_RESPONSES)
Ctx = Annotated[ServiceContext, Depends(get_ctx)]
FOREGROUND_TIMEOUT_S = 600.0
FOREGROUND_RECHECK_S = 0.25  # re-read at least this often: another replica's commits


class Upstream(BaseModel):
    model_config = STRICT
    table: str | None = Field(default=None, max_length=63, description="a table or a view")
    source: str | None = Field(default=None, max_length=63, description="a Kafka source")
    postgres: str | None = Field(
        default=None,
        description="a CDC table's job: the upstream Postgres table it mirrors (schema.table)",
    )

    @model_serializer(mode="wrap")
    def _only_the_one_given(self, handler: Any) -> dict[str, str]:
        return {k: v for k, v in handler(self).items() if v is not None}


def _one_of_table_and_source(schema: dict[str, Any]) -> None:
    """The document's ``UpstreamSpec``: a branch per kind of upstream, the other null or
    left out (one object whose two fields are optional would allow both, or none)."""
    props = schema.pop("properties")
    schema.pop("additionalProperties", None)
    schema["oneOf"] = [
        {
            "type": "object",
            "additionalProperties": False,
            "required": [key],
            "properties": {
                key: {**props[key]["anyOf"][0], "description": props[key]["description"]},
                other: {"type": "null"},
            },
        }
        for key, other in (("table", "source"), ("source", "table"))
    ]


class UpstreamSpec(BaseModel):
    """Exactly one of a table (or view) and a Kafka source."""

    model_config = ConfigDict(
        strict=True, extra="forbid", json_schema_extra=_one_of_table_and_source
    )
    table: Name | None = Field(default=None, description="a table or a view")
    source: Name | None = Field(default=None, description="a Kafka source")

    @model_validator(mode="after")
    def _exactly_one(self) -> UpstreamSpec:
        if self.table is None and self.source is None:  # what the schema refuses
            raise PydanticCustomError("missing", "give upstream.table or upstream.source")
        if self.table is not None and self.source is not None:
            raise rule_error("give exactly one of upstream.table and upstream.source")
        return self


class JobCreate(RequestBody):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "name": "big_orders",
                    "upstream": {"table": "orders"},
                    "columns": ["id", "amount"],
                    "filter": {"col": "amount", "op": ">=", "value": "100"},
                    "backfill": "snapshot",
                    "parallelism": 4,
                }
            ]
        }
    )
    name: Name = Field(examples=["big_orders"])
    upstream: UpstreamSpec
    columns: list[ColumnRef] | None = Field(
        default=None, max_length=1000, description="default: every column"
    )
    filter: FilterTree | None = None
    backfill: Literal["arrangement", "chain", "snapshot", "source", "auto"] = "auto"
    parallelism: integer(1, MAX_PARALLELISM) = 4
    rate_limit: integer(0, MAX_INT32) | None = Field(
        default=None, description="rows/s per actor; null: none, 0: paused"
    )
    background: bool = Field(default=True, description="false: answer once the job is created")


class JobPatch(RequestBody):
    rate_limit: integer(0, MAX_INT32) | None = None
    parallelism: integer(1, MAX_PARALLELISM) | None = None


class JobView(BaseModel):
    id: int
    name: str
    upstream: Upstream
    kind: str
    state: Literal["creating", "created", "failed", "cancelled"]
    paused: bool
    rate_limit: int | None
    parallelism: int
    columns: list[str]
    filter: dict[str, Any] | None
    mv_table: str | None
    committed_epoch: EpochJson
    finished_epoch: EpochJson | None
    snapshot_epoch: EpochJson | None = Field(
        description="snapshot backfill: the upstream epoch its snapshot is read at"
    )
    recovering: bool = Field(description="its graph is in recovery right now")
    waiting_for_worker: bool = Field(
        description="creating, and an actor of it has no live worker to run on (none is "
        "registered, or its worker stopped heartbeating): it goes on once one registers"
    )
    recoveries: int = Field(description="recoveries of its graph so far")
    recovery_reason: str | None
    error: str | None
    created_at: dt.datetime


class JobList(BaseModel):
    jobs: list[JobView]
    next: int | None = Field(description="pass as `after` for the next page")


class VnodeRow(BaseModel):
    vnode: int
    state: str
    position: list[Any] | None
    rows: int


class SplitRow(BaseModel):
    split: str
    state: Literal["backfilling", "source_caching_up", "finished"]
    offset: int | None = Field(description="backfilled up to here (inclusive)")
    target_offset: int | None = Field(description="the backfill ends at this offset")
    rows: int
    skipped: int = Field(
        default=0, description="messages that are not rows, skipped (`on_error: skip`)"
    )
    last_skipped_offset: int | None = Field(default=None, description="the last one's offset")


class RecoveryRow(BaseModel):
    at: dt.datetime
    reason: str | None


class FailureRow(BaseModel):
    at: dt.datetime
    actor_id: int
    epoch: EpochJson = Field(description="its graph's committed epoch then")
    message: str
    backoff_ms: int | None = Field(
        description="how long its graph's recovery waited after it; null: it failed the job"
    )


class CdcProgressView(BaseModel):
    """A CDC table's job (``kind: cdc``): its durable progress, as its worker wrote it
    with the rows (ahead of the committed epoch by at most the open one)."""

    table: str = Field(description="the CDC table")
    upstream: str = Field(description="schema.table on the upstream")
    phase: Literal["backfilling", "streaming"]
    chunks: int = Field(description="primary-key chunks read and merged")
    rows: int = Field(description="rows the chunks read")
    lsn: str = Field(description="the upstream LSN the table is exact at", examples=["0/1A2B3C"])
    confirmed_lsn: str | None = Field(
        description="what the slot confirmed: the LSN of the committed epoch"
    )
    slot_lag_bytes: int | None = Field(
        description="WAL the upstream keeps for the slot (its current LSN - confirmed)"
    )


class Progress(BaseModel):
    id: int
    state: str
    phase: Phase = Field(
        description="arrangement and chain: backfilling, forwarding; snapshot: snapshot "
        "(reading it), log_store (replaying the upstream's epochs since), finishing "
        "(caught up, merging); then done. waiting_for_worker: an actor of the job has no "
        "live worker (none is registered, or its worker stopped heartbeating)"
    )
    rows: int = Field(description="rows consumed as of the committed epoch; never goes back")
    total_estimate: int
    percent: float = Field(description="at most 99.99 until the job is created, then 100")
    rows_per_s: float = Field(description="over the last window of at least 5 s of epoch time")
    eta_s: float | None = Field(description="seconds left at the current rate (null: unknown)")
    committed_epoch: EpochJson
    snapshot_epoch: EpochJson | None = Field(
        description="snapshot backfill: the upstream epoch its snapshot is read at"
    )
    log_store_lag_ms: int | None = Field(
        description="snapshot backfill: how far the replayed epoch is behind the upstream's "
        "committed one"
    )
    log_store_lag_epochs: int | None = Field(
        description="snapshot backfill: upstream epochs committed but not replayed yet"
    )
    recent_recoveries: list[RecoveryRow] = Field(
        description=f"the job graph's latest recoveries (at most {RECENT_RECOVERIES}), newest first"
    )
    vnodes: list[VnodeRow]
    splits: list[SplitRow] = Field(description="source backfill: per Kafka partition")
    error: str | None = Field(
        default=None, description="a failed job's: the cause, the actor and the epoch"
    )
    cdc: CdcProgressView | None = Field(
        default=None, description="a CDC table's job: its chunks, LSN and slot"
    )
    failures: list[FailureRow] = Field(
        default_factory=list,
        description="the job's failed attempts since it was created or retried, oldest first",
    )


class Verification(BaseModel):
    """A job's view compared with the view of its upstream at one committed epoch."""

    epoch: EpochJson = Field(description="the committed epoch compared at")
    equal: bool
    mv_rows: int
    expected_rows: int
    missing: list[dict[str, Any]] = Field(description="a sample of the rows the view lacks")
    unexpected: list[dict[str, Any]] = Field(description="a sample of the rows it should not have")


def _upstream(ctx: ServiceContext, job: Job, names: jobs.JobNames) -> Upstream:
    if names.upstream_table or names.upstream_source:
        return Upstream(table=names.upstream_table, source=names.upstream_source)
    if job.kind == "cdc" and (mirror := cdc.progress_of_job(ctx.db, job.id)) is not None:
        return Upstream(postgres=mirror.upstream)
    return Upstream(table="")


def _view(ctx: ServiceContext, job: Job, facts: jobs.JobFacts | None = None) -> JobView:
    if facts is None:
        facts = jobs.facts_of(ctx.db, [job])[job.id]
    names, graph = facts.names, facts.graph
    return JobView(
        id=job.id,
        name=job.name,
        upstream=_upstream(ctx, job, names),
        kind=job.kind,
        state=job.state,  # type: ignore[arg-type]
        paused=job.paused,
        rate_limit=job.rate_limit,
        parallelism=job.parallelism,
        columns=job.columns,
        filter=job.filter,
        mv_table=names.mv,
        committed_epoch=graph.committed_epoch,
        finished_epoch=job.finished_epoch,
        snapshot_epoch=job.snapshot_epoch,
        recovering=graph.state == "recovering",
        waiting_for_worker=facts.waiting_for_worker,
        recoveries=graph.recovery_seq,
        recovery_reason=graph.recovery_reason,
        error=job.error,
        created_at=job.created_at,
    )


@router.post(
    "",
    status_code=202,
    response_model=JobView,
    responses={201: {"model": JobView}},
    operation_id="createJob",
)
def create_job(body: JobCreate, ctx: Ctx, keyed: IdempotencyHeader) -> Response:
    spec = jobs.JobSpec(
        name=body.name,
        upstream_table=body.upstream.table,
        upstream_source=body.upstream.source,
        columns=body.columns,
        filter=body.filter,
        backfill=body.backfill,
        parallelism=body.parallelism,
        rate_limit=body.rate_limit,
    )
    return idempotent(
        ctx,
        keyed,
        create=lambda claim: _create(ctx, spec, claim),
        respond=lambda job: _answer_create(ctx, job, body.background),
        reload=lambda ref: jobs.get_job(ctx.db, ref["job"]),
        respond_within_s=60.0 if body.background else FOREGROUND_TIMEOUT_S + 60.0,
    )


def _create(ctx: ServiceContext, spec: jobs.JobSpec, claim: idempotency.Claim | None) -> Job:
    return steering.steered(ctx.signal, jobs.create_job(ctx.db, spec, claim, ctx.signal))


def _answer_create(ctx: ServiceContext, job: Job, background: bool) -> tuple[int, JobView]:
    """202 with the creating job; in the foreground, 201 once it is created (or 202
    when that takes longer than FOREGROUND_TIMEOUT_S)."""
    if not background:
        job = jobs.await_created(
            ctx.db, ctx.signal, job, FOREGROUND_TIMEOUT_S, FOREGROUND_RECHECK_S
        )
    return (201 if job.state == "created" and not background else 202), _view(ctx, job)


@router.get("", response_model=JobList, responses=NOT_MODIFIED, operation_id="listJobs")
def list_jobs(
    ctx: Ctx,
    request: Request,
    state: Annotated[Literal["creating", "created", "failed", "cancelled"] | None, Query()] = None,
    after: Annotated[int | None, Query(ge=0, description="the `next` of the previous page")] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
    order: Annotated[
        Literal["asc", "desc"], Query(description="by creation time: oldest or newest first")
    ] = "asc",
) -> Response:
    page = jobs.list_jobs(ctx.db, state, after, limit + 1, newest_first=order == "desc")
    more = len(page) > limit
    page = page[:limit]
    facts = jobs.facts_of(ctx.db, page)
    body = JobList(
        jobs=[_view(ctx, j, facts[j.id]) for j in page], next=page[-1].id if more else None
    )
    return conditional(request, body)


@router.get("/{job_id}", response_model=JobView, responses=NOT_MODIFIED, operation_id="getJob")
def get_job(job_id: int, ctx: Ctx, request: Request) -> Response:
    return conditional(request, _view(ctx, jobs.get_job(ctx.db, job_id)))


@router.get(
    "/{job_id}/progress",
    response_model=Progress,
    responses=NOT_MODIFIED,
    operation_id="getJobProgress",
)
def progress(job_id: int, ctx: Ctx, request: Request) -> Response:
    p = job_progress(ctx.db, job_id)
    log_store = p.log_store
    body = Progress(
        id=p.job_id,
        state=p.state,
        phase=p.phase,
        rows=p.rows,
        total_estimate=p.total_estimate,
        percent=p.percent,
        rows_per_s=p.rows_per_s,
        eta_s=p.eta_s,
        committed_epoch=p.committed_epoch,
        snapshot_epoch=p.snapshot_epoch,
        log_store_lag_ms=log_store.lag_ms if log_store else None,
        log_store_lag_epochs=log_store.lag_epochs if log_store else None,
        recent_recoveries=[RecoveryRow(at=e.at, reason=e.reason) for e in p.recoveries],
        vnodes=[
            VnodeRow(vnode=r.vnode, state=r.state, position=r.current_pos, rows=r.row_count)
            for r in p.vnodes
        ],
        splits=[
            SplitRow(
                split=x.split,
                state=x.state,  # type: ignore[arg-type]
                offset=x.offset,
                target_offset=x.target_offset,
                rows=x.num_consumed_rows,
                skipped=x.skipped,
                last_skipped_offset=x.last_skipped_offset,
            )
            for x in p.splits
        ],
        error=p.error,
        failures=[
            FailureRow(
                at=dt.datetime.fromtimestamp(f.at_ms / 1000, dt.UTC),
                actor_id=f.actor_id,
                epoch=f.epoch,
                message=f.message,
                backoff_ms=f.backoff_ms,
            )
            for f in p.failures
        ],
        # a second read for a CDC table's job only: dashboards poll this route
        cdc=_cdc_progress(ctx, job_id) if p.kind == "cdc" else None,
    )
    return conditional(request, body)


def _cdc_progress(ctx: ServiceContext, job_id: int) -> CdcProgressView | None:
    row = cdc.progress_of_job(ctx.db, job_id)
    if row is None:
        return None
    return CdcProgressView(
        table=row.table_name,
        upstream=row.upstream,
        phase="streaming" if row.state == "finished" else "backfilling",
        chunks=row.chunks,
        rows=row.row_count,
        lsn=row.lsn,
        confirmed_lsn=row.confirmed_lsn,
        slot_lag_bytes=row.slot_lag_bytes,
    )


@router.post("/{job_id}/pause", response_model=JobView, operation_id="pauseJob")
def pause(job_id: int, ctx: Ctx) -> JobView:
    return _view(ctx, steering.steered(ctx.signal, steering.set_paused(ctx.db, job_id, True)))


@router.post("/{job_id}/resume", response_model=JobView, operation_id="resumeJob")
def resume(job_id: int, ctx: Ctx) -> JobView:
    return _view(ctx, steering.steered(ctx.signal, steering.set_paused(ctx.db, job_id, False)))


@router.post(
    "/{job_id}/retry",
    response_model=JobView,
    operation_id="retryJob",
    description="Start a failed job again: a snapshot backfill from its committed "
    "progress, any other from the start (409 when the job is not failed).",
)
def retry(job_id: int, ctx: Ctx) -> JobView:
    return _view(ctx, steering.steered(ctx.signal, steering.retry_job(ctx.db, job_id)))


@router.patch("/{job_id}", response_model=JobView, operation_id="updateJob")
def patch_job(job_id: int, body: JobPatch, ctx: Ctx) -> JobView:
    fields = body.model_fields_set
    job = steering.update_job(
        ctx.db, job_id, body.rate_limit, body.parallelism, "rate_limit" in fields
    )
    return _view(ctx, steering.steered(ctx.signal, job))


@router.delete("/{job_id}", status_code=204, response_class=Response, operation_id="dropJob")
def drop_job(job_id: int, ctx: Ctx) -> Response:
    steering.drop_job(ctx.db, job_id)
    return Response(status_code=204)


@router.get(
    "/{job_id}/verify",
    response_model=Verification,
    responses=EPOCH_GONE,
    operation_id="verifyJob",
)
def verify(
    job_id: int,
    ctx: Ctx,
    epoch: Annotated[
        EpochQuery | None, Query(description="default: the latest committed epoch")
    ] = None,
) -> Verification:
    return Verification.model_validate(
        verification.verify(ctx.db, job_id, epoch), from_attributes=True
    )
