"""Writing into a table like DML: at the main graph's open epoch, held ``FOR SHARE``.

The control plane's DML (``service.usecases.tables``) and a CDC table's worker
(``spark_workers.cdc_actor``) take the epoch with this one function, so a barrier that
closes it (locking the row for update) waits for every such write to commit.
"""

from __future__ import annotations

from typing import Any

from backfill_core.epoch import Epoch

# the main graph's row (``service.catalog.models.MAIN_GRAPH_ID``)
MAIN_GRAPH = 1

__all__ = ["MAIN_GRAPH", "add_row_count_delta", "open_dml_epoch"]


def open_dml_epoch(cur: Any, now_unix_ms: int, graph_id: int = MAIN_GRAPH) -> int:
    """The main graph's open epoch, held ``FOR SHARE`` until the caller commits.

    The barrier that closes this epoch locks the row for update, so it is injected only
    after every transaction writing into the epoch has finished. Before the first
    barrier ever, the first write opens the first epoch."""
    cur.execute(
        "UPDATE graphs SET current_epoch = %s WHERE id = %s AND current_epoch = 0",
        [int(Epoch.from_unix_ms(now_unix_ms)), graph_id],
    )
    cur.execute("SELECT current_epoch FROM graphs WHERE id = %s FOR SHARE", [graph_id])
    row = cur.fetchone()
    if row is None:
        raise LookupError(f"no graph {graph_id}")
    return int(row[0])


def add_row_count_delta(cur: Any, relation_id: int, epoch: int, delta: int) -> None:
    """Count ``delta`` more rows of a table at ``epoch`` (its writes are serialized)."""
    if delta:
        cur.execute(
            "INSERT INTO row_count_deltas (relation_id, epoch, delta) VALUES (%s, %s, %s) "
            "ON CONFLICT (relation_id, epoch) "
            "DO UPDATE SET delta = row_count_deltas.delta + EXCLUDED.delta",
            [relation_id, epoch, delta],
        )
