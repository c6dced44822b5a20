"""Exports as the workers see them: claim a queued one, report on it, and the leader's
sweep of exports whose worker is gone.

An export's epoch stays pinned (``epoch_pins``, holder ``export:<id>``) from its creation
until a worker reported how it ended, or its worker is gone: a cancelled export whose
Spark job still reads keeps its snapshot readable until the worker says it stopped.
"""

from __future__ import annotations

import datetime as dt

from sqlalchemy import delete, exists, select, text
from sqlalchemy.orm import Session

from backfill_core.protocol import (
    ErrorCode,
    ExportReport,
    ExportReportAnswer,
    ExportState,
    ExportTask,
)
from service.catalog.models import EpochPin, Export, Relation, Worker
from service.db import Database
from service.errors import Gone, NotFound

LOST = "the worker running the export was lost"


def pin_holder(export_id: int) -> str:
    return f"export:{export_id}"


def release_pin(s: Session, export_id: int) -> None:
    s.execute(delete(EpochPin).where(EpochPin.holder == pin_holder(export_id)))


def check_alive(s: Session, worker_id: int) -> None:
    state = s.execute(select(Worker.state).where(Worker.id == worker_id)).scalar_one_or_none()
    if state is None:
        raise NotFound(
            f"worker {worker_id} is not registered",
            {"worker_id": worker_id},
            code=ErrorCode.UNKNOWN_WORKER,
        )
    if state != "alive":
        raise Gone(
            f"worker {worker_id} was declared {state}: register again",
            {"worker_id": worker_id},
            code=ErrorCode.WORKER_GONE,
        )


def claim(db: Database, worker_id: int) -> ExportTask | None:
    """The oldest queued export, now running on this worker; None when there is none.
    Several workers claim at once without waiting for each other (``SKIP LOCKED``)."""
    with db.transaction() as s:
        check_alive(s, worker_id)
        x = s.execute(
            select(Export)
            .where(Export.state == ExportState.QUEUED.value)
            .order_by(Export.id)
            .limit(1)
            .with_for_update(skip_locked=True)
        ).scalar_one_or_none()
        if x is None:
            return None
        rel = s.get(Relation, x.relation_id) if x.relation_id is not None else None
        if rel is None:  # dropped since it was queued
            _finish(s, x, ExportState.FAILED, error=f"relation {x.relation!r} was dropped")
            return None
        x.state = ExportState.RUNNING.value
        x.worker_id = worker_id
        x.started_at = dt.datetime.now(dt.UTC)
        return ExportTask(
            x.id, x.relation, rel.storage_table, rel.schema, x.epoch, x.format, x.path
        )


def report(db: Database, worker_id: int, export_id: int, r: ExportReport) -> ExportReportAnswer:
    """Apply a worker's report on an export it runs; the answer is the export's state
    after it (a report on an export cancelled, or no longer this worker's, changes
    nothing but ends the export's pin once the worker says it stopped)."""
    with db.transaction() as s:
        x = s.execute(
            select(Export).where(Export.id == export_id).with_for_update()
        ).scalar_one_or_none()
        if x is None:
            raise NotFound(f"export {export_id} does not exist", {"export_id": export_id})
        mine = x.worker_id == worker_id
        if mine and x.state == ExportState.RUNNING.value and r.state is not ExportState.RUNNING:
            _finish(s, x, r.state, rows=r.rows, error=r.error)
        elif mine and x.state == ExportState.CANCELLED.value and r.state.terminal:
            release_pin(s, x.id)  # the worker stopped reading
        return ExportReportAnswer(ExportState(x.state))


def _finish(
    s: Session, x: Export, state: ExportState, *, rows: int | None = None, error: str | None = None
) -> None:
    x.state = state.value
    x.rows = rows
    x.error = None if error is None else error[:2000]
    x.finished_at = dt.datetime.now(dt.UTC)
    release_pin(s, x.id)


def sweep(s: Session) -> None:
    """The leader, with expired workers: exports running on a worker that is gone fail,
    and pins of exports that ended on one are released."""
    gone = ~exists().where(Worker.id == Export.worker_id, Worker.state == "alive")
    for x in s.execute(
        select(Export).where(Export.state == ExportState.RUNNING.value, gone).with_for_update()
    ).scalars():
        _finish(s, x, ExportState.FAILED, error=LOST)
    s.execute(
        text(
            """
            DELETE FROM epoch_pins p USING exports x
            WHERE p.holder = 'export:' || x.id AND x.state = 'cancelled'
              AND NOT EXISTS (SELECT 1 FROM workers w WHERE w.id = x.worker_id
                              AND w.state = 'alive')
            """
        )
    )


def any_queued(s: Session) -> bool:
    return bool(
        s.execute(select(exists().where(Export.state == ExportState.QUEUED.value))).scalar_one()
    )
