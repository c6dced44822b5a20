"""Use cases for jobs: create an MV with its backfill, read, pause, throttle, drop, verify."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from backfill_core.epoch import lag_ms
from backfill_core.schema import (
    ColumnType,
    SchemaError,
    TableSchema,
    validate_identifier,
    value_to_json,
)
from backfill_core.view import View
from service.catalog import events
from service.catalog.models import (
    Actor,
    Barrier,
    EpochPin,
    Event,
    Graph,
    Job,
    JobProgress,
    Relation,
    VnodeProgress,
)
from service.catalog.tables import _get as get_relation
from service.catalog.tables import readable_epoch, storage_of
from service.db import Database, raw_cursor
from service.errors import Conflict, Invalid, NotFound
from service.meta.barriers import enqueue_mutation
from service.meta.epochs import MAIN_GRAPH_ID
from service.meta.recovery import request_recovery
from service.meta.scheduler import place_job_actors

AVAILABLE_KINDS = ("arrangement", "chain", "snapshot")
PLANNED_KINDS = ("source",)
MAX_PARALLELISM = 256
RECENT_RECOVERIES = 5


@dataclass(frozen=True)
class JobSpec:
    name: str
    upstream_table: str
    columns: Sequence[str] | None
    filter: Any
    backfill: str
    parallelism: int
    rate_limit: int | None


def resolve_kind(kind: str) -> str:
    if kind == "auto":
        return "snapshot"  # decoupled from the upstream: the default on tables
    if kind in PLANNED_KINDS:
        raise Invalid(
            f"backfill kind {kind!r} is not available yet; "
            "use 'snapshot', 'arrangement' or 'chain'",
            {"field": "backfill"},
        )
    if kind not in AVAILABLE_KINDS:
        raise Invalid(f"unknown backfill kind {kind!r}", {"field": "backfill"})
    return kind


def create_job(db: Database, spec: JobSpec) -> Job:
    try:
        validate_identifier(spec.name, "job name")
    except SchemaError as e:
        raise Invalid(e.message, {"field": "name"}) from None
    kind = resolve_kind(spec.backfill)
    with db.transaction() as s:
        upstream = get_relation(s, spec.upstream_table, share=True)
        up_schema = TableSchema.from_json(upstream.schema)
        columns = list(spec.columns) if spec.columns else list(up_schema.names)
        try:
            view = View.build(up_schema, columns, spec.filter)
        except SchemaError as e:
            raise Invalid(e.message, {"field": e.path}) from None
        if not 1 <= spec.parallelism <= min(MAX_PARALLELISM, up_schema.vnode_count):
            raise Invalid(
                f"parallelism must be in 1..{min(MAX_PARALLELISM, up_schema.vnode_count)}",
                {"field": "parallelism"},
            )
        taken = (
            s.execute(select(Relation.id).where(Relation.name == spec.name)).first()
            or s.execute(select(Job.id).where(Job.name == spec.name)).first()
        )
        if taken:
            raise Conflict(
                f"a table or job named {spec.name!r} already exists", {"name": spec.name}
            )
        mv = Relation(
            name=spec.name,
            kind="mv",
            schema=view.schema.to_json(),
            storage_table=spec.name,
            graph_id=MAIN_GRAPH_ID,
        )
        s.add(mv)
        s.flush()
        storage_of(mv).create(raw_cursor(s))
        job = Job(
            name=spec.name,
            kind=kind,
            state="creating",
            paused=False,
            rate_limit=spec.rate_limit,
            parallelism=spec.parallelism,
            upstream_relation_id=upstream.id,
            mv_relation_id=mv.id,
            columns=columns,
            filter=spec.filter,
            graph_id=MAIN_GRAPH_ID,
        )
        s.add(job)
        s.flush()
        if kind in ("chain", "snapshot"):
            # one fixed snapshot (and then its change logs) for the whole backfill:
            # garbage collection must keep them until the job is created
            committed = s.execute(
                select(Graph.committed_epoch).where(Graph.id == MAIN_GRAPH_ID)
            ).scalar_one()
            s.add(EpochPin(relation_id=upstream.id, holder=f"job:{job.id}", epoch=committed))
        if kind == "snapshot":
            _creating_graph(s, job, mv, upstream, committed)
        place_job_actors(s, job, up_schema.vnode_count)
        # the total behind the percent: the upstream as the backfill starts, fixed, so
        # the percent never goes back while the upstream grows
        s.add(JobProgress(job_id=job.id, total_estimate=_estimate(s, job) or None))
        events.record(s, "job_created", job.id, name=job.name, backfill=kind)
        return job


def _creating_graph(s: Session, job: Job, mv: Relation, upstream: Relation, committed: int) -> None:
    """A snapshot backfill runs in a graph of its own until it merges into the main one."""
    if upstream.graph_id != MAIN_GRAPH_ID:
        raise Conflict(
            f"{upstream.name!r} is still being created; a snapshot backfill reads a created "
            "upstream",
            {"field": "upstream"},
        )
    if committed <= 0:
        raise Conflict(
            "the upstream has no committed epoch to take a snapshot at yet; retry in a moment",
            {"field": "upstream"},
        )
    graph = Graph(kind="creating", job_id=job.id, state="running")
    s.add(graph)
    s.flush()
    job.snapshot_epoch = committed
    job.graph_id = mv.graph_id = graph.id
    s.flush()


def _job(s: Session, job_id: int, *, lock: bool = False) -> Job:
    q = select(Job).where(Job.id == job_id)
    if not lock:
        job = s.execute(q).scalar_one_or_none()
    while lock:
        # The barrier commit locks the graph, then touches its jobs (finishing them,
        # recording events): take the locks in the same order, or the two deadlock.
        graph_id = s.execute(select(Job.graph_id).where(Job.id == job_id)).scalar_one_or_none()
        if graph_id is not None:
            s.execute(
                select(Graph.id)
                .where(Graph.id == graph_id)
                .with_for_update(read=True, key_share=True)
            )
        job = s.execute(
            q.with_for_update().execution_options(populate_existing=True)
        ).scalar_one_or_none()
        if job is None or job.graph_id == graph_id:
            break  # else a merge moved the job to the main graph meanwhile: lock that
    if job is None:
        raise NotFound(f"job {job_id} does not exist", {"id": job_id})
    return job


def get_job(db: Database, job_id: int) -> Job:
    with db.transaction() as s:
        return _job(s, job_id)


def list_jobs(
    db: Database, state: str | None, after_id: int | None, limit: int, *, newest_first: bool = False
) -> list[Job]:
    """A page of jobs in creation order (ids grow with creation: a stable cursor)."""
    with db.transaction() as s:
        q = select(Job).order_by(Job.id.desc() if newest_first else Job.id).limit(limit)
        if state:
            q = q.where(Job.state == state)
        if after_id is not None:
            q = q.where(Job.id < after_id if newest_first else Job.id > after_id)
        return list(s.execute(q).scalars())


def relation_names(db: Database, job: Job) -> tuple[str | None, str | None]:
    with db.transaction() as s:
        up = s.get(Relation, job.upstream_relation_id) if job.upstream_relation_id else None
        mv = s.get(Relation, job.mv_relation_id) if job.mv_relation_id else None
        return (up.name if up else None, mv.name if mv else None)


def set_paused(db: Database, job_id: int, paused: bool) -> Job:
    with db.transaction() as s:
        job = _job(s, job_id, lock=True)
        if job.state not in ("creating", "created"):
            raise Conflict(f"job {job_id} is {job.state}", {"state": job.state})
        if job.paused != paused:
            job.paused = paused
            assert job.graph_id is not None
            enqueue_mutation(s, job.graph_id, {"pause": True} if paused else {"resume": True})
            events.record(s, "paused" if paused else "resumed", job.id)
        return job


def update_job(
    db: Database, job_id: int, rate_limit: Any, parallelism: int | None, set_rate: bool
) -> Job:
    with db.transaction() as s:
        job = _job(s, job_id, lock=True)
        if job.state not in ("creating", "created"):
            raise Conflict(f"job {job_id} is {job.state}", {"state": job.state})
        assert job.graph_id is not None
        if set_rate and rate_limit != job.rate_limit:
            job.rate_limit = rate_limit
            actors = s.execute(
                select(Actor.id).where(Actor.job_id == job.id, Actor.last_epoch.is_(None))
            ).scalars()
            enqueue_mutation(s, job.graph_id, {"throttle": {str(a): rate_limit for a in actors}})
            events.record(s, "throttled", job.id, rate_limit=rate_limit)
        if parallelism is not None and parallelism != job.parallelism:
            up = s.get(Relation, job.upstream_relation_id)
            assert up is not None
            vnode_count = int(up.schema["vnode_count"])
            if not 1 <= parallelism <= min(MAX_PARALLELISM, vnode_count):
                raise Invalid(
                    f"parallelism must be in 1..{min(MAX_PARALLELISM, vnode_count)}",
                    {"field": "parallelism"},
                )
            # rescale through recovery: the new actors restart from the committed
            # per-vnode progress at the same initial barrier, after the MV rolled back
            s.execute(delete(Actor).where(Actor.job_id == job.id))
            job.parallelism = parallelism
            place_job_actors(s, job, vnode_count, at_recovery=True)
            request_recovery(s, job.graph_id, "rescale")
            events.record(s, "rescaled", job.id, parallelism=parallelism)
        return job


def drop_job(db: Database, job_id: int) -> None:
    """Cancel a creating job or drop a created one: the MV and all its state go away."""
    with db.transaction() as s:
        job = _job(s, job_id, lock=True)
        mv = s.get(Relation, job.mv_relation_id) if job.mv_relation_id else None
        if mv is not None:
            readers = list(
                s.execute(
                    select(Job.name).where(Job.upstream_relation_id == mv.id, Job.id != job.id)
                ).scalars()
            )
            if readers:
                raise Conflict(f"job(s) {', '.join(readers)} read this view", {"jobs": readers})
        s.execute(delete(EpochPin).where(EpochPin.holder == f"job:{job.id}"))
        s.execute(delete(JobProgress).where(JobProgress.job_id == job.id))
        events.record(s, "cancelled" if job.state == "creating" else "dropped", job.id)
        if mv is not None and mv.graph_id != MAIN_GRAPH_ID:
            mv.graph_id = MAIN_GRAPH_ID  # its creating graph goes with the job
            s.flush()
        s.delete(job)
        s.flush()
        if mv is not None:
            storage_of(mv).drop(raw_cursor(s))
            s.delete(mv)


def graph_of(db: Database, job: Job) -> Graph:
    with db.transaction() as s:
        return s.execute(select(Graph).where(Graph.id == job.graph_id)).scalar_one()


@dataclass(frozen=True)
class ProgressSnapshot:
    """Everything a progress read needs, read in one transaction (dashboards poll it)."""

    job: Job
    vnodes: list[VnodeProgress]
    kept: JobProgress | None
    upstream_estimate: int
    committed_epoch: int
    log_store: LogStoreLag | None = None
    recoveries: list[Event] = field(default_factory=list)  # the latest first


@dataclass(frozen=True)
class LogStoreLag:
    """Where a snapshot backfill's creating graph is against its upstream."""

    phase: str  # snapshot | log_store | finishing
    lag_ms: int  # upstream committed epoch - replayed epoch, in physical time
    lag_epochs: int  # upstream epochs closed and committed, not yet replayed


