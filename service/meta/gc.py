"""Garbage collection of shadowed versions, held back by epoch pins.

A relation may be compacted up to ``safe = min(pins on it, committed - retention)``:
after that, reads at epochs ``>= safe`` and change logs of epochs ``> safe`` still
work, and older reads get 410. What each pin holds back is reported so that a slow
snapshot backfill that makes its upstream grow is visible.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from sqlalchemy import func, select, text

from backfill_core.epoch import EPOCH_PHYSICAL_SHIFT
from service.catalog.models import EpochPin, Relation
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


# Every relation's graph's committed epoch, the lowest pin on it, and what decides
# whether it has anything to collect, in one query: a pass opens a transaction only for
# relations that may have (a pass over hundreds of idle relations every few seconds
# cost the API's tail latency, bench/HISTORY.md 2026-11-29 09:40)
_GC_INPUTS = text(
    """
    SELECT r.id, g.committed_epoch,
           (SELECT min(epoch) FROM epoch_pins p WHERE p.relation_id = r.id) AS min_pin,
           r.gc_epoch,
           NOT r.epoch_indexed
             AND EXISTS (SELECT 1 FROM jobs j WHERE j.mv_relation_id = r.id) AS skipped
    FROM relations r JOIN graphs g ON g.id = r.graph_id
    ORDER BY r.id
    """
)


def run_gc(db: Database, retention_ms: int, pause_s: float = 0.0) -> list[GcResult]:
    """Compact every relation once; each relation in its own short transaction. The safe
    epochs come from one query up front, lowered under each relation's lock by the pins
    taken since (committed epochs only grow). A relation a job writes (an MV, a CDC
    table) is left alone until its epoch index is built after that job's backfill: GC
    would scan all of it every run. A plain table is collected without the index
    (scanned) until it is built, which comes right after its first write
    (``service.meta.indexer``)."""
    with db.transaction() as s:
        todo = [
            (int(r), safe)
            for r, committed, min_pin, gc_epoch, skipped in s.execute(_GC_INPUTS)
            if not skipped
            and (safe := safe_epoch(int(committed), retention_ms, min_pin)) > int(gc_epoch)
        ]
    results = []
    for i, (rel_id, safe) in enumerate(todo):
        if i and pause_s:
            time.sleep(pause_s)  # pacing a pass, as autovacuum's cost delay does
        with db.transaction() as s:
            rel = s.execute(
                select(Relation).where(Relation.id == rel_id).with_for_update(skip_locked=True)
            ).scalar_one_or_none()
            if rel is None:
                continue
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
