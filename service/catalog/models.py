"""SQLAlchemy 2.0 typed models of the catalog (the Alembic migrations create them)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    Float,
    ForeignKey,
    Identity,
    Index,
    Integer,
    MetaData,
    Text,
    UniqueConstraint,
    func,
    true,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)
    type_annotation_map = {dict[str, Any]: JSONB, list[Any]: JSONB}


def _now() -> Mapped[dt.datetime]:
    return mapped_column(DateTime(timezone=True), server_default=func.now())


class Relation(Base):
    """A user table or an MV: one epoch-versioned table in the state store."""

    __tablename__ = "relations"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(Text, unique=True)
    kind: Mapped[str] = mapped_column(Text)  # table | mv
    schema: Mapped[dict[str, Any]]
    storage_table: Mapped[str] = mapped_column(Text, unique=True)
    # the graph whose barriers write this table (rolled back with it on recovery)
    graph_id: Mapped[int] = mapped_column(ForeignKey("graphs.id"))
    # versions only needed by reads below this epoch have been garbage-collected
    gc_epoch: Mapped[int] = mapped_column(BigInteger, default=0)
    # the index on _epoch exists (an MV gets it once its backfill is done, a table once
    # its first write committed: service/meta/indexer.py); until then GC scans a plain
    # table and leaves an MV or a CDC table alone
    epoch_indexed: Mapped[bool] = mapped_column(Boolean, default=True, server_default=true())
    # a table's writes go at or above this epoch (its last import's, which may still be
    # ahead of the open one: service/meta/imports.py)
    write_floor_epoch: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    created_at: Mapped[dt.datetime] = _now()


class RowCountDelta(Base):
    """A user table's net rows added by one epoch's DML (inserts minus deletes): the
    exact row count at an epoch is the sum up to it. GC folds the ones at or below the
    table's ``gc_epoch`` into one. Tables are never rolled back, so neither are these."""

    __tablename__ = "row_count_deltas"
    relation_id: Mapped[int] = mapped_column(
        ForeignKey("relations.id", ondelete="CASCADE"), primary_key=True
    )
    epoch: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    delta: Mapped[int] = mapped_column(BigInteger)


class CdcTable(Base):
    """A table mirrored from an upstream Postgres table (``service/usecases/cdc.py``):
    its upstream (``dsn`` is a secret, never shown: ``upstream_host`` is), publication
    and slot (``created_*``: the service made them and drops them with the table), its
    job, and the CDC backfill's durable progress, written by its worker in the same
    transaction as the rows (``spark_workers.cdc_actor``)."""

    __tablename__ = "cdc_tables"
    relation_id: Mapped[int] = mapped_column(
        ForeignKey("relations.id", ondelete="CASCADE"), primary_key=True
    )
    job_id: Mapped[int | None] = mapped_column(ForeignKey("jobs.id", ondelete="SET NULL"))
    dsn: Mapped[str] = mapped_column(Text)
    upstream: Mapped[str] = mapped_column(Text)  # schema.table
    upstream_host: Mapped[str] = mapped_column(Text)  # host:port/db, for people
    publication: Mapped[str] = mapped_column(Text)
    slot: Mapped[str] = mapped_column(Text)
    created_publication: Mapped[bool] = mapped_column(Boolean)
    created_slot: Mapped[bool] = mapped_column(Boolean)
    start_lsn: Mapped[int] = mapped_column(BigInteger)
    state: Mapped[str] = mapped_column(Text, server_default="backfilling")
    current_pos: Mapped[list[Any] | None]
    lsn: Mapped[int] = mapped_column(BigInteger)
    row_count: Mapped[int] = mapped_column(BigInteger, server_default="0")
    chunks: Mapped[int] = mapped_column(Integer, server_default="0")
    slot_lag_bytes: Mapped[int | None] = mapped_column(BigInteger)
    confirmed_lsn: Mapped[int | None] = mapped_column(BigInteger)
    created_at: Mapped[dt.datetime] = _now()


