"""Imports as the workers see them: claim a queued one (its staging table is created
with the claim), report on it, publish its staged rows at one epoch, and the leader's
sweep of imports whose worker is gone (what exports share: ``service.meta.claimed``).

Publishing takes the locks of a DML insert in the order that holds the epoch least:
the table's row first (its DML is serialized: no writer of the table moves under the
checks), the checks that no staged key exists in the table (the staged keys' latest
versions, whatever their epoch), then the open epoch ``FOR SHARE`` (the barrier that
closes it waits from here) and one ``INSERT ... SELECT`` of the staged rows at it. The
barrier waits for that statement only, not for the Spark job nor the checks.
"""

from __future__ import annotations

import logging
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from backfill_core.protocol import ImportReport, ImportReportAnswer, ImportState, ImportTask
from backfill_core.schema import TableSchema, value_to_json
from service.catalog.models import Import, Relation
from service.catalog.queries import add_row_count_delta, storage_of
from service.db import Database, raw_cursor
from service.meta import claimed
from service.meta.epochs import open_dml_epoch
from state_store import staging

log = logging.getLogger(__name__)

LOST = "the worker running the import was lost"


def claim(db: Database, worker_id: int) -> ImportTask | None:
    """The oldest queued import, now running on this worker with its staging table
    created; None when there is none."""
    with db.transaction() as s:
        got = claimed.claim_oldest(s, Import, worker_id, dropped=lambda x: _dropped(s, x))
        if got is None:
            return None
        x, rel = got
        name = staging.staging_name(x.id)
        staging.create_staging(raw_cursor(s), storage_of(rel), name)
        x.staging = name
        return ImportTask(x.id, x.relation, rel.storage_table, rel.schema, x.format, x.path, name)


def report(
    db: Database, worker_id: int, import_id: int, r: ImportReport, now_ms: int
) -> ImportReportAnswer:
    """Apply a worker's report on an import it runs: ``succeeded`` publishes the staged
    rows (or fails the import, writing nothing, when a key exists or is staged twice);
    ``failed`` and ``cancelled`` drop the staging table. A report on an import that is
    no longer running on this worker changes nothing but drops the staging table of a
    cancelled one once its worker says it stopped. The answer: the state after it."""
    with db.transaction() as s:

        def ended(x: Import) -> None:
            if r.state is ImportState.SUCCEEDED:
                _publish(s, x, r.rows or 0, now_ms)
            else:
                _finish(s, x, r.state, r.error, r.error_code, r.details)

        x = claimed.lock(s, Import, "import", import_id)
        # a stopped worker no longer writes into the staging table
        claimed.apply_report(
            x, worker_id, r.state, ended=ended, stopped=lambda x: _drop_staging(s, x)
        )
        return ImportReportAnswer(ImportState(x.state), x.error)


def _dropped(s: Session, x: Import) -> None:
    _finish(s, x, ImportState.FAILED, f"table {x.relation!r} was dropped", "dropped")


def _publish(s: Session, x: Import, staged: int, now_ms: int) -> None:
    rel = (
        s.execute(select(Relation).where(Relation.id == x.relation_id).with_for_update())
        .scalars()
        .one_or_none()
    )
    if rel is None or x.staging is None:
        _dropped(s, x)
        return
    table = storage_of(rel)
    schema = TableSchema.from_json(rel.schema)
    cur = raw_cursor(s)
    had_rows, _ = table.has_versions(cur, 0)
    existing = staging.first_existing_key(cur, table, x.staging) if had_rows else None
    if existing is not None:
        found = _key_json(schema, existing)
        _finish(
            s,
            x,
            ImportState.FAILED,
            f"insert of a key that already exists: {found}",
            "key_exists",
            {"key": found},
        )
        return
    epoch = open_dml_epoch(s, now_ms)  # from here, the barrier closing it waits
    _, at_epoch = table.has_versions(cur, epoch)
    try:
        rows = staging.publish(cur, table, x.staging, epoch, replace=at_epoch)
    except staging.DuplicateKey:
        dup = staging.first_duplicate_key(cur, table, x.staging)
        key = _key_json(schema, dup) if dup is not None else None
        _finish(
            s,
            x,
            ImportState.FAILED,
            f"the files hold the key {key} more than once",
            "duplicate_key",
            {"key": key},
        )
        return
    if rows != staged:  # an unlogged table loses its rows in a crash of Postgres
        raise RuntimeError(f"import {x.id}: {staged} rows staged but {rows} found")
    add_row_count_delta(s, rel.id, epoch, rows)
    x.epoch = epoch
    _finish(s, x, ImportState.SUCCEEDED, rows=rows)
    log.info("import %s: %s rows published at epoch %s", x.id, rows, epoch)


def _key_json(schema: TableSchema, key: Any) -> list[Any]:
    return [
        value_to_json(schema.column(n).type, v)
        for n, v in zip(schema.primary_key, key, strict=True)
    ]


def _finish(
    s: Session,
    x: Import,
    state: ImportState,
    error: str | None = None,
    code: str | None = None,
    details: dict[str, Any] | None = None,
    *,
    rows: int | None = None,
) -> None:
    claimed.end(x, state, rows, error)
    x.error_code = code if error is not None else None
    x.error_details = details if error is not None else None
    _drop_staging(s, x)


def _drop_staging(s: Session, x: Import, lock_timeout: str = "10s") -> None:
    """Drop the import's staging table; left for the sweep when a task of a stopped job
    still holds it (its transaction ends with its connection)."""
    if x.staging is None:
        return
    try:
        with s.begin_nested():
            cur = raw_cursor(s)
            cur.execute("SET LOCAL lock_timeout = %s", (lock_timeout,))
            staging.drop_staging(cur, x.staging)
            cur.execute("SET LOCAL lock_timeout TO DEFAULT")
    except Exception as e:  # a lock timeout: the savepoint is rolled back
        log.debug("could not drop %s yet: %s", x.staging, e)
        return
    x.staging = None


def sweep(s: Session) -> None:
    """The leader, with expired workers: imports running on a worker that is gone fail,
    and the staging tables left by imports that ended are dropped."""
    claimed.sweep_lost(s, Import, lambda x: _finish(s, x, ImportState.FAILED, LOST, "worker_lost"))
    # (a cancelled import's tasks may still write: the drop does not wait for them, as
    # this runs in the barrier loop; it is tried again next round)
    for x in s.execute(
        select(Import)
        .where(
            Import.staging.is_not(None),
            Import.state.in_([ImportState.FAILED.value, ImportState.CANCELLED.value]),
        )
        .with_for_update(skip_locked=True)
    ).scalars():
        _drop_staging(s, x, lock_timeout="10ms")


def any_queued(s: Session) -> bool:
    return claimed.any_queued(s, Import)
