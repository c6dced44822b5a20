"""The upstream Postgres as the CDC connector sees it: connecting, the table's schema
from its catalog, the server's readiness for logical replication, the publication, the
slot (and its lag) and the table's replica identity.

Every name reaching SQL is validated (``validate_identifier``) and quoted
(``psycopg2.sql``); values travel as parameters. Creating and dropping are idempotent,
so a retry or a recovery may run them again.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Final, ParamSpec, TypeVar

import psycopg2
import psycopg2.errors
import psycopg2.extras
from psycopg2 import sql
from psycopg2.extensions import connection as PgConnection

from backfill_core.changes import Row
from backfill_core.schema import Column, SchemaError, TableSchema, validate_identifier

from .errors import (
    InsufficientPrivilege,
    LogicalReplicationOff,
    NoPrimaryKey,
    PublicationMismatch,
    ReplicaIdentityNotFull,
    SlotMismatch,
    TableNotFound,
    UnsupportedColumn,
    UpstreamTooOld,
    UpstreamUnreachable,
)
from .values import SESSION_OPTIONS, TYPES

__all__ = [
    "CONNECT_TIMEOUT_S",
    "SlotState",
    "TableRef",
    "UpstreamTable",
    "check_server",
    "connect",
    "drop_publication",
    "drop_slot",
    "ensure_publication",
    "ensure_replica_identity_full",
    "ensure_slot",
    "format_lsn",
    "introspect",
    "parse_lsn",
    "reachable",
    "upstream_call",
    "slot_state",
]

CONNECT_TIMEOUT_S: Final = 5
APPLICATION_NAME: Final = "mv-backfill-cdc"
MIN_SERVER_VERSION: Final = 130000
_T = TypeVar("_T")
_P = ParamSpec("_P")


def parse_lsn(text: str) -> int:
    """``'16/B374D848'`` -> its byte position."""
    hi, lo = text.split("/")
    return (int(hi, 16) << 32) | int(lo, 16)


def format_lsn(lsn: int) -> str:
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def connect(dsn: str, **kwargs: Any) -> PgConnection:
    """A connection to the upstream with our session settings (``SESSION_OPTIONS``),
    autocommit, a connect deadline; ``UpstreamUnreachable`` when it cannot be made."""
    try:
        conn = psycopg2.connect(
            dsn,
            options=SESSION_OPTIONS,
            connect_timeout=CONNECT_TIMEOUT_S,
            application_name=APPLICATION_NAME,
            **kwargs,
        )
    except psycopg2.OperationalError as e:
        raise UpstreamUnreachable(f"cannot connect to the upstream Postgres: {e}") from e
    if not isinstance(conn, psycopg2.extras.LogicalReplicationConnection):
        conn.autocommit = True  # a replication connection is, and may not be set
    return conn


@contextmanager
def reachable(what: str) -> Iterator[None]:
    """A connection that broke (or could not be used) during ``what`` as
    ``UpstreamUnreachable``: the caller connects again and retries, all of it idempotent."""
    try:
        yield
    except (psycopg2.OperationalError, psycopg2.InterfaceError) as e:
        raise UpstreamUnreachable(f"the upstream connection broke during {what}: {e}") from e


def upstream_call(fn: Callable[_P, _T]) -> Callable[_P, _T]:
    """``fn`` with a broken connection raised as ``UpstreamUnreachable`` (``reachable``)."""

    @functools.wraps(fn)
    def call(*args: _P.args, **kwargs: _P.kwargs) -> _T:
        with reachable(fn.__name__):
            return fn(*args, **kwargs)

    return call


@contextmanager
def _privileged(what: str) -> Iterator[None]:
    """Postgres's insufficient_privilege (42501) as ours."""
    try:
        yield
    except psycopg2.errors.InsufficientPrivilege as e:
        raise InsufficientPrivilege(f"the upstream role may not {what}: {e}") from e


def _one(conn: PgConnection, query: sql.Composable | str, params: Any = None) -> Any:
    with conn.cursor() as cur:
        cur.execute(query, params)
        return cur.fetchone()


