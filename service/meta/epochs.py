"""Epoch arithmetic of the meta, and the open epoch that table DML writes at."""

from __future__ import annotations

import time

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from backfill_core.epoch import Epoch
from service.catalog.models import MAIN_GRAPH_ID, Graph
from service.db import Database


def next_epoch(current: int, now_unix_ms: int) -> int:
    if current <= 0:
        return int(Epoch.from_unix_ms(now_unix_ms))
    return int(Epoch(current).next(now_unix_ms))


def open_dml_epoch(session: Session, now_unix_ms: int) -> int:
    """The main graph's open epoch, held ``FOR SHARE`` until the caller commits.

    The barrier that closes this epoch locks the row for update, so it is injected only
    after every DML transaction writing into the epoch has finished.
    """
    # before the first barrier ever, the first DML opens the first epoch
    session.execute(
        update(Graph)
        .where(Graph.id == MAIN_GRAPH_ID, Graph.current_epoch == 0)
        .values(current_epoch=next_epoch(0, now_unix_ms))
    )
    return session.execute(
        select(Graph.current_epoch).where(Graph.id == MAIN_GRAPH_ID).with_for_update(read=True)
    ).scalar_one()


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
