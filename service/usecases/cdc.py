"""Use cases for CDC tables: a table of ours mirroring an upstream Postgres table
(``docs/api.md#cdc-tables``, ``docs/architecture.md#cdc-backfill``).

Create: the upstream's schema from its catalog, checked before anything is written; then,
in one catalog transaction, our versioned table (as a normal table create), its ``cdc``
job with one actor, and the CDC row; the upstream's replica identity, publication and
slot are made inside it (undone when the transaction fails). Drop: the job, the table,
and the slot and publication the service made (ones the user named are left).

The DSN is a secret: it reaches the catalog and the job's worker, never an answer or a
log (``upstream_host`` is what people see).
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg2
import psycopg2.extensions
from sqlalchemy import delete, select
from sqlalchemy.exc import IntegrityError

from backfill_core.schema import SchemaError, TableSchema, validate_identifier
from connectors import pg_cdc as cdc
from service.catalog import events, idempotency, reader_views
from service.catalog.models import MAIN_GRAPH_ID, CdcTable, Job, JobProgress, Relation
from service.catalog.queries import get_relation, readers_of, storage_of
from service.db import Database, raw_cursor
from service.errors import Conflict, Invalid, ServiceError
from service.meta.indexer import stop_build
from service.meta.scheduler import place_job_actors

log = logging.getLogger(__name__)

# connector error code -> (status class, the body's field it is about)
_FIELDS = {
    cdc.TableNotFound.code: "postgres.table",
    cdc.NoPrimaryKey.code: "postgres.table",
    cdc.UnsupportedColumn.code: "postgres.table",
    cdc.PublicationMismatch.code: "postgres.publication",
    cdc.SlotMismatch.code: "postgres.slot",
}


@dataclass(frozen=True)
class CdcSpec:
    dsn: str
    table: str
    publication: str | None = None
    slot: str | None = None


@dataclass(frozen=True)
class CdcInfo:
    """What answers show of a CDC table (no DSN)."""

    host: str
    table: str
    publication: str
    slot: str
    job_id: int | None
    state: str
    lsn: int
    chunks: int
    row_count: int
    slot_lag_bytes: int | None
    confirmed_lsn: int | None


def _info(row: CdcTable) -> CdcInfo:
    return CdcInfo(
        row.upstream_host,
        row.upstream,
        row.publication,
        row.slot,
        row.job_id,
        row.state,
        int(row.lsn),
        int(row.chunks),
        int(row.row_count),
        row.slot_lag_bytes,
        row.confirmed_lsn,
    )


def host_of(dsn: str) -> str:
    """``host:port/db`` of a DSN (what people see of it); 422 when it does not parse,
    without echoing it."""
    try:
        parts = psycopg2.extensions.parse_dsn(dsn)
    except psycopg2.Error:
        raise Invalid(
            "postgres.dsn is not a libpq connection string or URI", {"field": "postgres.dsn"}
        ) from None
    host = parts.get("host") or "localhost"
    port = parts.get("port") or "5432"
    return f"{host}:{port}/{parts.get('dbname') or parts.get('user') or ''}"


def _scrub(text: str, dsn: str) -> str:
    """An upstream error's text without the DSN's password."""
    try:
        password = psycopg2.extensions.parse_dsn(dsn).get("password")
    except psycopg2.Error:
        password = None
    if password:
        text = text.replace(password, "***")
    return text.replace(dsn, "<dsn>")


def as_service_error(e: cdc.PgCdcError, dsn: str) -> ServiceError:
    """A connector error as the API's: told apart by ``code``, never by text."""
    message = _scrub(str(e), dsn)
    if e.code == cdc.UpstreamUnreachable.code:
        # as a Kafka source's unreachable broker: the request's address is at fault
        return Invalid(message, {"field": "postgres.dsn"}, code=e.code)
    details: dict[str, Any] = {"field": _FIELDS.get(e.code, "postgres")}
    if isinstance(e, cdc.UnsupportedColumn):
        details |= {"column": e.column, "type": e.type_name}
    return Invalid(message, details, code=e.code)