class CdcEpoch(Base):
    """The upstream LSN a CDC table is exact at once ``epoch`` is committed (a row per
    epoch it was written at; the slot confirms the one of the committed epoch)."""

    __tablename__ = "cdc_epochs"
    relation_id: Mapped[int] = mapped_column(
        ForeignKey("cdc_tables.relation_id", ondelete="CASCADE"), primary_key=True
    )
    epoch: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    lsn: Mapped[int] = mapped_column(BigInteger)
    # the backfill's state and position then: the table holds the upstream's keys up to it
    state: Mapped[str] = mapped_column(Text)
    current_pos: Mapped[list[Any] | None]


class Source(Base):
    __tablename__ = "sources"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(Text, unique=True)
    kafka: Mapped[dict[str, Any]]
    format: Mapped[str] = mapped_column(Text)
    schema: Mapped[dict[str, Any]]
    rate_limit: Mapped[int | None] = mapped_column(Integer)  # messages/s over all partitions
    # a message that is not a valid row: skip (counted) | fail (the job)
    on_error: Mapped[str] = mapped_column(Text, default="skip", server_default="skip")
    # split -> the offset the shared source starts at (the topic's end at creation)
    start_offsets: Mapped[dict[str, Any]] = mapped_column(JSONB, default=dict)
    created_at: Mapped[dt.datetime] = _now()


class SourceOffsets(Base):
    """Where a source is at the end of an epoch (a row only when it moved)."""

    __tablename__ = "source_offsets"
    source_id: Mapped[int] = mapped_column(
        ForeignKey("sources.id", ondelete="CASCADE"), primary_key=True
    )
    epoch: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    offsets: Mapped[dict[str, Any]]  # split -> end offset (exclusive)


# the main graph's row: the first migration makes it; tables and created jobs live in it
MAIN_GRAPH_ID = 1


class Graph(Base):
    """A set of actors that see the same barrier sequence, with its committed epoch."""

    __tablename__ = "graphs"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    kind: Mapped[str] = mapped_column(Text)  # main | creating
    job_id: Mapped[int | None] = mapped_column(
        ForeignKey("jobs.id", ondelete="CASCADE", use_alter=True)
    )
    committed_epoch: Mapped[int] = mapped_column(BigInteger, default=0)
    current_epoch: Mapped[int] = mapped_column(BigInteger, default=0)
    state: Mapped[str] = mapped_column(Text, default="running")  # running | recovering | stopped
    recovery_seq: Mapped[int] = mapped_column(Integer, default=0)
    recovery_reason: Mapped[str | None] = mapped_column(Text)
    # a failing job's backoff: the recovery waits until then (wall-clock ms)
    recover_after_ms: Mapped[int | None] = mapped_column(BigInteger)
    barrier_seq: Mapped[int] = mapped_column(BigInteger, default=0)
    created_at: Mapped[dt.datetime] = _now()


class Job(Base):
    __tablename__ = "jobs"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(Text, unique=True)
    kind: Mapped[str] = mapped_column(Text)  # arrangement | chain | snapshot | source | cdc
    state: Mapped[str] = mapped_column(Text, default="creating")
    paused: Mapped[bool] = mapped_column(Boolean, default=False)
    rate_limit: Mapped[int | None] = mapped_column(Integer)
    parallelism: Mapped[int] = mapped_column(Integer)
    upstream_relation_id: Mapped[int | None] = mapped_column(ForeignKey("relations.id"))
    upstream_source_id: Mapped[int | None] = mapped_column(ForeignKey("sources.id"))
    mv_relation_id: Mapped[int | None] = mapped_column(
        ForeignKey("relations.id", ondelete="SET NULL")
    )
    columns: Mapped[list[Any]]
    filter: Mapped[dict[str, Any] | None]
    graph_id: Mapped[int | None] = mapped_column(ForeignKey("graphs.id", ondelete="SET NULL"))
    snapshot_epoch: Mapped[int | None] = mapped_column(BigInteger)
    finished_epoch: Mapped[int | None] = mapped_column(BigInteger)
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[dt.datetime] = _now()
    updated_at: Mapped[dt.datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now(), onupdate=func.now()
    )