@dataclass(frozen=True, slots=True)
class TableRef:
    """An upstream table, ``schema.name``; both parts are identifiers of ours."""

    schema: str
    name: str

    @classmethod
    def parse(cls, text: str) -> TableRef:
        """``"schema.table"`` or ``"table"`` (schema ``public``)."""
        parts = text.split(".") if isinstance(text, str) else [text]
        if len(parts) == 1:
            parts = ["public", *parts]
        if len(parts) != 2:
            raise SchemaError(f"expected schema.table, got {text!r}", "table")
        return cls(
            validate_identifier(parts[0], "upstream schema"),
            validate_identifier(parts[1], "upstream table"),
        )

    @property
    def sql(self) -> sql.Composed:
        return sql.SQL(".").join([sql.Identifier(self.schema), sql.Identifier(self.name)])

    def __str__(self) -> str:
        return f"{self.schema}.{self.name}"


@dataclass(frozen=True)
class UpstreamTable:
    """The upstream table mapped to our schema: columns in the upstream's order
    (generated columns left out: logical replication does not send them)."""

    ref: TableRef
    oid: int
    schema: TableSchema
    type_oids: tuple[int, ...]
    replica_identity: str  # pg_class.relreplident: 'd', 'n', 'f' or 'i'

    @property
    def key_indices(self) -> tuple[int, ...]:
        return tuple(self.schema.index_of(k) for k in self.schema.primary_key)

    def key_of(self, row: Row) -> Row:
        """A row's primary key (the executor's ``key_of``)."""
        return tuple(row[i] for i in self.key_indices)


@upstream_call
def check_server(conn: PgConnection) -> None:
    """``UpstreamTooOld`` before Postgres 13; ``LogicalReplicationOff`` unless wal_level
    is logical with slots and senders;
    ``InsufficientPrivilege`` unless the role may replicate."""
    if conn.server_version < MIN_SERVER_VERSION:
        raise UpstreamTooOld(
            f"the upstream runs Postgres {conn.server_version}; CDC needs 13 or later"
        )
    level, slots, senders = _one(
        conn,
        "SELECT current_setting('wal_level'), current_setting('max_replication_slots')::int,"
        " current_setting('max_wal_senders')::int",
    )
    if level != "logical" or slots <= 0 or senders <= 0:
        raise LogicalReplicationOff(
            f"the upstream is not set up for logical replication (wal_level = {level}, "
            f"max_replication_slots = {slots}, max_wal_senders = {senders}): set "
            "wal_level = logical, max_replication_slots and max_wal_senders above 0 "
            "(each CDC table takes one of each) and restart it"
        )
    (may,) = _one(
        conn, "SELECT rolsuper OR rolreplication FROM pg_roles WHERE rolname = current_user"
    )
    if not may:
        raise InsufficientPrivilege(
            "the upstream role needs the REPLICATION attribute (ALTER ROLE ... REPLICATION)"
        )


_TABLE = """
SELECT c.oid, c.relkind, c.relreplident, has_table_privilege(c.oid, 'SELECT')
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = %s AND c.relname = %s
"""
_COLUMNS = """
SELECT a.attname, t.typname, tn.nspname, format_type(a.atttypid, a.atttypmod),
       a.atttypid, a.attnotnull
FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid
JOIN pg_namespace tn ON tn.oid = t.typnamespace
WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = ''
ORDER BY a.attnum
"""
_PRIMARY_KEY = """
SELECT a.attname FROM pg_index i
CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord)
JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
WHERE i.indrelid = %s AND i.indisprimary ORDER BY k.ord
"""


@upstream_call
def introspect(conn: PgConnection, ref: TableRef) -> UpstreamTable:
    """The table's schema as ours, after checking the server and the role
    (``check_server``). Errors: ``TableNotFound``, ``NoPrimaryKey``,
    ``UnsupportedColumn`` (naming the column and its type), ``InsufficientPrivilege``,
    ``LogicalReplicationOff``."""
    check_server(conn)
    found = _one(conn, _TABLE, [ref.schema, ref.name])
    if found is None or found[1] != "r":
        what = "no table" if found is None else "not a plain table"
        raise TableNotFound(f"{what} {ref} on the upstream")
    oid, _, ident, may_select = found
    if not may_select:
        raise InsufficientPrivilege(f"the upstream role may not SELECT from {ref}")
    with conn.cursor() as cur:
        cur.execute(_COLUMNS, [oid])
        cols = cur.fetchall()
        cur.execute(_PRIMARY_KEY, [oid])
        pk = tuple(r[0] for r in cur.fetchall())
    if not pk:
        raise NoPrimaryKey(f"{ref} has no primary key: a CDC table is keyed by it")
    columns = []
    for name, typname, typns, shown, _, notnull in cols:
        t = TYPES.get(typname) if typns == "pg_catalog" else None
        if t is None:
            raise UnsupportedColumn(
                f"column {name!r} of {ref} has type {shown}, which has no counterpart "
                f"here (mapped: {', '.join(sorted(TYPES))})",
                name,
                shown,
            )
        if name in pk and not t.keyable:
            raise UnsupportedColumn(
                f"key column {name!r} of {ref}: {shown} cannot be a key of ours", name, shown
            )
        columns.append(Column(name, t, not notnull))
    try:
        schema = TableSchema.build(columns, pk)
    except SchemaError as e:  # a column name that is not an identifier of ours
        bad = next((c for c in columns if not _ours(c.name)), columns[0])
        shown = next(c[3] for c in cols if c[0] == bad.name)
        raise UnsupportedColumn(f"{ref}: {e}", bad.name, shown) from e
    return UpstreamTable(ref, oid, schema, tuple(c[4] for c in cols), ident)