@contextmanager
def _upstream(dsn: str) -> Iterator[Any]:
    try:
        conn = cdc.connect(dsn)
    except cdc.PgCdcError as e:
        raise as_service_error(e, dsn) from None
    try:
        yield conn
    except cdc.PgCdcError as e:
        raise as_service_error(e, dsn) from None
    finally:
        conn.close()


def _name(value: str | None, field: str) -> str | None:
    if value is None:
        return None
    try:
        return validate_identifier(value, field)
    except SchemaError as e:
        raise Invalid(e.message, {"field": field}) from None


def create_cdc_table(
    db: Database,
    name: str,
    spec: CdcSpec,
    vnode_count: int,
    claim: idempotency.Claim | None = None,
) -> Relation:
    try:
        validate_identifier(name, "table name")
    except SchemaError as e:
        raise Invalid(e.message, {"field": "name"}) from None
    try:
        ref = cdc.TableRef.parse(spec.table)
    except SchemaError as e:
        raise Invalid(e.message, {"field": "postgres.table"}) from None
    publication = _name(spec.publication, "postgres.publication")
    slot = _name(spec.slot, "postgres.slot")
    host = host_of(spec.dsn)
    with db.transaction() as s:  # a clear 409 before the upstream is touched
        if s.execute(select(Relation.id).where(Relation.name == name)).first():
            raise Conflict(f"table {name!r} already exists", {"name": name})
    with _upstream(spec.dsn) as conn:
        table = cdc.introspect(conn, ref)  # every check that writes nothing comes first
        if publication is not None:
            cdc.ensure_publication(conn, table, publication, create=False)
        if slot is not None and cdc.slot_state(conn, slot) is None:
            raise Invalid(f"no slot {slot!r} on the upstream", {"field": "postgres.slot"})
        schema = TableSchema.build(
            table.schema.columns, table.schema.primary_key, None, vnode_count
        )
        total = cdc.row_estimate(conn, table)  # the backfill's progress total
        made_pub = made_slot = False
        pub_name = slot_name = ""
        try:
            try:
                with db.transaction() as s:
                    if claim is not None:
                        idempotency.claim(s, claim)
                    if s.execute(select(Relation.id).where(Relation.name == name)).first():
                        raise Conflict(f"table {name!r} already exists", {"name": name})
                    rel = Relation(
                        name=name,
                        kind="table",
                        schema=schema.to_json(),
                        storage_table=name,
                        graph_id=MAIN_GRAPH_ID,
                        epoch_indexed=False,  # built after its backfill, as an MV's
                    )
                    s.add(rel)
                    s.flush()
                    storage_of(rel).create(raw_cursor(s), epoch_index=False)
                    reader_views.create_view_of(raw_cursor(s), rel)
                    # service-named: the relation's id and a random part (several catalogs
                    # may share an upstream server, whose slot names are server-wide)
                    own = f"backfill_t{rel.id}_{secrets.token_hex(4)}"
                    pub_name, slot_name = publication or own, slot or own
                    cdc.ensure_replica_identity_full(conn, table)
                    made_pub = cdc.ensure_publication(conn, table, pub_name)
                    start = cdc.ensure_slot(conn, slot_name)
                    made_slot = slot is None
                    job = Job(
                        name=f"cdc_{name}",
                        kind="cdc",
                        state="creating",
                        paused=False,
                        rate_limit=None,
                        parallelism=1,
                        mv_relation_id=rel.id,
                        columns=list(schema.names),
                        filter=None,
                        graph_id=MAIN_GRAPH_ID,
                    )
                    s.add(job)
                    s.flush()
                    s.add(
                        CdcTable(
                            relation_id=rel.id,
                            job_id=job.id,
                            dsn=spec.dsn,
                            upstream=str(ref),
                            upstream_host=host,
                            publication=pub_name,
                            slot=slot_name,
                            created_publication=made_pub,
                            created_slot=made_slot,
                            start_lsn=start,
                            state="backfilling",
                            current_pos=None,
                            lsn=start,
                            row_count=0,
                            chunks=0,
                        )
                    )
                    place_job_actors(s, job, schema.vnode_count)
                    s.add(JobProgress(job_id=job.id, total_estimate=total))
                    events.record(s, "job_created", job.id, name=job.name, backfill="cdc")
                    idempotency.created(s, claim, {"table": name})
                    return rel
            except IntegrityError:  # (not logged: a failing row's text would hold the DSN)
                raise Conflict(
                    f"a table or job named {name!r} (or cdc_{name}) already exists",
                    {"name": name},
                ) from None
        except BaseException:
            # the catalog wrote nothing: neither does the upstream keep what was made
            if made_slot:
                cdc.drop_slot(conn, slot_name)
            if made_pub:
                cdc.drop_publication(conn, pub_name)
            raise