class JobFailure(Base):
    """One failed attempt of a job (an actor's failure reported by its worker)."""

    __tablename__ = "job_failures"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    at_ms: Mapped[int] = mapped_column(BigInteger)
    cause: Mapped[str] = mapped_column(Text)  # the message with its numbers masked
    message: Mapped[str] = mapped_column(Text)
    actor_id: Mapped[int] = mapped_column(Integer)
    epoch: Mapped[int] = mapped_column(BigInteger)  # the graph's committed epoch then
    recovery_seq: Mapped[int] = mapped_column(Integer)  # the incarnation that failed
    backoff_ms: Mapped[int | None] = mapped_column(BigInteger)  # None: it failed the job


class Worker(Base):
    __tablename__ = "workers"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(Text)
    capacity: Mapped[int] = mapped_column(Integer)
    state: Mapped[str] = mapped_column(Text, default="alive")  # alive | dead | stopped
    lease_expires_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True))
    registered_at: Mapped[dt.datetime] = _now()
    last_heartbeat_at: Mapped[dt.datetime] = _now()


class Actor(Base):
    """One parallel unit of a job: a vnode set (ranges) or a set of source splits."""

    __tablename__ = "actors"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    graph_id: Mapped[int] = mapped_column(ForeignKey("graphs.id", ondelete="CASCADE"))
    worker_id: Mapped[int | None] = mapped_column(
        ForeignKey("workers.id", ondelete="SET NULL"), index=True
    )
    vnodes: Mapped[list[Any]]  # [[lo, hi), ...]
    splits: Mapped[list[Any]]
    state: Mapped[str] = mapped_column(Text, default="running")
    # the curr epoch of its first barrier (the one that adds it) and of its last (stop)
    first_epoch: Mapped[int | None] = mapped_column(BigInteger)
    last_epoch: Mapped[int | None] = mapped_column(BigInteger)
    created_at: Mapped[dt.datetime] = _now()


class VnodeProgress(Base):
    __tablename__ = "vnode_progress"
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    vnode: Mapped[int] = mapped_column(Integer, primary_key=True)
    state: Mapped[str] = mapped_column(Text)
    current_pos: Mapped[list[Any] | None]
    row_count: Mapped[int] = mapped_column(BigInteger, default=0)
    epoch: Mapped[int] = mapped_column(BigInteger)


class SplitProgress(Base):
    __tablename__ = "split_progress"
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    split: Mapped[str] = mapped_column(Text, primary_key=True)
    state: Mapped[str] = mapped_column(Text)
    offset: Mapped[int | None] = mapped_column(BigInteger)
    target_offset: Mapped[int | None] = mapped_column(BigInteger)
    num_consumed_rows: Mapped[int] = mapped_column(BigInteger, default=0)
    skipped: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    last_skipped_offset: Mapped[int | None] = mapped_column(BigInteger)
    epoch: Mapped[int] = mapped_column(BigInteger)


class EpochHold(Base):
    """An epoch ahead of a graph's open one that a publication writes at: the barrier
    that would close an epoch at or past it waits for the publication, then drops it."""

    __tablename__ = "epoch_holds"
    graph_id: Mapped[int] = mapped_column(
        ForeignKey("graphs.id", ondelete="CASCADE"), primary_key=True
    )
    holder: Mapped[str] = mapped_column(Text, primary_key=True)  # e.g. "import:12"
    epoch: Mapped[int] = mapped_column(BigInteger)