def _ours(name: str) -> bool:
    try:
        validate_identifier(name)
    except SchemaError:
        return False
    return True


@upstream_call
def ensure_replica_identity_full(
    conn: PgConnection, table: UpstreamTable, *, alter: bool = True
) -> None:
    """Make (``alter``; it needs the table's ownership and takes its lock a moment) or
    check the table's REPLICA IDENTITY FULL: updates then carry the whole old row, out
    of line (TOASTed) values included, from which the stream fills the new row's
    unchanged TOASTed values (pgoutput sends a marker for those, not the value)."""
    (ident,) = _one(conn, "SELECT relreplident FROM pg_class WHERE oid = %s", [table.oid])
    if ident == "f":
        return
    if not alter:
        raise ReplicaIdentityNotFull(
            f"{table.ref} has REPLICA IDENTITY {ident!r}: set ALTER TABLE ... REPLICA IDENTITY FULL"
        )
    with _privileged(f"alter {table.ref} (REPLICA IDENTITY FULL needs its ownership)"):
        _one_exec(conn, sql.SQL("ALTER TABLE {} REPLICA IDENTITY FULL").format(table.ref.sql))


def _one_exec(conn: PgConnection, query: sql.Composable) -> None:
    with conn.cursor() as cur:
        cur.execute(query)


_PUBLICATION = """
SELECT p.pubinsert AND p.pubupdate AND p.pubdelete AND p.pubtruncate,
       pt.tablename IS NOT NULL, pt.rowfilter IS NULL,
       pt.attnames IS NULL OR pt.attnames @> %s::name[]
FROM pg_publication p
LEFT JOIN pg_publication_tables pt
  ON pt.pubname = p.pubname AND pt.schemaname = %s AND pt.tablename = %s
WHERE p.pubname = %s
"""

# before Postgres 15 a publication has no row filter and no column list
_PUBLICATION_BEFORE_15 = _PUBLICATION.replace("pt.rowfilter IS NULL", "true").replace(
    "pt.attnames IS NULL OR pt.attnames @> %s::name[]", "%s::name[] IS NOT NULL"
)


@upstream_call
def ensure_publication(
    conn: PgConnection, table: UpstreamTable, name: str, *, create: bool = True
) -> bool:
    """Make sure publication ``name`` publishes every change to every column of the
    table: create it (``create``; it needs the table's ownership) or check an existing
    one (``PublicationMismatch`` if it leaves the table, a column or a kind of change
    out, or filters rows). Returns whether it was created now."""
    validate_identifier(name, "publication name")
    for _ in range(2):
        query = _PUBLICATION if conn.server_version >= 150000 else _PUBLICATION_BEFORE_15
        found = _one(
            conn, query, [list(table.schema.names), table.ref.schema, table.ref.name, name]
        )
        if found is not None:
            all_ops, covers, no_filter, all_cols = found
            if not (all_ops and covers and no_filter and all_cols):
                raise PublicationMismatch(
                    f"publication {name!r} does not publish every insert, update, delete and "
                    f"truncate of every column and row of {table.ref}"
                )
            return False
        if not create:
            raise PublicationMismatch(f"no publication {name!r} on the upstream")
        try:
            with _privileged(f"create a publication of {table.ref} (it needs its ownership)"):
                _one_exec(
                    conn,
                    sql.SQL("CREATE PUBLICATION {} FOR TABLE {}").format(
                        sql.Identifier(name), table.ref.sql
                    ),
                )
            return True
        except psycopg2.errors.DuplicateObject:
            continue  # made meanwhile (a retry racing another): check it
    raise PublicationMismatch(f"publication {name!r} appeared and vanished")  # pragma: no cover