def _log_store_lag(s: Session, job: Job) -> LogStoreLag | None:
    graph = s.get(Graph, job.graph_id) if job.graph_id is not None else None
    if graph is None or graph.kind != "creating" or job.snapshot_epoch is None:
        return None
    main = s.get(Graph, MAIN_GRAPH_ID)
    assert main is not None
    replayed = max(graph.committed_epoch, job.snapshot_epoch)
    epochs = s.execute(
        select(func.count()).where(
            Barrier.graph_id == MAIN_GRAPH_ID,
            Barrier.prev_epoch > replayed,
            Barrier.prev_epoch <= main.committed_epoch,
        )
    ).scalar_one()
    if graph.committed_epoch < job.snapshot_epoch:
        phase = "snapshot"
    elif graph.current_epoch >= main.current_epoch:
        phase = "finishing"
    else:
        phase = "log_store"
    return LogStoreLag(phase, lag_ms(main.committed_epoch, replayed), int(epochs))


def progress_snapshot(db: Database, job_id: int) -> ProgressSnapshot:
    with db.transaction() as s:
        job = _job(s, job_id)
        vnodes = list(
            s.execute(
                select(VnodeProgress)
                .where(VnodeProgress.job_id == job_id)
                .order_by(VnodeProgress.vnode)
            ).scalars()
        )
        committed = s.execute(
            select(Graph.committed_epoch).where(Graph.id == job.graph_id)
        ).scalar_one_or_none()
        return ProgressSnapshot(
            job=job,
            vnodes=vnodes,
            kept=s.get(JobProgress, job_id),
            upstream_estimate=_estimate(s, job),
            committed_epoch=int(committed or 0),
            log_store=_log_store_lag(s, job),
            recoveries=list(
                s.execute(
                    select(Event)
                    .where(Event.job_id == job_id, Event.kind == "recovered")
                    .order_by(Event.id.desc())
                    .limit(RECENT_RECOVERIES)
                ).scalars()
            ),
        )


