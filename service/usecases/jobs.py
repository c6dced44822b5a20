"""Use cases for jobs: create an MV with its backfill, read them, wait for one to be created.
Steering a job (pause, throttle, rescale, drop) is in ``service.usecases.steering``."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from psycopg2 import sql
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from backfill_core.epoch import MAX_EPOCH
from backfill_core.executors.source import split_key
from backfill_core.schema import (
    SchemaError,
    TableSchema,
    validate_identifier,
)
from backfill_core.view import View
from connectors.kafka import KafkaSpec, KafkaUnavailable, topic_watermarks
from service.catalog import events, idempotency, queries, reader_views
from service.catalog.models import (
    MAIN_GRAPH_ID,
    EpochPin,
    Graph,
    Job,
    JobProgress,
    Relation,
    Source,
)
from service.catalog.queries import (
    committed_epoch,
    get_relation,
    get_source,
    load_job,
    storage_of,
    table_row_count,
)
from service.db import Database, raw_cursor, retry_deadlocks, unique_violation
from service.errors import Conflict, Invalid, NotFound, Unavailable
from service.meta.scheduler import place_job_actors
from service.meta.signal import BarrierSignal
from state_store.reader_views import reader_view_ident

TABLE_KINDS = ("arrangement", "chain", "snapshot")
MAX_PARALLELISM = 256
MIN_REREAD_GAP_S = 0.01  # between re-reads of a creating job: collects land in bursts
FIRST_COMMIT_WAIT_S = 30.0  # a create waits this long for the system's first commit
NO_WORKER_GRACE_S = 15.0  # a foreground create waits this long for a worker to show up


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


def create_job(
    db: Database,
    spec: JobSpec,
    claim: idempotency.Claim | None = None,
    signal: BarrierSignal | None = None,
    commit_wait_s: float | None = None,
) -> Job:
    """The job, created (its view, actors and first mutation queued) or a 4xx that wrote
    nothing. A snapshot job asked for before the upstream committed any epoch (a service
    started seconds ago) asks ``signal`` for rounds and waits up to ``commit_wait_s`` for
    the first commit, instead of making every script that loads and creates retry."""
    if commit_wait_s is None:
        commit_wait_s = FIRST_COMMIT_WAIT_S
    deadline = time.monotonic() + commit_wait_s
    while True:
        seen = signal.generation if signal is not None else 0
        try:
            return _create_job(db, spec, claim)
        except NoCommittedEpoch as e:
            left = deadline - time.monotonic()
            if signal is None or left <= 0:
                raise Conflict(
                    f"no epoch was committed within {commit_wait_s:g} s of the request: "
                    "is the control plane's barrier loop running (see /healthz)?",
                    e.details,
                ) from None
            signal.request_barrier()  # the first barrier commits none: ask until one does
            signal.wait(seen, min(left, MIN_REREAD_GAP_S * 10))


# one transaction, nothing outside it: a deadlock with a barrier's or GC's locks (a 503
# to the client, once in a loaded CI run) is retried from scratch
@retry_deadlocks
def _create_job(db: Database, spec: JobSpec, claim: idempotency.Claim | None) -> Job:
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
    reader_views.create_view_of(raw_cursor(s), mv)
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
    total = source_total if source is not None else _upstream_rows(s, upstream, kind)
    s.add(JobProgress(job_id=job.id, total_estimate=total))
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
            "the upstream has no committed epoch to take a snapshot at yet",
            {"field": "upstream"},
        )
    graph = Graph(kind="creating", job_id=job.id, state="running")
    s.add(graph)
    s.flush()
    job.snapshot_epoch = committed
    job.graph_id = mv.graph_id = graph.id
    s.flush()


def waiting_for_worker(db: Database, job: Job) -> bool:
    with db.transaction() as s:
        return queries.waiting_for_worker(s, job.id)


def get_job(db: Database, job_id: int) -> Job:
    with db.transaction() as s:
        return load_job(s, job_id)


def await_created(
    db: Database, signal: BarrierSignal, job: Job, timeout_s: float, recheck_s: float
) -> Job:
    """The job once it is created, or as it is after ``timeout_s``.

    Woken when this process's barrier loop ends a round (the commit that makes the job
    created is in one) or a collect lands; another replica's commits are seen by the
    re-read at least every ``recheck_s``. A client polling for the state instead costs
    the control plane a request every time."""
    deadline = time.monotonic() + timeout_s
    seen = signal.generation  # taken before the job is read again: no wake-up missed
    no_worker_since: float | None = None
    while job.state == "creating" and (left := deadline - time.monotonic()) > 0:
        seen = signal.wait(seen, min(left, recheck_s))
        job = get_job(db, job.id)
        if job.state != "creating":
            break
        # a job no live worker runs would keep a client waiting for nothing: answer
        # (202, waiting_for_worker) once that has lasted NO_WORKER_GRACE_S
        if not waiting_for_worker(db, job):
            no_worker_since = None
        elif no_worker_since is None:
            no_worker_since = time.monotonic()
        elif time.monotonic() - no_worker_since >= NO_WORKER_GRACE_S:
            break
        time.sleep(MIN_REREAD_GAP_S)
    return job


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


@dataclass(frozen=True)
class JobFacts:
    """What a job's view shows besides the job's own row."""

    names: JobNames
    graph: Graph
    waiting_for_worker: bool


def facts_of(db: Database, page: Sequence[Job]) -> dict[int, JobFacts]:
    """``JobFacts`` of a page of jobs, in four queries whatever its size (the graphs are
    read now: a snapshot backfill may have merged since its job was read)."""
    ids = [j.id for j in page]
    with db.transaction() as s:
        rel_ids = {r for j in page for r in (j.upstream_relation_id, j.mv_relation_id) if r}
        src_ids = {j.upstream_source_id for j in page if j.upstream_source_id}
        # (a Result has keys(): dict() would take it for a mapping)
        rels = dict(
            s.execute(select(Relation.id, Relation.name).where(Relation.id.in_(rel_ids))).all()
        )
        srcs = dict(s.execute(select(Source.id, Source.name).where(Source.id.in_(src_ids))).all())
        graphs = dict(
            s.execute(
                select(Job.id, Graph).join(Graph, Job.graph_id == Graph.id).where(Job.id.in_(ids))
            ).all()
        )
        waiting = queries.jobs_waiting_for_worker(s, ids)
    facts = {}
    for j in page:
        if j.id not in graphs:
            raise NotFound(f"job {j.id} does not exist", {"job_id": j.id})
        names = JobNames(
            rels.get(j.upstream_relation_id) if j.upstream_relation_id else None,
            srcs.get(j.upstream_source_id) if j.upstream_source_id else None,
            rels.get(j.mv_relation_id) if j.mv_relation_id else None,
        )
        facts[j.id] = JobFacts(names, graphs[j.id], j.id in waiting)
    return facts


def _upstream_rows(s: Session, up: Relation | None, kind: str) -> int:
    """The rows the backfill reads: a table's exact count, kept by its DML, at the
    snapshot (chain, snapshot) or now (arrangement reads the latest rows; a table's DML
    is never rolled back); a view's counted through its reader view (``mv.<name>``, the
    committed snapshot), as views are written by actors, not by DML."""
    if up is None:
        return 0
    if up.kind == "table":
        at = committed_epoch(s, up.graph_id) if kind in ("chain", "snapshot") else MAX_EPOCH
        return table_row_count(s, up.id, at)
    cur = raw_cursor(s)
    cur.execute(sql.SQL("SELECT count(*) FROM {}").format(reader_view_ident(up.name)))
    row = cur.fetchone()
    return int(row[0]) if row else 0