def cdc_of(db: Database, relation_ids: list[int]) -> dict[int, CdcInfo]:
    with db.transaction() as s:
        rows = s.execute(select(CdcTable).where(CdcTable.relation_id.in_(relation_ids))).scalars()
        return {r.relation_id: _info(r) for r in rows}


def is_mirrored(s: Any, relation_id: int) -> bool:
    return s.get(CdcTable, relation_id) is not None


def drop_cdc_table(db: Database, rel_name: str) -> bool:
    """Drop a CDC table (False: ``rel_name`` is no CDC table): its job, the table, and
    the slot and publication the service made. The upstream is reached first (a 4xx
    and nothing dropped when it cannot be); the slot is dropped once the catalog
    committed (the worker lets go of it as its actor goes; ``drop_slot`` ends the
    connection that still holds it)."""
    with db.transaction() as s:
        rel = get_relation(s, rel_name)
        row = s.get(CdcTable, rel.id)
        if row is None:
            return False
        dsn, slot, pub = row.dsn, row.slot, row.publication
        made_slot, made_pub = row.created_slot, row.created_publication
    with _upstream(dsn) if made_slot or made_pub else _nothing() as conn:
        with db.transaction() as s:
            rel = get_relation(s, rel_name, lock=True)
            row = s.get(CdcTable, rel.id)
            if row is None:
                return False
            readers = readers_of(s, rel.id)
            if readers:
                raise Conflict(
                    f"table {rel_name!r} is read by job(s) {', '.join(readers)}",
                    {"jobs": readers},
                )
            if row.job_id is not None:
                s.execute(delete(JobProgress).where(JobProgress.job_id == row.job_id))
                job = s.get(Job, row.job_id)
                if job is not None:
                    events.record(s, "dropped", job.id)
                    s.delete(job)
            s.delete(row)
            s.flush()
            if not rel.epoch_indexed:
                stop_build(raw_cursor(s), rel.id)  # a build would hold the drop up
            reader_views.drop_view_of(raw_cursor(s), rel)
            storage_of(rel).drop(raw_cursor(s))
            s.delete(rel)
        if made_slot:
            cdc.drop_slot(conn, slot)
        if made_pub:
            cdc.drop_publication(conn, pub)
    return True


@contextmanager
def _nothing() -> Iterator[Any]:
    yield None


@dataclass(frozen=True)
class CdcJobProgress:
    table_name: str
    upstream: str
    state: str
    chunks: int
    row_count: int
    lsn: str
    confirmed_lsn: str | None
    slot_lag_bytes: int | None


def progress_of_job(db: Database, job_id: int) -> CdcJobProgress | None:
    """A CDC table's job's durable progress (None: the job is no CDC table's)."""
    with db.transaction() as s:
        found = s.execute(
            select(CdcTable, Relation.name)
            .join(Relation, Relation.id == CdcTable.relation_id)
            .where(CdcTable.job_id == job_id)
        ).first()
        if found is None:
            return None
        row, name = found
        return CdcJobProgress(
            name,
            row.upstream,
            row.state,
            int(row.chunks),
            int(row.row_count),
            cdc.format_lsn(int(row.lsn)),
            None if row.confirmed_lsn is None else cdc.format_lsn(int(row.confirmed_lsn)),
            row.slot_lag_bytes,
        )