class EpochPin(Base):
    """Garbage collection keeps every version a pinned reader may still see."""

    __tablename__ = "epoch_pins"
    __table_args__ = (UniqueConstraint("relation_id", "holder"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    relation_id: Mapped[int] = mapped_column(ForeignKey("relations.id", ondelete="CASCADE"))
    holder: Mapped[str] = mapped_column(Text)  # e.g. "job:12"
    epoch: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[dt.datetime] = _now()


class Export(Base):
    """A relation's snapshot at a committed epoch, written as files by a worker's Spark
    job (``service/usecases/exports.py``); its epoch is pinned (``export:<id>``) until it
    ends."""

    __tablename__ = "exports"
    __table_args__ = (Index("ix_exports_state", "state"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    relation_id: Mapped[int | None] = mapped_column(ForeignKey("relations.id", ondelete="SET NULL"))
    relation: Mapped[str] = mapped_column(Text)
    format: Mapped[str] = mapped_column(Text)
    path: Mapped[str] = mapped_column(Text)
    epoch: Mapped[int] = mapped_column(BigInteger)
    state: Mapped[str] = mapped_column(Text)  # queued | running | succeeded | failed | cancelled
    rows: Mapped[int | None] = mapped_column(BigInteger)
    error: Mapped[str | None] = mapped_column(Text)
    worker_id: Mapped[int | None] = mapped_column(ForeignKey("workers.id"))
    created_at: Mapped[dt.datetime] = _now()
    started_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))


class Import(Base):
    """Files loaded into a table by a worker's Spark job and published at one epoch
    (``service/usecases/imports.py``); ``staging`` names its staging table in the
    store's schema while that exists."""

    __tablename__ = "imports"
    __table_args__ = (Index("ix_imports_state", "state"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    relation_id: Mapped[int | None] = mapped_column(ForeignKey("relations.id", ondelete="SET NULL"))
    relation: Mapped[str] = mapped_column(Text)
    format: Mapped[str] = mapped_column(Text)
    path: Mapped[str] = mapped_column(Text)
    state: Mapped[str] = mapped_column(Text)  # queued | running | succeeded | failed | cancelled
    epoch: Mapped[int | None] = mapped_column(BigInteger)  # published at, once succeeded
    rows: Mapped[int | None] = mapped_column(BigInteger)
    error: Mapped[str | None] = mapped_column(Text)
    error_code: Mapped[str | None] = mapped_column(Text)
    error_details: Mapped[dict[str, Any] | None]
    staging: Mapped[str | None] = mapped_column(Text)
    worker_id: Mapped[int | None] = mapped_column(ForeignKey("workers.id"))
    created_at: Mapped[dt.datetime] = _now()
    started_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))


class Barrier(Base):
    __tablename__ = "barriers"
    __table_args__ = (Index("ix_barriers_graph_id_state", "graph_id", "state"),)
    graph_id: Mapped[int] = mapped_column(
        ForeignKey("graphs.id", ondelete="CASCADE"), primary_key=True
    )
    curr_epoch: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    prev_epoch: Mapped[int] = mapped_column(BigInteger)
    kind: Mapped[str] = mapped_column(Text)  # initial | barrier | checkpoint
    mutation: Mapped[dict[str, Any] | None]
    # creating graphs: the upstream's committed epoch when this barrier was injected
    upstream_epoch: Mapped[int | None] = mapped_column(BigInteger)
    state: Mapped[str] = mapped_column(Text, default="inflight")  # inflight | collected | committed
    injected_at: Mapped[dt.datetime] = _now()
    committed_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))


class BarrierCollect(Base):
    __tablename__ = "barrier_collects"
    __table_args__ = (Index("ix_barrier_collects_graph_id_curr_epoch", "graph_id", "curr_epoch"),)
    actor_id: Mapped[int] = mapped_column(
        ForeignKey("actors.id", ondelete="CASCADE"), primary_key=True
    )
    curr_epoch: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    graph_id: Mapped[int] = mapped_column(ForeignKey("graphs.id", ondelete="CASCADE"))
    prev_epoch: Mapped[int] = mapped_column(BigInteger)
    progress: Mapped[dict[str, Any] | None]
    rows: Mapped[int] = mapped_column(BigInteger, default=0)
    finished: Mapped[bool] = mapped_column(Boolean, default=False)
    collected_at: Mapped[dt.datetime] = _now()


class PendingMutation(Base):
    """A mutation waiting for the next barrier of its graph."""

    __tablename__ = "pending_mutations"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    graph_id: Mapped[int] = mapped_column(ForeignKey("graphs.id", ondelete="CASCADE"))
    mutation: Mapped[dict[str, Any]]
    created_at: Mapped[dt.datetime] = _now()


