"""Snapshot reads that write their view inside Postgres (pushdown).

When an MV and its upstream live in one database and the view has a SQL form
(``view_sql``), an epoch's snapshot reads need not leave the server: one statement
reads them (the same per-vnode branches as ``VersionedTable.snapshot_reads_query``),
writes the view of those rows into the MV at the write epoch, and answers what the
executor accounts for, per vnode: how many rows were read and the last key read
(``on_read_summary``, as for rows a Spark task moved). It is an ``INSERT ... SELECT``
of the server's own, which is why an MV can be created about as fast as one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from psycopg2 import errors, sql

from backfill_core.changes import Row
from backfill_core.schema import ColumnType
from state_store.versioned import VNODE, VersionedTable, index_ordered

READ = "r"  # the alias of the rows read, which the view's condition refers to
_HAS_MAX = {
    ColumnType.SMALLINT,
    ColumnType.INT,
    ColumnType.BIGINT,
    ColumnType.DOUBLE,
    ColumnType.NUMERIC,
    ColumnType.TEXT,
    ColumnType.DATE,
    ColumnType.TIMESTAMP,
    ColumnType.TIMESTAMPTZ,
}


def write_view(
    cur: Any,
    upstream: VersionedTable,
    mv: VersionedTable,
    read_epoch: int,
    reads: Sequence[tuple[int, Row | None, int]],
    where: sql.Composable,
    write_epoch: int,
) -> dict[int, tuple[int, Row]]:
    """Read ``(vnode, after pk, limit)`` at ``read_epoch``, write the rows ``where``
    keeps (projected to the MV's columns) at ``write_epoch``; per vnode that had rows,
    ``(rows read, last pk read)``. Runs in the caller's transaction (fence it first).

    The last write of a key in an epoch wins, as with ``VersionedTable.write``: a key
    the MV already has at ``write_epoch`` is updated (a savepoint retries the insert as
    an upsert, which costs more and is rarely needed).
    """
    if not reads:
        return {}
    select, params = upstream.snapshot_reads_query(read_epoch, reads)
    pk = upstream.schema.primary_key
    mv_values = [c.name for c in mv.schema.value_columns]
    insert = sql.SQL(
        "INSERT INTO {mv} ({cols}) SELECT {r}.{vn}, {pk}, {epoch}, false{values} FROM {r} "
        "WHERE {where}"
    ).format(
        mv=mv.ident,
        cols=sql.SQL(", ").join(sql.Identifier(c) for c in mv.storage_columns),
        r=sql.Identifier(READ),
        vn=sql.Identifier(VNODE),
        pk=sql.SQL(", ").join(sql.Identifier(READ, c) for c in mv.schema.primary_key),
        epoch=sql.Literal(write_epoch),
        values=sql.SQL("").join(sql.SQL(", {}").format(sql.Identifier(READ, c)) for c in mv_values),
        where=where,
    )
    upsert = insert + mv.last_write_wins
    keys = sql.SQL(", ").join(sql.Identifier(c) for c in pk)
    if len(pk) == 1 and upstream.schema.pk_types[0] in _HAS_MAX:
        # max in the key's own order (and collation): what the index and the reads follow
        summary = sql.SQL("SELECT _vnode, count(*), max({k}) FROM {r} GROUP BY _vnode").format(
            k=keys, r=sql.Identifier(READ)
        )
    else:
        desc = sql.SQL(", ").join(sql.SQL("{} DESC").format(sql.Identifier(c)) for c in pk)
        summary = sql.SQL(
            "SELECT DISTINCT ON (_vnode) _vnode, count(*) OVER (PARTITION BY _vnode), {k} "
            "FROM {r} ORDER BY _vnode, {desc}"
        ).format(k=keys, r=sql.Identifier(READ), desc=desc)

    def statement(write: sql.Composable) -> sql.Composable:
        return sql.SQL("WITH {r} AS ({select}), w AS ({write}) {summary}").format(
            r=sql.Identifier(READ), select=select, write=write, summary=summary
        )

    cur.execute("SAVEPOINT view_write")
    try:
        rows = index_ordered(cur, statement(insert), params)
    except errors.UniqueViolation:
        cur.execute("ROLLBACK TO SAVEPOINT view_write")
        rows = index_ordered(cur, statement(upsert), params)
    cur.execute("RELEASE SAVEPOINT view_write")
    decode = upstream.decode_key
    return {int(r[0]): (int(r[1]), decode(r[2:])) for r in rows}
