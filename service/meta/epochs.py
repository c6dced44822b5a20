"""Epoch arithmetic of the meta, the epoch that table DML writes at, and the holds of
epochs ahead of the open one that imports publish at (``service.meta.imports``)."""

from __future__ import annotations

import time

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from backfill_core.epoch import Epoch
from service.catalog.models import MAIN_GRAPH_ID, EpochHold, Graph, Relation
from service.db import Database, raw_cursor
from state_store import dml


def next_epoch(current: int, now_unix_ms: int) -> int:
    if current <= 0:
        return int(Epoch.from_unix_ms(now_unix_ms))
    return int(Epoch(current).next(now_unix_ms))


def open_dml_epoch(session: Session, now_unix_ms: int) -> int:
    """The main graph's open epoch, held ``FOR SHARE`` until the caller commits
    (``state_store.dml.open_dml_epoch``: the CDC tables' workers take it too)."""
    return dml.open_dml_epoch(raw_cursor(session), now_unix_ms, MAIN_GRAPH_ID)


def table_write_epoch(session: Session, rel: Relation, now_unix_ms: int) -> int:
    """The epoch a write of table ``rel`` goes at (its row locked by the caller): the open
    epoch, held as ``open_dml_epoch`` holds it, or the table's last import's if that one
    is still ahead (a write below it would be hidden by the import's rows)."""
    return max(open_dml_epoch(session, now_unix_ms), rel.write_floor_epoch)


def reserve_hold(db: Database, holder: str, floor: int, lead_ms: int, now_unix_ms: int) -> int:
    """Commit a hold of an epoch at least ``lead_ms`` ahead of now and of the main
    graph's open epoch, and above ``floor``; the epoch. Taken after any barrier under
    way commits (the graph's row ``FOR KEY SHARE``), so every barrier that could close
    the epoch sees the hold (``RELEASE_HOLDS``)."""
    with db.transaction() as s:
        current = s.execute(
            select(Graph.current_epoch)
            .where(Graph.id == MAIN_GRAPH_ID)
            .with_for_update(key_share=True, read=True)
        ).scalar_one()
        base = max(int(current), floor, 1)
        epoch = int(Epoch.from_unix_ms(max(now_unix_ms, Epoch(base).unix_ms) + lead_ms))
        s.execute(delete(EpochHold).where(EpochHold.holder == holder))
        s.add(EpochHold(graph_id=MAIN_GRAPH_ID, holder=holder, epoch=epoch))
    return epoch


def hold_kept(session: Session, holder: str, epoch: int) -> bool:
    """Lock the hold ``FOR SHARE`` until the caller commits: False when a barrier closing
    an epoch at or past it already dropped it (write elsewhere then)."""
    kept = session.execute(
        select(EpochHold.epoch)
        .where(EpochHold.holder == holder, EpochHold.epoch == epoch)
        .with_for_update(read=True)
    ).scalar_one_or_none()
    return kept is not None


def drop_hold(session: Session, holder: str) -> None:
    session.execute(delete(EpochHold).where(EpochHold.holder == holder))


# Before a barrier closes ``:closing``: wait for the publications writing at or below it
# (they hold their rows ``FOR SHARE``) and drop those holds (stale ones too). The
# barrier's injection sends it with its other statements (``service.meta.barriers``).
RELEASE_HOLDS = "DELETE FROM epoch_holds WHERE graph_id = :g AND epoch <= :closing"


def wait_committed(db: Database, graph_id: int, epoch: int, timeout_s: float) -> bool:
    """Poll (with a deadline) until the graph committed ``epoch``."""
    deadline = time.monotonic() + timeout_s
    delay = 0.002
    while True:
        with db.transaction() as s:
            committed = s.execute(
                select(Graph.committed_epoch).where(Graph.id == graph_id)
            ).scalar_one()
        if committed >= epoch:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(delay)
        delay = min(delay * 2, 0.05)
