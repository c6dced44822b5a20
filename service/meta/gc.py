"""Garbage collection of shadowed versions, held back by epoch pins.

A relation may be compacted up to ``safe = min(pins on it, committed - retention)``:
after that, reads at epochs ``>= safe`` and change logs of epochs ``> safe`` still
work, and older reads get 410. What each pin holds back is reported so that a slow
snapshot backfill that makes its upstream grow is visible.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import func, select, text
from sqlalchemy.orm import Session

from backfill_core.epoch import EPOCH_PHYSICAL_SHIFT
from service.catalog.models import EpochPin, Job, Relation
from service.catalog.queries import fold_row_counts, storage_of
from service.db import Database, raw_cursor


@dataclass(frozen=True)
class GcResult:
    relation: str
    safe_epoch: int
    removed_versions: int


def safe_epoch(committed: int, retention_ms: int, min_pin: int | None) -> int:
    safe = max(0, committed - (retention_ms << EPOCH_PHYSICAL_SHIFT))
    if min_pin is not None:
        safe = min(safe, min_pin)
    return safe


# Every relation's graph's committed epoch and the lowest pin on it, in one query.
_GC_INPUTS = text(
    """
    SELECT r.id, g.committed_epoch,
           (SELECT min(epoch) FROM epoch_pins p WHERE p.relation_id = r.id) AS min_pin
    FROM relations r JOIN graphs g ON g.id = r.graph_id
    ORDER BY r.id
    """
)


def run_gc(db: Database, retention_ms: int) -> list[GcResult]:
    """Compact every relation once; each relation in its own short transaction. The safe
    epochs come from one query up front, lowered under each relation's lock by the pins
    taken since (committed epochs only grow)."""
    with db.transaction() as s:
        todo = [
            (int(r), safe_epoch(int(committed), retention_ms, min_pin))
            for r, committed, min_pin in s.execute(_GC_INPUTS)
        ]
    results = []
    for rel_id, safe in todo:
        with db.transaction() as s:
            rel = s.execute(
                select(Relation).where(Relation.id == rel_id).with_for_update(skip_locked=True)
            ).scalar_one_or_none()
            if rel is None:
                continue
            if not rel.epoch_indexed and _written_by_a_job(s, rel.id):
                continue  # (an MV or a CDC table under its backfill: GC would scan it all)
            # a pin taken since the query above (an export's, at any readable epoch) holds
            # too: pins are taken holding the relation's row, which this one now holds
            pinned = s.execute(
                select(func.min(EpochPin.epoch)).where(EpochPin.relation_id == rel_id)
            ).scalar_one()
            if pinned is not None:
                safe = min(safe, int(pinned))
            if safe <= rel.gc_epoch:
                continue
            removed = storage_of(rel).gc(raw_cursor(s), safe, rel.gc_epoch)
            fold_row_counts(s, rel.id, safe)
            rel.gc_epoch = safe
            results.append(GcResult(rel.name, safe, removed))
    return results


def _written_by_a_job(s: Session, rel_id: int) -> bool:
    """Whether a job writes the relation (an MV's, a CDC table's): until its epoch index
    is built after that job's backfill, GC would scan the whole relation every run. A
    plain table is collected without it (scanned) until its index is built, which comes
    right after its first write (``service.meta.indexer``)."""
    return (
        s.execute(select(Job.id).where(Job.mv_relation_id == rel_id).limit(1)).first() is not None
    )


def pin(db: Database, relation: str, holder: str, epoch: int) -> None:
    """Keep ``epoch`` (and every change log after it) of ``relation`` readable."""
    with db.transaction() as s:
        rel = s.execute(select(Relation).where(Relation.name == relation)).scalar_one()
        if epoch < rel.gc_epoch:
            raise ValueError(f"epoch {epoch} of {relation} was already garbage-collected")
        existing = s.execute(
            select(EpochPin).where(EpochPin.relation_id == rel.id, EpochPin.holder == holder)
        ).scalar_one_or_none()
        if existing is None:
            s.add(EpochPin(relation_id=rel.id, holder=holder, epoch=epoch))
        else:
            existing.epoch = epoch


def unpin(db: Database, relation: str, holder: str) -> None:
    with db.transaction() as s:
        rel_id = s.execute(select(Relation.id).where(Relation.name == relation)).scalar_one()
        s.execute(
            EpochPin.__table__.delete().where(
                EpochPin.relation_id == rel_id, EpochPin.holder == holder
            )
        )
