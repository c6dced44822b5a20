"""Epoch arithmetic of the meta, and the open epoch that table DML writes at."""

from __future__ import annotations

import time

from sqlalchemy import select
from sqlalchemy.orm import Session

from backfill_core.epoch import Epoch
from service.catalog.models import MAIN_GRAPH_ID, Graph
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
