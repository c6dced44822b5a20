"""Exports as the workers see them: claim a queued one, report on it, and the leader's
sweep of exports whose worker is gone (what imports share: ``service.meta.claimed``).

An export's epoch stays pinned (``epoch_pins``, holder ``export:<id>``) from its creation
until a worker reported how it ended, or its worker is gone: a cancelled export whose
Spark job still reads keeps its snapshot readable until the worker says it stopped.
"""

from __future__ import annotations

from sqlalchemy import delete, text
from sqlalchemy.orm import Session

from backfill_core.protocol import ExportReport, ExportReportAnswer, ExportState, ExportTask
from service.catalog.models import EpochPin, Export
from service.db import Database
from service.meta import claimed

LOST = "the worker running the export was lost"


def pin_holder(export_id: int) -> str:
    return f"export:{export_id}"


def release_pin(s: Session, export_id: int) -> None:
    s.execute(delete(EpochPin).where(EpochPin.holder == pin_holder(export_id)))


def claim(db: Database, worker_id: int) -> ExportTask | None:
    """The oldest queued export, now running on this worker; None when there is none."""
    with db.transaction() as s:
        got = claimed.claim_oldest(
            s,
            Export,
            worker_id,
            dropped=lambda x: _finish(
                s, x, ExportState.FAILED, error=f"relation {x.relation!r} was dropped"
            ),
        )
        if got is None:
            return None
        x, rel = got
        return ExportTask(
            x.id, x.relation, rel.storage_table, rel.schema, x.epoch, x.format, x.path
        )


def report(db: Database, worker_id: int, export_id: int, r: ExportReport) -> ExportReportAnswer:
    """Apply a worker's report on an export it runs; the answer is the export's state
    after it (a report on an export cancelled, or no longer this worker's, changes
    nothing but ends the export's pin once the worker says it stopped)."""
    with db.transaction() as s:
        x = claimed.lock(s, Export, "export", export_id)
        claimed.apply_report(
            x,
            worker_id,
            r.state,
            ended=lambda x: _finish(s, x, r.state, rows=r.rows, error=r.error),
            stopped=lambda x: release_pin(s, x.id),  # the worker stopped reading
        )
        return ExportReportAnswer(ExportState(x.state))


def _finish(
    s: Session, x: Export, state: ExportState, *, rows: int | None = None, error: str | None = None
) -> None:
    claimed.end(x, state, rows, error)
    release_pin(s, x.id)


def sweep(s: Session) -> None:
    """The leader, with expired workers: exports running on a worker that is gone fail,
    and pins of exports that ended on one are released."""
    claimed.sweep_lost(s, Export, lambda x: _finish(s, x, ExportState.FAILED, error=LOST))
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
    return claimed.any_queued(s, Export)