def committed_epoch_of(db: Database, job: Job) -> int:
    with db.transaction() as s:
        return int(
            s.execute(select(Graph.committed_epoch).where(Graph.id == job.graph_id)).scalar_one()
        )


def upstream_estimate(db: Database, job: Job) -> int:
    """Versions in the upstream table (the planner's estimate: cheap, approximate)."""
    with db.transaction() as s:
        return _estimate(s, job)


def _estimate(s: Session, job: Job) -> int:
    up = s.get(Relation, job.upstream_relation_id) if job.upstream_relation_id else None
    if up is None:
        return 0
    cur = raw_cursor(s)
    cur.execute(
        "SELECT reltuples FROM pg_class WHERE oid = to_regclass(%s)",
        [f'store."{up.storage_table}"'],
    )
    row = cur.fetchone()
    return max(0, int(row[0])) if row and row[0] is not None else 0


def _hashable(row: Sequence[Any]) -> tuple[Any, ...]:
    return tuple(json.dumps(v, sort_keys=True) if isinstance(v, dict | list) else v for v in row)


@dataclass(frozen=True)
class Verification:
    epoch: int
    equal: bool
    mv_rows: int
    expected_rows: int
    missing: list[dict[str, Any]]
    unexpected: list[dict[str, Any]]


def verify(db: Database, job_id: int, epoch: int | None, sample: int = 10) -> Verification:
    """Compare the MV at a committed epoch with the view of the upstream at that epoch."""
    with db.transaction() as s:
        job = _job(s, job_id)
        committed = int(
            s.execute(select(Graph.committed_epoch).where(Graph.id == job.graph_id)).scalar_one()
        )
        up = s.get(Relation, job.upstream_relation_id)
        mv = s.get(Relation, job.mv_relation_id)
        assert up is not None and mv is not None
        epoch = readable_epoch(epoch, committed, max(up.gc_epoch, mv.gc_epoch))
        up_table, mv_table = storage_of(up), storage_of(mv)
        view = View.build(up_table.schema, job.columns, job.filter)
        cur = raw_cursor(s)
        full = (0, up_table.schema.vnode_count)
        expected = {
            _hashable(r) for r in view.rows([r for _, r in up_table.snapshot(cur, epoch, full)])
        }
        actual = [_hashable(r) for _, r in mv_table.snapshot(cur, epoch, full)]
        actual_set = set(actual)
        duplicates = len(actual) != len(actual_set)
        schema = mv_table.schema

        def show(rows: set[Any]) -> list[dict[str, Any]]:
            return [
                schema.row_to_json(dict(zip(schema.names, r, strict=True)))
                for r in sorted(rows, key=repr)[:sample]
            ]

        missing, unexpected = expected - actual_set, actual_set - expected
        return Verification(
            epoch=epoch,
            equal=not missing and not unexpected and not duplicates,
            mv_rows=len(actual),
            expected_rows=len(expected),
            missing=show(missing),
            unexpected=show(unexpected),
        )


def _jsonish(t: ColumnType, v: Any) -> Any:
    if t is ColumnType.JSONB and isinstance(v, str):
        try:
            return json.loads(v)
        except ValueError:
            return v
    return value_to_json(t, v)
