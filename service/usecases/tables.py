"""Use cases for tables: create, list, drop, DML at the open epoch, reads at an epoch.

Each function owns its transaction: everything it writes (catalog rows, the versioned
table, DML versions) commits together or not at all.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from backfill_core.changes import Row, Version
from backfill_core.schema import SchemaError, TableSchema, validate_identifier
from service.catalog import idempotency, reader_views
from service.catalog.models import MAIN_GRAPH_ID, Job, Relation
from service.catalog.queries import (
    ACTIVE_JOB_STATES,
    add_row_count_delta,
    committed_epoch,
    get_relation,
    storage_of,
)
from service.clock import Clock
from service.db import Database, raw_cursor, retry_deadlocks
from service.errors import BadRequest, Conflict, Gone, Invalid, Timeout
from service.meta.epochs import open_dml_epoch, wait_committed


@dataclass(frozen=True)
class DmlOp:
    op: str  # insert | update | delete
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
            )
            s.add(rel)
            s.flush()
            storage_of(rel).create(raw_cursor(s))
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
    with db.transaction() as s:
        rel = get_relation(s, name, lock=True)
        if rel.kind != "table":
            raise Conflict(f"{name!r} is the view of a job: delete the job instead", {"name": name})
        readers = s.execute(
            select(Job.name).where(
                Job.upstream_relation_id == rel.id, Job.state.in_(ACTIVE_JOB_STATES)
            )
        ).scalars()
        names = list(readers)
        if names:
            raise Conflict(f"table {name!r} is read by job(s) {', '.join(names)}", {"jobs": names})
        reader_views.drop_view_of(raw_cursor(s), rel)
        storage_of(rel).drop(raw_cursor(s))
        s.delete(rel)


@retry_deadlocks
def apply_dml(db: Database, name: str, ops: Sequence[DmlOp], clock: Clock) -> tuple[int, int]:
    """Apply a batch atomically at the open epoch; returns (epoch, count)."""
    with db.transaction() as s:
        rel = get_relation(s, name, lock=True)  # DML on one table is serialized; drop waits
        if rel.kind != "table":
            raise Conflict(f"{name!r} is a materialized view and is read-only", {"name": name})
        schema = TableSchema.from_json(rel.schema)
        parsed = _parse_ops(schema, ops)
        epoch = open_dml_epoch(s, clock())
        table = storage_of(rel)
        cur = raw_cursor(s)
        keys = list(dict.fromkeys(k for _, k, _ in parsed))
        state: dict[Row, Row | None] = dict.fromkeys(keys)
        state.update(table.latest_versions(cur, epoch, keys))
        before = dict(state)
        for index, (op, key, row) in enumerate(parsed):
            current = state[key]
            if op == "insert":
                if current is not None:
                    raise Conflict(
                        "insert of a key that already exists", {"index": index, "key": list(key)}
                    )
                state[key] = _full_row(schema, row)
            elif current is None:
                raise Conflict(
                    f"{op} of a key that does not exist", {"index": index, "key": list(key)}
                )
            elif op == "update":
                merged = dict(zip(schema.names, current, strict=True)) | row
                state[key] = _full_row(schema, merged)
            else:
                state[key] = None
        versions = [
            Version(row) if row is not None else Version(before[key] or (), deleted=True)
            for key, row in state.items()
            if row != before[key]
        ]
        table.write(cur, epoch, versions)
        delta = sum(row is not None for row in state.values()) - sum(
            row is not None for row in before.values()
        )
        add_row_count_delta(s, rel.id, epoch, delta)
        return epoch, len(ops)


def wait_readable(db: Database, epoch: int, timeout_s: float) -> None:
    """Return once the main graph committed ``epoch`` (a DML batch's): 504 after ``timeout_s``."""
    if not wait_committed(db, MAIN_GRAPH_ID, epoch, timeout_s):
        raise Timeout(
            f"epoch {epoch} was not committed within {timeout_s:.0f}s",
            {"epoch": str(epoch)},  # as in every answer (service.api.epochs)
        )


def _full_row(schema: TableSchema, row: dict[str, Any]) -> Row:
    return tuple(row.get(n) for n in schema.names)


def _parse_ops(schema: TableSchema, ops: Sequence[DmlOp]) -> list[tuple[str, Row, dict[str, Any]]]:
    out = []
    for index, op in enumerate(ops):
        try:
            if op.op == "insert":
                row = schema.coerce_row(op.row, full=True)
                key = schema.pk_of(row)
            elif op.op == "update":
                row = schema.coerce_row(op.row, full=False)
                missing = [n for n in schema.primary_key if n not in row]
                if missing:
                    raise SchemaError(f"update needs the key column(s): {', '.join(missing)}")
                key = schema.pk_of(row)
            elif op.op == "delete":
                key = schema.coerce_key(op.row)
                row = {}
            else:
                raise SchemaError(f"unknown op {op.op!r}; expected insert, update or delete")
        except SchemaError as e:
            raise Invalid(f"ops[{index}]: {e.message}", {"index": index}) from None
        out.append((op.op, key, row))
    return out


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
