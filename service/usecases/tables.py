"""Use cases for tables: create, list, drop, DML at the open epoch, reads at an epoch.

Each function owns its transaction: everything it writes (catalog rows, the versioned
table, DML versions) commits together or not at all.
"""

from __future__ import annotations

import base64
import binascii
import json
import operator
import re
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import msgspec
import psycopg2
import psycopg2.errors
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from backfill_core.changes import Row, Version
from backfill_core.schema import ColumnType, SchemaError, TableSchema, validate_identifier
from service.catalog import idempotency, reader_views
from service.catalog.models import MAIN_GRAPH_ID, CdcTable, Relation
from service.catalog.queries import (
    add_row_count_delta,
    committed_epoch,
    get_relation,
    readers_of,
    storage_of,
)
from service.clock import Clock
from service.db import Database, raw_cursor, retry_deadlocks
from service.errors import BadRequest, Conflict, Gone, Invalid, ServiceError, Timeout
from service.meta.epochs import table_write_epoch, wait_committed
from service.meta.indexer import stop_build
from service.meta.signal import BarrierSignal

# a ``?wait=true`` DML asks for main rounds when barriers are further apart than this
# (with ten-minute barriers it would wait out its 30 s and answer 504); with barriers
# closer, the next one is soon and many waiting clients would only add rounds
ASK_ROUNDS_OVER_MS = 1_000
ASK_AGAIN_S = 0.5  # a round asked for may commit nothing (checkpoints every n barriers)


