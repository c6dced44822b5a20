"""Use cases for jobs: create an MV with its backfill, read, pause, throttle, drop, verify."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from backfill_core.executors.source import split_key
from backfill_core.schema import (
    SchemaError,
    TableSchema,
    validate_identifier,
)
from backfill_core.view import View
from connectors.kafka import KafkaSpec, KafkaUnavailable, topic_watermarks
from service.catalog import events, idempotency
from service.catalog.models import (
    Actor,
    EpochPin,
    Graph,
    Job,
    JobProgress,
    Relation,
    Source,
)
from service.catalog.sources import get_source
from service.catalog.tables import _get as get_relation
from service.catalog.tables import storage_of
from service.db import Database, raw_cursor, retry_deadlocks, unique_violation
from service.errors import Conflict, Invalid, NotFound, Unavailable
from service.meta.barriers import enqueue_mutation
from service.meta.epochs import MAIN_GRAPH_ID
from service.meta.indexer import stop_build
from service.meta.recovery import request_recovery
from service.meta.scheduler import place_job_actors

TABLE_KINDS = ("arrangement", "chain", "snapshot")
MAX_PARALLELISM = 256


@dataclass(frozen=True)
class JobSpec:
    name: str
    upstream_table: str | None
    columns: Sequence[str] | None
    filter: Any
    backfill: str
    parallelism: int
    rate_limit: int | None
    upstream_source: str | None = None


def resolve_kind(kind: str, *, source: bool = False) -> str:
    if source:
        if kind not in ("auto", "source"):
            raise Invalid(
                f"a source is backfilled with 'source' (or 'auto'), not {kind!r}",
                {"field": "backfill"},
            )
        return "source"
    if kind == "auto":
        return "snapshot"  # decoupled from the upstream: the default on tables
    if kind == "source":
        raise Invalid(
            "'source' backfill reads a source: give upstream.source, or use 'snapshot', "
            "'arrangement' or 'chain' for a table",
            {"field": "backfill"},
        )
    if kind not in TABLE_KINDS:
        raise Invalid(f"unknown backfill kind {kind!r}", {"field": "backfill"})
    return kind


def create_job(db: Database, spec: JobSpec, claim: idempotency.Claim | None = None) -> Job:
    try:
        validate_identifier(spec.name, "job name")
    except SchemaError as e:
        raise Invalid(e.message, {"field": "name"}) from None
    if (spec.upstream_table is None) == (spec.upstream_source is None):
        raise Invalid(
            "give exactly one of upstream.table and upstream.source", {"field": "upstream"}
        )
    kind = resolve_kind(spec.backfill, source=spec.upstream_source is not None)
    source_total = None
    if spec.upstream_source is not None:
        source_total = _source_backlog(db, spec.upstream_source)
    try:
        with db.transaction() as s:
            if claim is not None:
                idempotency.claim(s, claim)
            job = _insert_job(s, spec, kind, source_total)
            idempotency.created(s, claim, {"job": job.id})
            return job
    except IntegrityError as e:
        if unique_violation(e) in (
            "uq_relations_name",
            "uq_relations_storage_table",
            "uq_jobs_name",
        ):
            # a concurrent create of the same name committed first
            raise Conflict(
                f"a table or job named {spec.name!r} already exists", {"name": spec.name}
            ) from None
        raise


def _insert_job(s: Session, spec: JobSpec, kind: str, source_total: int | None) -> Job:
    upstream: Relation | None = None
    source: Source | None = None
    if spec.upstream_source is not None:
        source = get_source(s, spec.upstream_source, share=True)
        up_schema = TableSchema.from_json(source.schema)
        max_parallelism = min(MAX_PARALLELISM, len(source.start_offsets))
        unit = "the topic's partitions"
    else:
        assert spec.upstream_table is not None
        upstream = get_relation(s, spec.upstream_table, share=True)
        up_schema = TableSchema.from_json(upstream.schema)
        max_parallelism = min(MAX_PARALLELISM, up_schema.vnode_count)
        unit = "the upstream's vnodes"
    columns = list(spec.columns) if spec.columns else list(up_schema.names)
    try:
        view = View.build(up_schema, columns, spec.filter)
    except SchemaError as e:
        raise Invalid(e.message, {"field": e.path}) from None
    if not 1 <= spec.parallelism <= max_parallelism:
        raise Invalid(
            f"parallelism must be in 1..{max_parallelism} (at most {unit})",
            {"field": "parallelism"},
        )
    taken = (
        s.execute(select(Relation.id).where(Relation.name == spec.name)).first()
        or s.execute(select(Job.id).where(Job.name == spec.name)).first()
    )
    if taken:
        raise Conflict(f"a table or job named {spec.name!r} already exists", {"name": spec.name})
    mv = Relation(
        name=spec.name,
        kind="mv",
        schema=view.schema.to_json(),
        storage_table=spec.name,
        graph_id=MAIN_GRAPH_ID,
    )
    s.add(mv)
    s.flush()
    # its epoch index comes once the backfill is done (service/meta/indexer.py)
    mv.epoch_indexed = False
    storage_of(mv).create(raw_cursor(s), epoch_index=False)
    job = Job(
        name=spec.name,
        kind=kind,
        state="creating",
        paused=False,
        rate_limit=spec.rate_limit,
        parallelism=spec.parallelism,
        upstream_relation_id=upstream.id if upstream else None,
        upstream_source_id=source.id if source else None,
        mv_relation_id=mv.id,
        columns=columns,
        filter=spec.filter,
        graph_id=MAIN_GRAPH_ID,
    )
    s.add(job)
    s.flush()
    if kind in ("chain", "snapshot"):
        assert upstream is not None
        # one fixed snapshot (and then its change logs) for the whole backfill:
        # garbage collection must keep them until the job is created
        committed = s.execute(
            select(Graph.committed_epoch).where(Graph.id == MAIN_GRAPH_ID)
        ).scalar_one()
        s.add(EpochPin(relation_id=upstream.id, holder=f"job:{job.id}", epoch=committed))
    if kind == "snapshot":
        _creating_graph(s, job, mv, upstream, committed)
    place_job_actors(s, job, up_schema.vnode_count, splits=_splits_of(source))
    # the total behind the percent: the upstream as the backfill starts, fixed, so
    # the percent never goes back while the upstream grows
    total = source_total if source is not None else _estimate(s, job)
    s.add(JobProgress(job_id=job.id, total_estimate=total or None))
    events.record(s, "job_created", job.id, name=job.name, backfill=kind)
    return job


def _splits_of(source: Source | None) -> list[str] | None:
    return None if source is None else sorted(source.start_offsets, key=split_key)


def _source_backlog(db: Database, name: str) -> int:
    """Messages a source job backfills: the topic's size as the job starts."""
    with db.transaction() as s:
        spec = KafkaSpec.from_json(get_source(s, name).kafka)
    try:
        marks = topic_watermarks(spec)
    except KafkaUnavailable as e:
        raise Unavailable(str(e), {"field": "upstream.source"}, code="kafka_unavailable") from None
    return sum(high - low for low, high in marks.values())


