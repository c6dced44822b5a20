"""The SQL view of a committed snapshot (``mv.<name>``, docs/reading.md) against a plain
table holding the same rows, in the same run.

Full scan: ``COPY (SELECT * FROM mv.t) TO STDOUT`` vs the same of a plain table made
from the view's rows (``CREATE TABLE ... AS``, no index), both after VACUUM ANALYZE and a
warm-up, alternating, median of 3. The versioned table holds one version per key at a
first epoch, which garbage collection has passed (``gc.run_gc``, as the service runs it),
plus a tenth of the keys updated at a later committed epoch it has not reached yet (within
the retention): the versions the view must check keys against.
Target: at most 2x (issue 35).
"""

from __future__ import annotations

import statistics
import time
from decimal import Decimal
from typing import Any

import psycopg2
from sqlalchemy import update

from backfill_core.changes import Version
from backfill_core.schema import Column, ColumnType, TableSchema
from bench._pg import fresh_database
from service.catalog.models import MAIN_GRAPH_ID, Graph
from service.catalog.queries import get_relation, storage_of
from service.db import raw_cursor
from service.meta import gc
from service.usecases import tables

KEYS = ("name", "value", "baseline", "ratio", "target", "unit", "passed", "note")
BATCH, REPEATS = 100_000, 3
E1, E2 = 1 << 16, 2 << 16
SCHEMA = TableSchema.build(
    [
        Column("id", ColumnType.BIGINT),
        Column("a", ColumnType.INT),
        Column("b", ColumnType.TEXT),
        Column("c", ColumnType.DOUBLE),
        Column("d", ColumnType.NUMERIC),
    ],
    ["id"],
)


def _row(i: int, gen: int) -> tuple[Any, ...]:
    return (i, (i * 7 + gen) % 100_000, f"row-{i:09d}-{gen}-xyz", i / 4 + gen, Decimal(i) / 100)


class _Sink:
    """A file for COPY TO that only counts what it is given."""

    def __init__(self) -> None:
        self.size = 0

    def write(self, data: Any) -> None:
        self.size += len(data)


def _copy_secs(conn: Any, source: str) -> float:
    with conn.cursor() as cur:
        t0 = time.perf_counter()
        cur.copy_expert(f"COPY (SELECT * FROM {source}) TO STDOUT", _Sink())
        secs = time.perf_counter() - t0
    conn.commit()
    return secs


def run(quick: bool) -> list[dict[str, Any]]:
    n = 200_000 if quick else 2_000_000
    with fresh_database() as (_url, db):
        tables.create_table(db, "t", SCHEMA)
        for lo in range(0, n, BATCH):
            with db.transaction() as s:
                table = storage_of(get_relation(s, "t"))
                rows = [Version(_row(i, 0)) for i in range(lo, min(n, lo + BATCH))]
                table.write(raw_cursor(s), E1, rows)
        with db.transaction() as s:
            updated = [Version(_row(i, 1)) for i in range(0, n, 10)]
            table.write(raw_cursor(s), E2, updated)
            s.execute(
                update(Graph)
                .where(Graph.id == MAIN_GRAPH_ID)
                .values(committed_epoch=E2, current_epoch=E2)
            )
        # the shortest retention: garbage collection passes E1, not E2
        (done,) = gc.run_gc(db, retention_ms=1)
        assert done.safe_epoch == E1, done
        conn = psycopg2.connect(db.libpq_url)
        try:
            with conn.cursor() as cur:
                cur.execute("CREATE TABLE plain AS SELECT * FROM mv.t")
            conn.commit()
            conn.autocommit = True
            with conn.cursor() as cur:
                cur.execute("VACUUM ANALYZE store.t")
                cur.execute("VACUUM ANALYZE plain")
            conn.autocommit = False
            _copy_secs(conn, "mv.t"), _copy_secs(conn, "plain")  # warm-up
            view, plain = [], []
            for _ in range(REPEATS):
                view.append(_copy_secs(conn, "mv.t"))
                plain.append(_copy_secs(conn, "plain"))
        finally:
            conn.close()
    value, base = statistics.median(view) * 1000, statistics.median(plain) * 1000
    ratio = value / base
    note = (
        f"{n:,} rows ({n // 10:,} with a second version above the GC epoch), COPY of the "
        f"view vs of a plain table of the same rows, median of {REPEATS}"
    )
    figure = ("reader view full scan", round(value), round(base), round(ratio, 3), "<= 2")
    return [dict(zip(KEYS, (*figure, "ms", ratio <= 2, note), strict=True))]


if __name__ == "__main__":
    for fig in run(quick=True):
        print(fig)
