"""/v1/jobs: create materialized views with their backfill, watch, steer and verify them."""

from __future__ import annotations

import datetime as dt
import time
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
from service.catalog import idempotency, jobs
from service.catalog import verify as verification
from service.catalog.jobs import MAX_PARALLELISM
from service.catalog.models import Job
from service.catalog.progress import RECENT_RECOVERIES, progress_snapshot
from service.context import ServiceContext
from service.meta.epochs import MAIN_GRAPH_ID

router = APIRouter(prefix="/v1/jobs", tags=["jobs"], responses=ERROR_RESPONSES)
Ctx = Annotated[ServiceContext, Depends(get_ctx)]
FOREGROUND_TIMEOUT_S = 600.0
FOREGROUND_RECHECK_S = 0.25
FOREGROUND_MIN_GAP_S = 0.01  # between re-reads: collects of many actors land in bursts


class Upstream(BaseModel):
    model_config = STRICT
    table: str | None = Field(default=None, max_length=63, description="a table or a view")
    source: str | None = Field(default=None, max_length=63, description="a Kafka source")

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


class RecoveryRow(BaseModel):
    at: dt.datetime
    reason: str | None


class Progress(BaseModel):
    id: int
    state: str
    phase: Literal["backfilling", "forwarding", "snapshot", "log_store", "finishing", "done"] = (
        Field(
            description="arrangement and chain: backfilling, forwarding; snapshot: snapshot "
            "(reading it), log_store (replaying the upstream's epochs since), finishing "
            "(caught up, merging); then done"
        )
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


class Verification(BaseModel):
    """A job's view compared with the view of its upstream at one committed epoch."""

    epoch: EpochJson = Field(description="the committed epoch compared at")
    equal: bool
    mv_rows: int
    expected_rows: int
    missing: list[dict[str, Any]] = Field(description="a sample of the rows the view lacks")
    unexpected: list[dict[str, Any]] = Field(description="a sample of the rows it should not have")


def _view(ctx: ServiceContext, job: Job) -> JobView:
    names = jobs.relation_names(ctx.db, job)
    graph = jobs.graph_of(ctx.db, job)
    return JobView(
        id=job.id,
        name=job.name,
        upstream=Upstream(table=names.upstream_table, source=names.upstream_source)
        if names.upstream_table or names.upstream_source
        else Upstream(table=""),
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
        create=lambda claim: _steered(ctx, _create(ctx, spec, claim)),
        respond=lambda job: _answer_create(ctx, job, body.background),
        reload=lambda ref: jobs.get_job(ctx.db, ref["job"]),
        respond_within_s=60.0 if body.background else FOREGROUND_TIMEOUT_S + 60.0,
    )


def _create(ctx: ServiceContext, spec: jobs.JobSpec, claim: idempotency.Claim | None) -> Job:
    try:
        return jobs.create_job(ctx.db, spec, claim=claim)
    except jobs.NoCommittedEpoch:
        ctx.signal.request_barrier()  # so that the client's retry finds one
        raise


def _steered(ctx: ServiceContext, job: Job) -> Job:
    """A job created, paused, resumed, throttled or rescaled: the mutation (or recovery) it
    queued rides the next round of its graph, which this process's barrier loop (when it
    leads) then runs at once.

    Only its graph's: a snapshot job's creating graph needs no main barrier, and one
    injected with the job's first barrier reached the upstream's actors exactly when the
    job's start (its actors' first reads) loaded the machine (``bench_coupling``: the
    slowest upstream barriers of a throttled phase 1 were at its start)."""
    ctx.signal.request_barrier(("main",) if job.graph_id == MAIN_GRAPH_ID else ("creating",))
    return job


def _answer_create(ctx: ServiceContext, job: Job, background: bool) -> tuple[int, JobView]:
    """202 with the creating job; in the foreground, 201 once it is created (or 202
    when that takes longer than FOREGROUND_TIMEOUT_S)."""
    deadline = time.monotonic() + (0.0 if background else FOREGROUND_TIMEOUT_S)
    seen = ctx.signal.generation  # taken before the job is read again: no wake-up missed
    while job.state == "creating" and (left := deadline - time.monotonic()) > 0:
        # woken when this process's barrier loop ends a round (the commit that makes the
        # job created is in one) or a collect lands; another replica's commits are seen
        # by the re-read at least every FOREGROUND_RECHECK_S. A client polling for the
        # state instead costs the control plane a request every time.
        seen = ctx.signal.wait(seen, min(left, FOREGROUND_RECHECK_S))
        job = jobs.get_job(ctx.db, job.id)
        if job.state == "creating":
            time.sleep(FOREGROUND_MIN_GAP_S)
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
    body = JobList(jobs=[_view(ctx, j) for j in page], next=page[-1].id if more else None)
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
    snap = progress_snapshot(ctx.db, job_id)
    rows, kept = snap.vnodes, snap.kept
    consumed = max(
        kept.consumed_rows if kept else 0,
        sum(r.row_count for r in rows) + sum(p.num_consumed_rows for p in snap.splits),
    )
    fixed = kept.total_estimate if kept is not None else None
    total = max(fixed or snap.upstream_estimate, consumed)
    done = snap.state == "created"
    forwarding = (rows and all(r.state == "completed" for r in rows)) or (
        snap.splits and all(p.state == "finished" for p in snap.splits)
    )
    phase = "done" if done else ("forwarding" if forwarding else "backfilling")
    log_store = snap.log_store
    if log_store is not None and not done:
        phase = log_store.phase
    percent = 100.0 if done else min(99.99, round(100 * consumed / total, 2) if total else 0.0)
    rate = 0.0 if done or kept is None else round(kept.rows_per_s, 1)
    eta = None if done or rate <= 0 else round(max(0, total - consumed) / rate, 1)
    body = Progress(
        id=snap.job_id,
        state=snap.state,
        phase=phase,
        rows=consumed,
        total_estimate=total,
        percent=percent,
        rows_per_s=rate,
        eta_s=0.0 if done else eta,
        committed_epoch=snap.committed_epoch,
        snapshot_epoch=snap.snapshot_epoch,
        log_store_lag_ms=log_store.lag_ms if log_store else None,
        log_store_lag_epochs=log_store.lag_epochs if log_store else None,
        recent_recoveries=[RecoveryRow(at=e.at, reason=e.reason) for e in snap.recoveries],
        vnodes=[
            VnodeRow(vnode=r.vnode, state=r.state, position=r.current_pos, rows=r.row_count)
            for r in rows
        ],
        splits=[
            SplitRow(
                split=p.split,
                state=p.state,  # type: ignore[arg-type]
                offset=p.offset,
                target_offset=p.target_offset,
                rows=p.num_consumed_rows,
            )
            for p in snap.splits
        ],
    )
    return conditional(request, body)


@router.post("/{job_id}/pause", response_model=JobView, operation_id="pauseJob")
def pause(job_id: int, ctx: Ctx) -> JobView:
    return _view(ctx, _steered(ctx, jobs.set_paused(ctx.db, job_id, True)))


@router.post("/{job_id}/resume", response_model=JobView, operation_id="resumeJob")
def resume(job_id: int, ctx: Ctx) -> JobView:
    return _view(ctx, _steered(ctx, jobs.set_paused(ctx.db, job_id, False)))


@router.patch("/{job_id}", response_model=JobView, operation_id="updateJob")
def patch_job(job_id: int, body: JobPatch, ctx: Ctx) -> JobView:
    fields = body.model_fields_set
    job = jobs.update_job(ctx.db, job_id, body.rate_limit, body.parallelism, "rate_limit" in fields)
    return _view(ctx, _steered(ctx, job))


@router.delete("/{job_id}", status_code=204, response_class=Response, operation_id="dropJob")
def drop_job(job_id: int, ctx: Ctx) -> Response:
    jobs.drop_job(ctx.db, job_id)
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
    v = verification.verify(ctx.db, job_id, epoch)
    return Verification(
        epoch=v.epoch,
        equal=v.equal,
        mv_rows=v.mv_rows,
        expected_rows=v.expected_rows,
        missing=v.missing,
        unexpected=v.unexpected,
    )