class NoCommittedEpoch(Conflict):
    """A snapshot job asked for before the upstream committed any epoch."""


def _creating_graph(s: Session, job: Job, mv: Relation, upstream: Relation, committed: int) -> None:
    """A snapshot backfill runs in a graph of its own until it merges into the main one."""
    if upstream.graph_id != MAIN_GRAPH_ID:
        raise Conflict(
            f"{upstream.name!r} is still being created; a snapshot backfill reads a created "
            "upstream",
            {"field": "upstream"},
        )
    if committed <= 0:
        raise NoCommittedEpoch(
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


@dataclass(frozen=True)
class JobNames:
    upstream_table: str | None
    upstream_source: str | None
    mv: str | None


def relation_names(db: Database, job: Job) -> JobNames:
    with db.transaction() as s:
        up = s.get(Relation, job.upstream_relation_id) if job.upstream_relation_id else None
        src = s.get(Source, job.upstream_source_id) if job.upstream_source_id else None
        mv = s.get(Relation, job.mv_relation_id) if job.mv_relation_id else None
        return JobNames(up.name if up else None, src.name if src else None, mv.name if mv else None)


def _live_actors(s: Session, job_id: int) -> list[int]:
    """The job's actors a flow mutation (pause, resume, throttle) names: those not
    stopped, including any placed but not started yet. Actors placed later (a rescale, a
    recovery) start from the job's row instead (``paused``, ``rate_limit``)."""
    return list(
        s.execute(
            select(Actor.id)
            .where(Actor.job_id == job_id, Actor.last_epoch.is_(None))
            .order_by(Actor.id)
        ).scalars()
    )


def set_paused(db: Database, job_id: int, paused: bool) -> Job:
    with db.transaction() as s:
        job = _job(s, job_id, lock=True)
        if job.state not in ("creating", "created"):
            raise Conflict(f"job {job_id} is {job.state}", {"state": job.state})
        if job.paused != paused:
            job.paused = paused
            assert job.graph_id is not None
            # the job's actors only: the graph's other jobs keep their own paused flags
            key = "pause" if paused else "resume"
            enqueue_mutation(s, job.graph_id, {key: _live_actors(s, job.id)})
            events.record(s, "paused" if paused else "resumed", job.id)
        return job


@retry_deadlocks
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
            actors = _live_actors(s, job.id)
            enqueue_mutation(s, job.graph_id, {"throttle": {str(a): rate_limit for a in actors}})
            events.record(s, "throttled", job.id, rate_limit=rate_limit)
        if parallelism is not None and parallelism != job.parallelism:
            splits: list[str] | None = None
            if job.upstream_source_id is not None:
                # every split the job's actors own now (partitions added since included)
                owned = s.execute(
                    select(Actor.splits).where(Actor.job_id == job.id, Actor.last_epoch.is_(None))
                ).scalars()
                splits = sorted({x for part in owned for x in part}, key=split_key)
                vnode_count, most = 0, len(splits)
            else:
                up = s.get(Relation, job.upstream_relation_id)
                assert up is not None
                vnode_count = most = int(up.schema["vnode_count"])
            if not 1 <= parallelism <= min(MAX_PARALLELISM, most):
                raise Invalid(
                    f"parallelism must be in 1..{min(MAX_PARALLELISM, most)}",
                    {"field": "parallelism"},
                )
            # rescale through recovery: the new actors restart from the committed
            # per-vnode (per-split) progress at the same initial barrier, after the MV
            # rolled back
            s.execute(delete(Actor).where(Actor.job_id == job.id))
            job.parallelism = parallelism
            place_job_actors(s, job, vnode_count, at_recovery=True, splits=splits)
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
            if not mv.epoch_indexed:
                stop_build(raw_cursor(s), mv.id)  # a build would hold the drop up
            storage_of(mv).drop(raw_cursor(s))
            s.delete(mv)


def graph_of(db: Database, job: Job) -> Graph:
    """The job's graph now (a snapshot backfill may have merged since ``job`` was read)."""
    with db.transaction() as s:
        graph = s.execute(
            select(Graph).join(Job, Job.graph_id == Graph.id).where(Job.id == job.id)
        ).scalar_one_or_none()
        if graph is None:
            raise NotFound(f"job {job.id} does not exist", {"job_id": job.id})
        return graph


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
