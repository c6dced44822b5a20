"""Exports: a relation's snapshot at a committed epoch written as files by a worker's
Spark job (``docs/reading.md#exports``). Creating one checks everything a worker
cannot fix (the path's form, the epoch) and pins the epoch in the same transaction, so
a bad request writes nothing and garbage collection cannot pass a queued export."""

from __future__ import annotations

from backfill_core.protocol import ExportState
from service.catalog.models import EpochPin, Export
from service.catalog.queries import committed_epoch, get_relation
from service.db import Database
from service.meta.exports import pin_holder, release_pin
from service.usecases import claimed
from service.usecases.claimed import check_format, check_path
from service.usecases.tables import readable_epoch

FORMATS = ("parquet",)


def create_export(db: Database, name: str, fmt: str, path: str, epoch: int | None) -> Export:
    """Queue the export of ``name`` at ``epoch`` (default: its latest committed one):
    409 if not committed yet, 410 if garbage-collected, as reads at an epoch."""
    check_format(fmt, FORMATS)
    check_path(path)
    with db.transaction() as s:
        # shared with GC's lock of the relation: it cannot pass the epoch before the pin
        rel = get_relation(s, name, share=True)
        epoch = readable_epoch(epoch, committed_epoch(s, rel.graph_id), rel.gc_epoch)
        x = Export(
            relation_id=rel.id,
            relation=rel.name,
            format=fmt,
            path=path,
            epoch=epoch,
            state=ExportState.QUEUED.value,
        )
        s.add(x)
        s.flush()
        s.add(EpochPin(relation_id=rel.id, holder=pin_holder(x.id), epoch=epoch))
        return x


def get_export(db: Database, export_id: int) -> Export:
    return claimed.get(db, Export, "export", export_id)


def list_exports(db: Database, limit: int) -> list[Export]:
    """The newest ``limit`` exports, newest first."""
    return claimed.newest(db, Export, limit)


def cancel_export(db: Database, export_id: int) -> Export:
    """Cancel a queued or running export (a cancelled one stays so); 409 once it ended
    otherwise. A running export's worker stops its Spark job at its next report, and
    releases the export's pin once it stopped."""
    return claimed.cancel(
        db, Export, "export", export_id, was_queued=lambda s, x: release_pin(s, x.id)
    )