@upstream_call
def drop_publication(conn: PgConnection, name: str) -> None:
    validate_identifier(name, "publication name")
    with _privileged(f"drop publication {name!r}"):
        _one_exec(conn, sql.SQL("DROP PUBLICATION IF EXISTS {}").format(sql.Identifier(name)))


@dataclass(frozen=True, slots=True)
class SlotState:
    """A slot as ``pg_replication_slots`` shows it; ``lag_bytes``: the WAL between the
    server's current LSN and the slot's confirmed one (what the slot keeps, roughly)."""

    name: str
    active_pid: int | None
    confirmed_flush_lsn: int
    restart_lsn: int
    lag_bytes: int


_SLOT = """
SELECT s.plugin, s.slot_type, s.database = current_database(), s.active_pid,
       (s.confirmed_flush_lsn - '0/0')::bigint, (s.restart_lsn - '0/0')::bigint,
       (pg_current_wal_lsn() - s.confirmed_flush_lsn)::bigint
FROM pg_replication_slots s WHERE s.slot_name = %s
"""


@upstream_call
def row_estimate(conn: PgConnection, table: UpstreamTable) -> int:
    """The table's rows as the upstream's statistics tell, for a CDC backfill's progress
    total; counted when the table was never analyzed (then it is likely small)."""
    (estimate,) = _one(conn, "SELECT reltuples::bigint FROM pg_class WHERE oid = %s", [table.oid])
    if estimate is not None and estimate >= 0:
        return int(estimate)
    query = sql.SQL("SELECT count(*) FROM {}.{}").format(
        sql.Identifier(table.ref.schema), sql.Identifier(table.ref.name)
    )
    return int(_one(conn, query)[0])


@upstream_call
def slot_state(conn: PgConnection, name: str) -> SlotState | None:
    """The slot's state, or None when there is no such slot."""
    found = _one(conn, _SLOT, [name])
    if found is None:
        return None
    plugin, kind, here, pid, confirmed, restart, lag = found
    if (plugin, kind, here) != ("pgoutput", "logical", True):
        raise SlotMismatch(
            f"slot {name!r} is a {kind} slot of plugin {plugin!r}"
            + ("" if here else " in another database")
            + ", not a pgoutput slot of this database"
        )
    return SlotState(name, pid, confirmed, restart, max(0, lag))


@upstream_call
def ensure_slot(conn: PgConnection, name: str) -> int:
    """Create logical slot ``name`` with ``pgoutput`` unless it exists; returns its
    confirmed LSN (for a new slot, its consistent point: the stream starts there, and
    a backfill starting with it reads everything committed after). Creating waits for
    the transactions running on the upstream to end."""
    validate_identifier(name, "slot name")
    for _ in range(2):
        state = slot_state(conn, name)
        if state is not None:
            return state.confirmed_flush_lsn
        try:
            with _privileged("create a replication slot (it needs REPLICATION)"):
                (lsn,) = _one(
                    conn,
                    "SELECT (lsn - '0/0')::bigint "
                    "FROM pg_create_logical_replication_slot(%s, 'pgoutput')",
                    [name],
                )
            return int(lsn)
        except psycopg2.errors.DuplicateObject:
            continue
    raise SlotMismatch(f"slot {name!r} appeared and vanished")  # pragma: no cover


@upstream_call
def drop_slot(conn: PgConnection, name: str, *, timeout_s: float = 10.0) -> None:
    """Drop slot ``name`` if it exists, ending the replication connection that holds it
    (our stream: a slot is the service's own)."""
    validate_identifier(name, "slot name")
    deadline = time.monotonic() + timeout_s
    while True:
        state = slot_state(conn, name)
        if state is None:
            return
        try:
            if state.active_pid is not None:
                _one(conn, "SELECT pg_terminate_backend(%s)", [state.active_pid])
            with _privileged(f"drop slot {name!r}"):
                _one(conn, "SELECT pg_drop_replication_slot(%s)", [name])
            return
        except (psycopg2.errors.ObjectInUse, psycopg2.errors.UndefinedObject):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)  # the terminated walsender lets go of the slot
