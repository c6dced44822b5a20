"""Where table DML gets its epoch.

Interim epoch source, until the barrier loop exists: each DML batch takes the next
epoch of the main graph under a row lock on the graph and commits it with the batch,
so reads of the latest committed epoch see every accepted batch.
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from backfill_core.epoch import Epoch
from service.catalog.models import Graph

MAIN_GRAPH_ID = 1


def lock_main_graph(session: Session) -> Graph:
    graph = session.execute(
        select(Graph).where(Graph.id == MAIN_GRAPH_ID).with_for_update()
    ).scalar_one()
    return graph


def next_epoch(current: int, now_unix_ms: int) -> int:
    if current <= 0:
        return int(Epoch.from_unix_ms(now_unix_ms))
    return int(Epoch(current).next(now_unix_ms))


def take_dml_epoch(session: Session, now_unix_ms: int) -> int:
    """Open and commit (with the caller's transaction) the epoch a DML batch writes at."""
    graph = lock_main_graph(session)
    epoch = next_epoch(graph.current_epoch, now_unix_ms)
    graph.current_epoch = epoch
    graph.committed_epoch = epoch
    return epoch