class DmlOp(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    """One op of a DML body; a msgspec struct, so that a JSON body decodes straight into
    its ops (``service.api.dml_bodies.json_ops``). Made in Python, nothing is checked:
    ``_parse_ops`` refuses an unknown op."""

    op: Literal["insert", "update", "delete"]
    row: dict[str, Any]


@dataclass(frozen=True)
class RowsPage:
    epoch: int
    rows: list[dict[str, Any]]
    next: str | None


def create_table(
    db: Database,
    name: str,
    schema: TableSchema,
    kind: str = "table",
    claim: idempotency.Claim | None = None,
) -> Relation:
    try:
        validate_identifier(name, "table name")
    except SchemaError as e:
        raise Invalid(e.message, {"field": "name"}) from None
    try:
        with db.transaction() as s:
            if claim is not None:
                idempotency.claim(s, claim)
            if s.execute(select(Relation.id).where(Relation.name == name)).first():
                raise Conflict(f"table {name!r} already exists", {"name": name})
            rel = Relation(
                name=name,
                kind=kind,
                schema=schema.to_json(),
                storage_table=name,
                graph_id=MAIN_GRAPH_ID,
                epoch_indexed=False,  # built after its first write (service.meta.indexer)
            )
            s.add(rel)
            s.flush()
            storage_of(rel).create(raw_cursor(s), epoch_index=False)
            reader_views.create_view_of(raw_cursor(s), rel)
            idempotency.created(s, claim, {"table": name})
            return rel
    except IntegrityError:
        # a concurrent create of the same name won the race
        raise Conflict(f"table {name!r} already exists", {"name": name}) from None


def list_tables(db: Database) -> list[Relation]:
    with db.transaction() as s:
        return list(s.execute(select(Relation).order_by(Relation.name)).scalars())


def get_table(db: Database, name: str) -> Relation:
    with db.transaction() as s:
        return get_relation(s, name)


def drop_table(db: Database, name: str) -> None:
    from service.usecases.cdc import drop_cdc_table  # it builds on this module's peers

    if drop_cdc_table(db, name):
        return
    with db.transaction() as s:
        rel = get_relation(s, name, lock=True)
        if rel.kind != "table":
            raise Conflict(f"{name!r} is the view of a job: delete the job instead", {"name": name})
        names = readers_of(s, rel.id)
        if names:
            raise Conflict(f"table {name!r} is read by job(s) {', '.join(names)}", {"jobs": names})
        if not rel.epoch_indexed:
            stop_build(raw_cursor(s), rel.id)  # a build would hold the drop up
        reader_views.drop_view_of(raw_cursor(s), rel)
        storage_of(rel).drop(raw_cursor(s))
        s.delete(rel)


# (position -> the prefix of an error's message and its details): ``ops[i]`` and the
# op's index in a JSON body, ``line n`` and the line in a bulk body
Where = Callable[[int], tuple[str, dict[str, Any]]]
# an op read against the schema: (position, op, key, row), the row an insert's values in
# column order (a tuple), an update's columns given (a dict), a delete's nothing ({})
Parsed = tuple[int, str, Row, Any]
# ops of a bulk body checked and written together (their keys looked up in one query)
BULK_BATCH = 20_000


def at_index(index: int) -> tuple[str, dict[str, Any]]:
    return f"ops[{index}]", {"index": index}


def at_line(line: int) -> tuple[str, dict[str, Any]]:
    return f"line {line}", {"line": line}


@retry_deadlocks
def apply_dml(db: Database, name: str, ops: Sequence[DmlOp], clock: Clock) -> tuple[int, int]:
    """Apply a batch atomically at the open epoch; returns (epoch, count)."""
    with db.transaction() as s:
        writer = _DmlWriter(s, name, clock)
        writer.apply(_parse_ops(writer.schema, enumerate(ops), at_index), at_index)
        return writer.finish(), len(ops)


@retry_deadlocks
def apply_bulk_dml(
    db: Database,
    name: str,
    read_ops: Callable[[TableSchema], Iterable[tuple[int, DmlOp]]],
    clock: Clock,
) -> tuple[int, int]:
    """Apply the ops of a bulk body (``(line, op)`` pairs from ``read_ops(schema)``, which
    raises a 4xx naming the line of one it cannot read) atomically at the open epoch, in
    batches of ``BULK_BATCH``: a batch's lookups see the batches written before it in the
    same transaction. Returns (epoch, count)."""
    with db.transaction() as s:
        writer = _DmlWriter(s, name, clock)
        count = 0
        batch: list[tuple[int, DmlOp]] = []
        for item in read_ops(writer.schema):
            batch.append(item)
            if len(batch) == BULK_BATCH:
                writer.apply(_parse_ops(writer.schema, batch, at_line), at_line)
                count += len(batch)
                batch = []
        if batch:
            writer.apply(_parse_ops(writer.schema, batch, at_line), at_line)
            count += len(batch)
        if not count:
            raise Invalid("the body holds no ops", {"line": 1})
        return writer.finish(), count


class CsvBlockLike(Protocol):
    """Records of a CSV body (``service.api.dml_bodies.CsvBlock``)."""

    lines: Sequence[int]
    keys: Sequence[Sequence[Any]]
    texts: Sequence[bytes]
    nonfinite_possible: bool


class CsvRowsLike(Protocol):
    """A CSV body's rows (``service.api.dml_bodies.CsvRows``)."""

    header: list[str]
    not_null: list[str]
    blocks: Iterator[CsvBlockLike]

    def records(self) -> Iterator[tuple[int, Row, bytes]]: ...


@retry_deadlocks
def apply_csv_inserts(
    db: Database, name: str, read_csv: Callable[[TableSchema], CsvRowsLike], clock: Clock
) -> tuple[int, int]:
    """Insert the rows of a CSV body atomically at the open epoch, with one COPY of its
    records into the table (Postgres reads the values: docs/api.md#bulk-dml); a record
    that does not fit, or a key that exists, is a 4xx naming its line and writes nothing.
    Returns (epoch, count)."""
    with db.transaction() as s:
        writer = _DmlWriter(s, name, clock)
        table, cur, epoch, schema = writer.table, writer.cur, writer.epoch, writer.schema
        cur.execute("SET LOCAL TimeZone = 'UTC'")  # a timestamptz without an offset is UTC
        # no earlier version of any key in an empty table; versions at the open epoch (an
        # earlier batch's) would clash with the COPY's, which then goes to a staging table
        had_rows, had_epoch = table.has_versions(cur, epoch)
        copied: _Copied | None = None
        # a first load into an empty table that no job reads builds the key index after
        # its rows, in one sort; a key written twice takes that load back, and the
        # ordinary COPY then names its line
        first_load = not had_rows and not readers_of(s, writer.rel.id)
        if first_load and table.drop_key_index_for_load(cur):
            try:
                copied = _copy_csv(table, cur, epoch, read_csv, schema, None, first_load=True)
                table.build_key_index(cur)
            except psycopg2.errors.UniqueViolation:
                table.restore_key_index(cur)
                copied = None
        staging = table.create_staging(cur) if had_epoch else None
        copy = copied or _copy_csv(table, cur, epoch, read_csv, schema, staging)
        if not copy.lines:
            raise Invalid("the body holds no rows", {"line": 1})
        if copy.nonfinite_possible:
            _check_finite(cur, table, schema, copy.header, epoch, staging, read_csv)
        if had_rows:
            conflict = table.first_live_key(cur, epoch, staging)
            if conflict is not None:
                line = _line_of(read_csv, schema, conflict)
                raise Conflict(
                    f"line {line}: insert of a key that already exists",
                    {"line": line, "key": list(conflict)},
                )
        if staging is not None:
            table.insert_from(cur, staging)
        writer.delta = len(copy.lines)
        return writer.finish(), len(copy.lines)


@dataclass
class _Copied:
    """What ``_copy_csv`` sent."""

    header: list[str]  # the body's
    lines: list[int] = field(default_factory=list)  # of its records, in the COPY's order
    nonfinite_possible: bool = False  # of some block (``CsvBlock``)


def _copy_csv(
    table: Any,
    cur: Any,
    epoch: int,
    read_csv: Callable[[TableSchema], CsvRowsLike],
    schema: TableSchema,
    staging: Any,
    *,
    first_load: bool = False,
) -> _Copied:
    """One COPY of the body's records into the table (or ``staging``). A record that does
    not fit is the 4xx naming its line."""
    rows = read_csv(schema)
    copied = _Copied(rows.header)
    failed: list[ServiceError] = []

    def blocks() -> Iterator[tuple[Sequence[int], Sequence[Sequence[Any]], Sequence[bytes]]]:
        try:
            for block in rows.blocks:
                copied.nonfinite_possible |= block.nonfinite_possible
                yield block.lines, block.keys, block.texts
        except ServiceError as e:  # the driver would only say that read() failed
            failed.append(e)
            raise

    try:
        table.copy_csv_rows(
            cur,
            epoch,
            rows.header,
            blocks(),
            copied.lines,
            first_load=first_load,
            force_not_null=rows.not_null,
            into=staging,
        )
    except psycopg2.Error as e:
        if failed:
            raise failed[0] from None
        raise _copy_error(e, copied.lines, read_csv, schema) from None
    return copied


_COPY_LINE = re.compile(r"COPY [^,]+, line (\d+)(?:, column (\w+))?")


def _copy_error(
    e: psycopg2.Error,
    lines: Sequence[int],
    read_csv: Callable[[TableSchema], CsvRowsLike],
    schema: TableSchema,
) -> Exception:
    """A failed COPY as the 4xx naming the body's line (Postgres names the record)."""
    diag = e.diag
    found = _COPY_LINE.search(diag.context or "")
    if found is None or not (e.pgcode or "").startswith(("22", "23")):
        return e  # not the data's fault
    record = int(found.group(1))
    line = lines[record - 1] if record <= len(lines) else 0
    if isinstance(e, psycopg2.errors.UniqueViolation):  # the key is earlier in the body
        key = _key_at(read_csv, schema, line)
        return Conflict(
            f"line {line}: insert of a key that already exists",
            {"line": line, "key": list(key) if key is not None else None},
        )
    column = found.group(2)
    where = f" (column {column!r})" if column else ""
    details: dict[str, Any] = {"line": line} | ({"column": column} if column else {})
    return Invalid(f"line {line}: {diag.message_primary}{where}", details)


def _key_at(
    read_csv: Callable[[TableSchema], CsvRowsLike], schema: TableSchema, line: int
) -> Row | None:
    return next((k for n, k, _ in read_csv(schema).records() if n == line), None)


def _line_of(read_csv: Callable[[TableSchema], CsvRowsLike], schema: TableSchema, key: Row) -> int:
    return next((n for n, k, _ in read_csv(schema).records() if k == key), 0)


def _check_finite(
    cur: Any,
    table: Any,
    schema: TableSchema,
    header: list[str],
    epoch: int,
    staging: Any,
    read_csv: Callable[[TableSchema], CsvRowsLike],
) -> None:
    """Postgres reads NaN and infinity into double and numeric columns; JSON, and so the
    service, has neither."""
    numbers = [
        n for n in header if schema.column(n).type in (ColumnType.DOUBLE, ColumnType.NUMERIC)
    ]
    if not numbers:
        return
    key = table.first_nonfinite_key(cur, epoch, numbers, staging)
    if key is not None:
        line = _line_of(read_csv, schema, key)
        raise Invalid(
            f"line {line}: NaN and infinity are not accepted", {"line": line, "key": list(key)}
        )


def refuse_mirrored(s: Any, rel: Relation) -> None:
    """409 ``table_is_mirrored`` for a CDC table: only its worker writes it (DML and
    imports would not see the epochs it writes at)."""
    if s.get(CdcTable, rel.id) is not None:
        raise Conflict(
            f"{rel.name!r} mirrors an upstream Postgres table: its rows change only there",
            {"name": rel.name},
            code="table_is_mirrored",
        )


class _DmlWriter:
    """The DML of one transaction into one table at the open epoch: ops are applied in
    batches, each checked against the rows the earlier ones left."""

    def __init__(self, s: Any, name: str, clock: Clock) -> None:
        self.session = s
        self.rel = get_relation(s, name, lock=True)  # DML on one table is serialized; drop waits
        if self.rel.kind != "table":
            raise Conflict(f"{name!r} is a materialized view and is read-only", {"name": name})
        refuse_mirrored(s, self.rel)
        self.schema = TableSchema.from_json(self.rel.schema)
        self.names = self.schema.names
        self.epoch = table_write_epoch(s, self.rel, clock())
        self.table = storage_of(self.rel)
        self.cur = raw_cursor(s)
        self.delta = 0

    def apply(self, parsed: list[Parsed], where: Where) -> None:
        if not parsed:
            return
        if all(op == "insert" for _, op, _, _ in parsed):
            self._insert(parsed, where)
            return
        names, table = self.names, self.table
        keys = list(dict.fromkeys(k for _, _, k, _ in parsed))
        state: dict[Row, Row | None] = dict.fromkeys(keys)
        state.update(table.latest_versions(self.cur, self.epoch, keys))
        before = dict(state)
        for position, op, key, row in parsed:
            current = state[key]
            if op == "insert":
                if current is not None:
                    raise _key_conflict("insert of a key that already exists", position, key, where)
                state[key] = row
            elif current is None:
                raise _key_conflict(f"{op} of a key that does not exist", position, key, where)
            elif op == "update":
                merged = dict(zip(names, current, strict=True)) | row
                state[key] = tuple(merged.get(n) for n in names)
            else:
                state[key] = None
        versions = [
            Version(row) if row is not None else Version(before[key] or (), deleted=True)
            for key, row in state.items()
            if row != before[key]
        ]
        table.write(self.cur, self.epoch, versions)
        self.delta += sum(row is not None for row in state.values()) - sum(
            row is not None for row in before.values()
        )

    def _insert(self, parsed: list[Parsed], where: Where) -> None:
        """``apply`` of inserts only (the usual batch): the keys looked up without their
        rows, each hashed once, and the rows written as they came."""
        table = self.table
        keys = [k for _, _, k, _ in parsed]
        vnodes = list(map(table.vnode_of_key, keys))
        live = table.live_keys(self.cur, self.epoch, keys, vnodes)
        if live or len(set(keys)) < len(keys):  # the first op whose key exists, in order
            seen = set(live)
            for position, _, key, _ in parsed:
                if key in seen:
                    raise _key_conflict("insert of a key that already exists", position, key, where)
                seen.add(key)
        table.write_rows(self.cur, self.epoch, keys, [r for *_, r in parsed], vnodes)
        self.delta += len(parsed)

    def finish(self) -> int:
        add_row_count_delta(self.session, self.rel.id, self.epoch, self.delta)
        return int(self.epoch)


def _key_conflict(message: str, position: int, key: Row, where: Where) -> Conflict:
    prefix, details = where(position)
    if "index" in details:  # a JSON body's conflicts say the index in the details only
        return Conflict(message, details | {"key": list(key)})
    return Conflict(f"{prefix}: {message}", details | {"key": list(key)})


def wait_readable(
    db: Database,
    epoch: int,
    timeout_s: float,
    signal: BarrierSignal | None = None,
    barrier_interval_ms: int = 0,
) -> None:
    """Return once the main graph committed ``epoch`` (a DML batch's): 504 after
    ``timeout_s``. Barriers further apart than ``ASK_ROUNDS_OVER_MS``: it asks ``signal``
    for main rounds meanwhile (until one commits), instead of waiting out the interval."""
    deadline = time.monotonic() + timeout_s
    asked = signal if barrier_interval_ms > ASK_ROUNDS_OVER_MS else None
    while True:
        left = deadline - time.monotonic()
        step = left
        if asked is not None:
            asked.request_barrier(("main",))
            step = min(left, ASK_AGAIN_S)
        if wait_committed(db, MAIN_GRAPH_ID, epoch, max(0.0, step)):
            return
        if time.monotonic() >= deadline:
            raise Timeout(
                f"epoch {epoch} was not committed within {timeout_s:.0f}s",
                {"epoch": str(epoch)},  # as in every answer (service.api.epochs)
            )


def _parse_ops(schema: TableSchema, ops: Iterable[tuple[int, DmlOp]], where: Where) -> list[Parsed]:
    out: list[Parsed] = []
    coerce_row, primary_key = schema.coerce_row, schema.primary_key
    pk = _key_getter(primary_key)
    key_of_values = _key_getter([schema.index_of(n) for n in primary_key])
    coerce_insert = schema.insert_coercer()
    row: Any
    for position, op in ops:
        try:
            if op.op == "insert":
                row = coerce_insert(op.row)
                key = key_of_values(row)
            elif op.op == "update":
                row = coerce_row(op.row, full=False)
                missing = [n for n in primary_key if n not in row]
                if missing:
                    raise SchemaError(f"update needs the key column(s): {', '.join(missing)}")
                key = pk(row)
            elif op.op == "delete":
                key = schema.coerce_key(op.row)
                row = {}
            else:
                raise SchemaError(f"unknown op {op.op!r}; expected insert, update or delete")
        except SchemaError as e:
            prefix, details = where(position)
            raise Invalid(f"{prefix}: {e.message}", details) from None
        out.append((position, op.op, key, row))
    return out


def _key_getter(at: Sequence[Any]) -> Callable[[Any], Row]:
    """The key of a row by the key columns' names (a dict) or positions (a tuple):
    ``TableSchema.pk_of`` without a generator per row."""
    if len(at) == 1:
        (one,) = at
        return lambda row: (row[one],)
    return operator.itemgetter(*at)


def readable_epoch(epoch: int | None, committed: int, gc_epoch: int) -> int:
    """The epoch a committed read happens at: 409 if not committed yet, 410 if collected.

    The details carry epochs as decimal strings, as every public answer does
    (``service.api.epochs``: JavaScript clients round larger JSON numbers)."""
    if epoch is None:
        epoch = committed
    elif epoch > committed:
        raise Conflict(
            f"epoch {epoch} is not committed yet (committed: {committed})",
            {"committed_epoch": str(committed)},
        )
    if epoch < gc_epoch:
        raise Gone(
            f"epoch {epoch} was garbage-collected (oldest readable: {gc_epoch})",
            {"oldest_readable_epoch": str(gc_epoch)},
        )
    return epoch


def read_rows(
    db: Database, name: str, epoch: int | None, limit: int, after: str | None
) -> RowsPage:
    with db.snapshot() as s:  # GC may not move between the check and the read
        rel = get_relation(s, name)
        epoch = readable_epoch(epoch, committed_epoch(s, rel.graph_id), rel.gc_epoch)
        table = storage_of(rel)
        schema = table.schema
        bound = _decode_cursor(schema, after) if after else None
        rows = table.snapshot(
            raw_cursor(s), epoch, (0, schema.vnode_count), after=bound, limit=limit + 1
        )
        more = len(rows) > limit
        rows = rows[:limit]
        nxt = _encode_cursor(schema, rows[-1]) if more else None
        return RowsPage(
            epoch,
            [schema.row_to_json(dict(zip(schema.names, r, strict=True))) for _, r in rows],
            nxt,
        )


def _encode_cursor(schema: TableSchema, last: tuple[int, Row]) -> str:
    vnode, row = last
    as_json = schema.row_to_json(dict(zip(schema.names, row, strict=True)))
    payload = json.dumps([vnode, [as_json[n] for n in schema.primary_key]], separators=(",", ":"))
    return base64.urlsafe_b64encode(payload.encode()).decode().rstrip("=")


def _decode_cursor(schema: TableSchema, cursor: str) -> tuple[int, Row]:
    try:
        raw = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        vnode, key = raw
        if not isinstance(vnode, int) or not 0 <= vnode < schema.vnode_count:
            raise ValueError
        return vnode, schema.coerce_key(key)
    except (ValueError, TypeError, binascii.Error, SchemaError, UnicodeDecodeError):
        raise BadRequest("invalid cursor: pass back the `next` value of a previous page") from None
