"""Imports as the workers see them: claim a queued one (its staging table is created
with the claim), report on it, publish its staged rows at one epoch, and the leader's
sweep of imports whose worker is gone (what exports share: ``service.meta.claimed``).

Publishing holds no epoch a barrier is about to close: it takes the table's row first
(its writers are serialized: none moves under the checks), checks that no staged key
exists in the table (the staged keys' latest versions, whatever their epoch), then
reserves an epoch ahead of the open one, by the time the ``INSERT ... SELECT`` is
estimated to take (``service.meta.epochs.reserve_hold``, committed apart), holds it
``FOR SHARE`` and writes every staged row at it. No committed snapshot sees the rows
until the first barrier closing an epoch at or past it, which waits for the publication
only if the estimate was short. Later writes of the table go at or above that epoch
(``relations.write_floor_epoch``, ``epochs.table_write_epoch``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from backfill_core.protocol import ImportReport, ImportReportAnswer, ImportState, ImportTask
from backfill_core.schema import TableSchema, value_to_json
from service.catalog.models import Import, Relation
from service.catalog.queries import add_row_count_delta, readers_of, storage_of
from service.db import Database, raw_cursor
from service.meta import claimed, epochs
from state_store import staging

log = logging.getLogger(__name__)

LOST = "the worker running the import was lost"
# the publication's rate the epoch it writes at is reserved for, on the slow side (the
# bench's INSERT ... SELECT runs two to three times as fast: bench/RESULTS.md#import): a
# publication slower than that holds the barrier closing its epoch back for the rest
PUBLISH_ROWS_PER_S = 50_000
# a publication's epoch is at least this many barrier intervals ahead of the open one,
# and at most this far: a DML of the table meanwhile is written at it, and its
# ``?wait=true`` waits for it (30 s at most: ``service.api.tables``)
LEAD_BARRIERS = 2
MAX_LEAD_MS = 20_000
# reservations tried before giving up (each passed while the previous was being held)
RESERVE_TRIES = 5


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
    db: Database,
    worker_id: int,
    import_id: int,
    r: ImportReport,
    clock: Callable[[], int],
    barrier_interval_ms: int,
) -> ImportReportAnswer:
    """Apply a worker's report on an import it runs: ``succeeded`` publishes the staged
    rows (or fails the import, writing nothing, when a key exists or is staged twice);
    ``failed`` and ``cancelled`` drop the staging table. A report on an import that is
    no longer running on this worker changes nothing but drops the staging table of a
    cancelled one once its worker says it stopped. The answer: the state after it."""
    staged = r.rows or 0
    estimate_ms = min(MAX_LEAD_MS, staged * 1000 // PUBLISH_ROWS_PER_S)
    lead_ms = max(LEAD_BARRIERS * barrier_interval_ms, estimate_ms)

    def reserve(floor: int) -> int:
        return epochs.reserve_hold(db, _holder(import_id), floor, lead_ms, clock())

    with db.transaction() as s:

        def ended(x: Import) -> None:
            if r.state is ImportState.SUCCEEDED:
                _publish(s, x, staged, reserve)
                epochs.drop_hold(s, _holder(x.id))  # (still locked until the commit)
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


def _holder(import_id: int) -> str:
    return f"import:{import_id}"


def _publish(s: Session, x: Import, staged: int, reserve: Callable[[int], int]) -> None:
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
    epoch = _held_epoch(s, x, rel, reserve)  # a barrier closing it from here waits
    _, at_epoch = table.has_versions(cur, epoch)
    try:
        rows = staging.publish(
            cur,
            table,
            x.staging,
            epoch,
            replace=at_epoch,
            first_load=not had_rows and not readers_of(s, rel.id),
        )
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
    rel.write_floor_epoch = epoch
    x.epoch = epoch
    _finish(s, x, ImportState.SUCCEEDED, rows=rows)
    log.info("import %s: %s rows published at epoch %s", x.id, rows, epoch)


def _held_epoch(s: Session, x: Import, rel: Relation, reserve: Callable[[int], int]) -> int:
    """An epoch ahead of the open one and of the table's writes, reserved and held
    ``FOR SHARE`` until the caller commits (a new one when a barrier passed the last)."""
    floor = rel.write_floor_epoch
    for _ in range(RESERVE_TRIES):
        epoch = reserve(floor)
        if epochs.hold_kept(s, _holder(x.id), epoch):
            return epoch
        floor = epoch
    raise RuntimeError(f"import {x.id}: barriers passed {RESERVE_TRIES} reserved epochs")


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
