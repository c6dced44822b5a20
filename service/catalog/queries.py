"""Plain reads of the catalog that every layer above shares: a relation, a source or a
job by its key (optionally locked), a relation's versioned table, a graph's committed
epoch. No rules of the use cases here (``docs/architecture.md#layout-and-layers``)."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import func, select, text
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from backfill_core.schema import TableSchema, is_identifier
from service.catalog.models import Graph, Job, Relation, RowCountDelta, Source
from service.errors import NotFound
from state_store.versioned import VersionedTable

# a job in these states reads its upstream: the upstream may not be dropped
ACTIVE_JOB_STATES = ("creating", "created")

# SQL over a job ``j``: it is creating and an actor of it has no live worker (none was
# registered when it was placed, or its worker's lease ran out): it waits for one
WAITING_FOR_WORKER_SQL = """(j.state = 'creating' AND EXISTS (
    SELECT 1 FROM actors a LEFT JOIN workers w ON w.id = a.worker_id
    WHERE a.job_id = j.id AND a.last_epoch IS NULL
      AND (w.id IS NULL OR w.state <> 'alive' OR w.lease_expires_at <= now())))"""


def readers_of(session: Session, relation_id: int) -> list[str]:
    """The names of the jobs, creating or created, that read the relation."""
    query = select(Job.name).where(
        Job.upstream_relation_id == relation_id, Job.state.in_(ACTIVE_JOB_STATES)
    )
    return list(session.execute(query).scalars())


def storage_of(rel: Relation) -> VersionedTable:
    return VersionedTable(rel.storage_table, TableSchema.from_json(rel.schema))


def get_relation(
    session: Session, name: str, *, lock: bool = False, share: bool = False
) -> Relation:
    if not is_identifier(name):  # cannot exist (and may not even be storable text)
        raise NotFound(f"table {name!r} does not exist", {"name": name})
    q = select(Relation).where(Relation.name == name)
    if lock or share:
        q = q.with_for_update(read=share and not lock)
    rel = session.execute(q).scalar_one_or_none()
    if rel is None:
        raise NotFound(f"table {name!r} does not exist", {"name": name})
    return rel


def get_source(session: Session, name: str, *, share: bool = False, lock: bool = False) -> Source:
    if not is_identifier(name):  # cannot exist (and may not even be storable text)
        raise NotFound(f"source {name!r} does not exist", {"name": name})
    q = select(Source).where(Source.name == name)
    if share or lock:
        q = q.with_for_update(read=not lock)
    src = session.execute(q).scalar_one_or_none()
    if src is None:
        raise NotFound(f"source {name!r} does not exist", {"name": name})
    return src


def load_job(
    session: Session, job_id: int, *, lock: bool = False, graph_for_update: bool = False
) -> Job:
    """The job's row; with ``lock``, locked for update after its graph's row (shared, or
    for update with ``graph_for_update``: a caller that will update the graph takes it so
    at once, as two upgrading a shared lock deadlock)."""
    q = select(Job).where(Job.id == job_id)
    if not lock:
        job = session.execute(q).scalar_one_or_none()
    while lock:
        # The barrier commit locks the graph, then touches its jobs (finishing them,
        # recording events): take the locks in the same order, or the two deadlock.
        graph_id = session.execute(
            select(Job.graph_id).where(Job.id == job_id)
        ).scalar_one_or_none()
        if graph_id is not None:
            session.execute(
                select(Graph.id)
                .where(Graph.id == graph_id)
                .with_for_update(read=not graph_for_update, key_share=not graph_for_update)
            )
        job = session.execute(
            q.with_for_update().execution_options(populate_existing=True)
        ).scalar_one_or_none()
        if job is None or job.graph_id == graph_id:
            break  # else a merge moved the job to the main graph meanwhile: lock that
    if job is None:
        raise NotFound(f"job {job_id} does not exist", {"id": job_id})
    return job


def committed_epoch(session: Session, graph_id: int | None) -> int:
    return int(
        session.execute(select(Graph.committed_epoch).where(Graph.id == graph_id)).scalar_one()
    )


def add_row_count_delta(session: Session, relation_id: int, epoch: int, delta: int) -> None:
    """Count ``delta`` more rows of a table at ``epoch`` (its DML is serialized)."""
    if delta:
        stmt = insert(RowCountDelta).values(relation_id=relation_id, epoch=epoch, delta=delta)
        excluded = stmt.excluded
        session.execute(
            stmt.on_conflict_do_update(
                index_elements=[RowCountDelta.relation_id, RowCountDelta.epoch],
                set_={"delta": RowCountDelta.delta + excluded.delta},
            )
        )


def table_row_count(session: Session, relation_id: int, epoch: int) -> int:
    """A user table's exact row count at ``epoch``."""
    return int(
        session.execute(
            select(func.coalesce(func.sum(RowCountDelta.delta), 0)).where(
                RowCountDelta.relation_id == relation_id, RowCountDelta.epoch <= epoch
            )
        ).scalar_one()
    )


def fold_row_counts(session: Session, relation_id: int, epoch: int) -> None:
    """One delta for everything at or below ``epoch`` (the table's GC epoch): the sum
    stays, the rows do not pile up with every epoch of DML."""
    below = (RowCountDelta.relation_id == relation_id, RowCountDelta.epoch <= epoch)
    n, total = session.execute(
        select(func.count(), func.coalesce(func.sum(RowCountDelta.delta), 0)).where(*below)
    ).one()
    if n > 1:
        session.execute(RowCountDelta.__table__.delete().where(*below))
        if total:
            session.add(RowCountDelta(relation_id=relation_id, epoch=epoch, delta=int(total)))


def waiting_for_worker(session: Session, job_id: int) -> bool:
    return job_id in jobs_waiting_for_worker(session, [job_id])


def jobs_waiting_for_worker(session: Session, job_ids: Sequence[int]) -> set[int]:
    """Those of ``job_ids`` with an actor that no live worker runs (one query)."""
    if not job_ids:
        return set()
    rows = session.execute(
        text(f"SELECT j.id FROM jobs j WHERE j.id = ANY(:jobs) AND {WAITING_FOR_WORKER_SQL}"),
        {"jobs": list(job_ids)},
    )
    return {int(r[0]) for r in rows}
