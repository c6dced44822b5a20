"""Garbage collection of shadowed versions, held back by epoch pins.

A relation may be compacted up to ``safe = min(pins on it, committed - retention)``:
after that, reads at epochs ``>= safe`` and change logs of epochs ``> safe`` still
work, and older reads get 410. What each pin holds back is reported so that a slow
snapshot backfill that makes its upstream grow is visible.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import func, select

from backfill_core.epoch import EPOCH_PHYSICAL_SHIFT
from service.catalog.models import EpochPin, Graph, Relation
from service.catalog.tables import storage_of
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


def run_gc(db: Database, retention_ms: int) -> list[GcResult]:
    """Compact every relation once; each relation in its own short transaction."""
    with db.transaction() as s:
        ids = list(s.execute(select(Relation.id).order_by(Relation.id)).scalars())
    results = []
    for rel_id in ids:
        with db.transaction() as s:
            rel = s.execute(
                select(Relation).where(Relation.id == rel_id).with_for_update(skip_locked=True)
            ).scalar_one_or_none()
            if rel is None:
                continue
            committed = s.execute(
                select(Graph.committed_epoch).where(Graph.id == rel.graph_id)
            ).scalar_one()
            min_pin = s.execute(
                select(func.min(EpochPin.epoch)).where(EpochPin.relation_id == rel.id)
            ).scalar()
            safe = safe_epoch(committed, retention_ms, min_pin)
            if safe <= rel.gc_epoch:
                continue
            removed = storage_of(rel).gc(raw_cursor(s), safe, rel.gc_epoch)
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
