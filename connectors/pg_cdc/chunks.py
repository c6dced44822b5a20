"""Chunk reads of the CDC backfill: ``SELECT ... WHERE pk > after ORDER BY pk LIMIT n``
on the upstream, in a short REPEATABLE READ, READ ONLY transaction of its own (it takes
ACCESS SHARE only: writers never wait for it), with the watermarks the executor takes
(``backfill_core/executors/cdc.py``; the rules: ``docs/architecture.md#cdc-backfill``):

* ``low`` is the stream's position when the read was planned (the executor's
  ``planned_at_lsn``), and the read's snapshot is checked to see every transaction the
  stream delivered up to there: Postgres makes a commit visible just after writing its
  WAL record, so a delivered change is not visible to a new snapshot by itself (the
  transaction is retried, with a new snapshot, until it is);
* ``high`` is ``pg_current_wal_insert_lsn()`` read after the transaction ended: every
  commit the snapshot sees ended below it.

Keys are compared and ordered as Python orders our values (text keys ``COLLATE "C"``,
bytewise as ours; an index on the key with another collation does not serve that
order, so such a table sorts each chunk). Values are selected as text and parsed as the
stream's are (``values.parse_text``), so a row read here equals the stream's.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Final

from psycopg2 import sql
from psycopg2.extensions import connection as PgConnection

from backfill_core.executors.cdc import ChunkRead, ChunkRows
from backfill_core.schema import ColumnType

from .errors import PgCdcError
from .upstream import UpstreamTable, upstream_call
from .values import parse_text

__all__ = ["DeliveredTransactions", "SnapshotBehind", "chunk_query", "read_chunk"]

SNAPSHOT_WAIT_S: Final = 10.0


class SnapshotBehind(PgCdcError):
    """New snapshots kept missing a transaction the stream delivered (its commit not
    yet visible) for longer than the read waits."""

    code = "cdc_snapshot_behind"


class DeliveredTransactions:
    """The transactions the stream delivered (xid, commit end LSN) that no chunk read's
    snapshot has been seen to hold yet: once one snapshot sees a committed transaction,
    every later one does, so each is checked until it is seen, then forgotten."""

    def __init__(self) -> None:
        self._unseen: dict[int, int] = {}

    def add(self, xid: int, lsn: int) -> None:
        self._unseen[xid] = lsn

    def due(self, upto: int) -> list[int]:
        """The unseen transactions at or below ``upto``."""
        return [x for x, lsn in self._unseen.items() if lsn <= upto]

    def seen(self, xids: Iterable[int]) -> None:
        for x in xids:
            self._unseen.pop(x, None)

    def __len__(self) -> int:
        return len(self._unseen)


def _widen(xid: int, xmax: int) -> int:
    """A 32-bit xid -> the 64-bit one (xid8) nearest to a snapshot's ``xmax``: live
    xids are within 2^31 of each other (Postgres's own wraparound rule)."""
    full = (xmax & ~0xFFFFFFFF) | xid
    if full > xmax + (1 << 31):
        return full - (1 << 32)
    if full < xmax - (1 << 31):
        return full + (1 << 32)
    return full


def invisible(snapshot: str, xids: Iterable[int]) -> list[int]:
    """Of the committed transactions ``xids``, those ``snapshot``
    (``pg_current_snapshot()::text``: ``xmin:xmax:xip,...``) does not see."""
    _, xmax_s, xip_s = snapshot.split(":")
    xmax = int(xmax_s)
    running = {int(x) for x in xip_s.split(",") if x}
    return [x for x in xids if (f := _widen(x, xmax)) >= xmax or f in running]


def chunk_query(table: UpstreamTable, after: bool) -> sql.Composed:
    """The chunk's statement: columns as text, ``(key) > (%s, ...)`` when ``after``,
    key order, ``LIMIT %s``."""
    schema = table.schema

    def key(name: str) -> sql.Composable:
        # qualified: a bare name in ORDER BY would be the output column (its text)
        ident = sql.Identifier("src", name)
        if schema.column(name).type is ColumnType.TEXT:
            return sql.SQL('{} COLLATE "C"').format(ident)
        return ident

    keys = [key(k) for k in schema.primary_key]
    cols = sql.SQL(", ").join(sql.SQL("{}::text").format(sql.Identifier(c)) for c in schema.names)
    where = sql.SQL("")
    if after:
        where = sql.SQL(" WHERE ({}) > ({})").format(
            sql.SQL(", ").join(keys), sql.SQL(", ").join(sql.Placeholder() * len(keys))
        )
    return sql.SQL("SELECT {} FROM {} AS src{} ORDER BY {} LIMIT %s").format(
        cols, table.ref.sql, where, sql.SQL(", ").join(keys)
    )


@upstream_call
def read_chunk(
    conn: PgConnection,
    table: UpstreamTable,
    read: ChunkRead,
    *,
    low: int,
    delivered: DeliveredTransactions | None = None,
    wait_s: float = SNAPSHOT_WAIT_S,
) -> ChunkRows:
    """Run ``read`` (from ``CdcBackfill.plan_reads``) on ``conn`` (autocommit, from
    ``upstream.connect``; no transaction open) and return what ``account`` takes.
    ``low``: the stream's position when the read was planned; ``delivered``: the
    stream's delivered transactions, those up to ``low`` must be visible to the read."""
    query = chunk_query(table, read.after is not None)
    params = [*(read.after or ()), read.limit]
    due = delivered.due(low) if delivered is not None else []
    deadline = time.monotonic() + wait_s
    with conn.cursor() as cur:
        while True:
            cur.execute("BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            try:
                cur.execute("SELECT pg_current_snapshot()::text")  # takes the snapshot
                (snap,) = cur.fetchone()
                missing = invisible(snap, due)
                if not missing:
                    cur.execute(query, params)
                    raw = cur.fetchall()
            finally:
                cur.execute("COMMIT")
            if not missing:
                break
            if time.monotonic() > deadline:
                raise SnapshotBehind(f"transactions {missing} delivered, still not visible")
            time.sleep(0.001)  # a commit is made visible just after its WAL record
        cur.execute("SELECT (pg_current_wal_insert_lsn() - '0/0')::bigint")
        (high,) = cur.fetchone()
    if delivered is not None:
        delivered.seen(due)
    types = [(c.name, c.type) for c in table.schema.columns]
    rows = [tuple(parse_text(t, v, n) for (n, t), v in zip(types, r, strict=True)) for r in raw]
    return ChunkRows(low, int(high), rows, len(rows) < read.limit)