class Event(Base):
    """Something that happened to a job; ids only grow, so they are stream positions."""

    __tablename__ = "events"
    __table_args__ = (Index("ix_events_job_id_id", "job_id", "id"),)
    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    job_id: Mapped[int | None] = mapped_column(Integer)
    kind: Mapped[str] = mapped_column(Text)
    data: Mapped[dict[str, Any]] = mapped_column(JSONB, default=dict)
    created_at: Mapped[dt.datetime] = _now()


class JobProgress(Base):
    """Progress as of the committed epoch, maintained by the commit; never goes back."""

    __tablename__ = "job_progress"
    job_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    consumed_rows: Mapped[int] = mapped_column(BigInteger, default=0)
    window_rows: Mapped[int] = mapped_column(BigInteger, default=0)
    window_epoch: Mapped[int] = mapped_column(BigInteger, default=0)
    rows_per_s: Mapped[float] = mapped_column(Float, default=0.0)
    # the upstream's rows when the job was created: exact for a table (its committed
    # row count), the topic's backlog for a source (None: unknown then)
    total_estimate: Mapped[int | None] = mapped_column(BigInteger)


class IdempotencyKey(Base):
    """A create's Idempotency-Key: what it created and the answer it gave (replayed to
    retries with the same key and body until it expires)."""

    __tablename__ = "idempotency_keys"
    __table_args__ = (Index("ix_idempotency_keys_expires_at", "expires_at"),)
    key: Mapped[str] = mapped_column(Text, primary_key=True)
    fingerprint: Mapped[str] = mapped_column(Text)  # sha256 of method, path, canonical body
    method: Mapped[str] = mapped_column(Text)
    path: Mapped[str] = mapped_column(Text)
    resource: Mapped[dict[str, Any] | None]  # e.g. {"table": "orders"}, {"job": 12}
    status_code: Mapped[int | None] = mapped_column(Integer)  # null until recorded
    response: Mapped[str | None] = mapped_column(Text)  # the exact JSON body
    created_at: Mapped[dt.datetime] = _now()
    respond_by: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True))
    expires_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True))


class ApiToken(Base):
    """A bearer token the API accepts: only its sha256, never the token itself."""

    __tablename__ = "api_tokens"
    __table_args__ = (
        CheckConstraint("role IN ('admin', 'reader', 'worker')", name="role"),
        CheckConstraint("token_hash ~ '^[0-9a-f]{64}$'", name="sha256_hex"),
    )
    token_hash: Mapped[str] = mapped_column(Text, primary_key=True)
    role: Mapped[str] = mapped_column(Text)
    source: Mapped[str] = mapped_column(Text)  # settings | generated | embedded-worker | session
    created_at: Mapped[dt.datetime] = _now()


class WorkQueue(Base):
    """The groups of reads one pushed-down Spark job's tasks take in turn: ``taken`` of
    them so far (see ``spark_workers.pushdown_tasks``). Unlogged, one row per running job."""

    __tablename__ = "work_queues"
    __table_args__ = {"prefixes": ["UNLOGGED"]}
    token: Mapped[str] = mapped_column(Text, primary_key=True)
    taken: Mapped[int] = mapped_column(Integer, server_default="0")
    # a job spanning epochs: the epoch its driver released (None: a job of one epoch)
    write_epoch: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    read_epoch: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    created_at: Mapped[dt.datetime] = _now()


class WorkRound(Base):
    """One group of a Spark job spanning epochs, run at ``write_epoch``: its per-vnode
    summary, written with its rows, until the driver accounts for it. Unlogged."""

    __tablename__ = "work_rounds"
    __table_args__ = {"prefixes": ["UNLOGGED"]}
    token: Mapped[str] = mapped_column(Text, primary_key=True)
    grp: Mapped[int] = mapped_column(Integer, primary_key=True)
    read_epoch: Mapped[int] = mapped_column(BigInteger)
    write_epoch: Mapped[int] = mapped_column(BigInteger)
    summary: Mapped[str] = mapped_column(Text)  # JSON: [[vnode, rows, last key], ...]
    created_at: Mapped[dt.datetime] = _now()
