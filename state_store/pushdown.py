"""Snapshot reads that write their view inside Postgres (pushdown).

When an MV and its upstream live in one database and the view has a SQL form
(``view_sql``), an epoch's snapshot reads need not leave the server: one statement
reads them (the same per-vnode branches as ``VersionedTable.snapshot_reads_query``),
writes the view of those rows into the MV at the write epoch, and answers what the
executor accounts for, per vnode: how many rows were read and the last key read
(``account`` with a ``VnodeSummary``, as for rows a Spark task moved). It is an
``INSERT ... SELECT`` of the server's own, which is why an MV can be created about as fast as one.
"""

from __future__ import annotations

import itertools
import weakref
from collections import OrderedDict
from collections.abc import Callable, Sequence
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
    *,
    limit: int | None = None,
) -> dict[int, tuple[int, Row]]:
    """Read ``(vnode, after pk, limit)`` at ``read_epoch``, write the rows ``where``
    keeps (projected to the MV's columns) at ``write_epoch``; per vnode that had rows,
    ``(rows read, last pk read)``. Runs in the caller's transaction (fence it first).

    With ``limit``, the reads stop once ``limit`` rows are read in all (a batch read,
    ``SnapshotBatchRead``): in whatever order the branches run, each vnode's rows are
    its first after its position, which is all its accounting assumes.

    The last write of a key in an epoch wins, as with ``VersionedTable.write``: a key
    the MV already has at ``write_epoch`` is updated (a savepoint retries the insert as
    an upsert, which costs more and is rarely needed).

    The statement is prepared once per connection and shape of reads, with a generic
    plan: a throttled epoch's read of a few rows in each of 64 vnodes spent two thirds
    of its time composing and planning its 64 branches. Being prepared, its text also
    goes to the server as it is, without the driver's ``%`` formatting (a filter's text
    constant may hold a ``%``).
    """
    if not reads:
        return {}
    limited = limit is not None
    reads = _padded(reads)
    params = [*upstream.snapshot_params(read_epoch, reads), *([limit] if limited else [])]
    params.append(write_epoch)
    where_text = where.as_string(cur)
    pattern = tuple(a is None for _, a, _ in reads)
    shape = (upstream.identity, mv.identity, pattern, where_text, limited)
    cur.execute("SAVEPOINT view_write")
    try:
        rows = _execute(
            cur,
            (*shape, False),
            lambda: _statement(upstream, mv, reads, where, False, limited),
            params,
        )
    except errors.UniqueViolation:
        cur.execute("ROLLBACK TO SAVEPOINT view_write")
        rows = _execute(
            cur,
            (*shape, True),
            lambda: _statement(upstream, mv, reads, where, True, limited),
            params,
        )
    cur.execute("RELEASE SAVEPOINT view_write")
    decode = upstream.decode_key
    return {int(r[0]): (int(r[1]), decode(r[2:])) for r in rows}


NO_VNODE = -1  # the vnode of the reads that pad a statement: no row has it


def _padded(
    reads: Sequence[tuple[int, Row | None, int]],
) -> list[tuple[int, Row | None, int]]:
    """The reads in a canonical shape: those from a position first, then those from a
    vnode's start, each group padded to a power of two with reads of no rows (vnode
    ``NO_VNODE``, limit 0). A backfill's vnodes run dry one by one near its end: without
    this, every epoch there would prepare (and plan) a statement of a new shape."""
    started = [r for r in reads if r[1] is not None]
    fresh = [r for r in reads if r[1] is None]
    if started:
        started += [(NO_VNODE, started[0][1], 0)] * (_bucket(len(started)) - len(started))
    if fresh:
        fresh += [(NO_VNODE, None, 0)] * (_bucket(len(fresh)) - len(fresh))
    return started + fresh


def _bucket(n: int) -> int:
    return 1 << (n - 1).bit_length()


def _statement(
    upstream: VersionedTable,
    mv: VersionedTable,
    reads: Sequence[tuple[int, Row | None, int]],
    where: sql.Composable,
    upsert: bool,
    limited: bool,
) -> sql.Composable:
    """The statement of ``write_view`` with ``$n`` placeholders: the snapshot reads',
    the limit of them all (``limited``), then the write epoch."""
    numbers = itertools.count(1)

    def param() -> sql.Composable:
        return sql.SQL(f"${next(numbers)}")

    select, _ = upstream.snapshot_reads_query(0, reads, param=param)
    if limited:
        # in any order of the branches (account_batch needs none), the limit of them all
        select = sql.SQL("SELECT * FROM ({}) u LIMIT {}").format(select, param())
    pk = upstream.schema.primary_key
    mv_values = [c.name for c in mv.schema.value_columns]
    write = sql.SQL(
        "INSERT INTO {mv} ({cols}) SELECT {r}.{vn}, {pk}, {epoch}::bigint, false{values} "
        "FROM {r} WHERE {where}"
    ).format(
        mv=mv.ident,
        cols=sql.SQL(", ").join(sql.Identifier(c) for c in mv.storage_columns),
        r=sql.Identifier(READ),
        vn=sql.Identifier(VNODE),
        pk=sql.SQL(", ").join(sql.Identifier(READ, c) for c in mv.schema.primary_key),
        epoch=param(),
        values=sql.SQL("").join(sql.SQL(", {}").format(sql.Identifier(READ, c)) for c in mv_values),
        where=where,
    )
    if upsert:
        write = write + mv.last_write_wins
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
    return sql.SQL("WITH {r} AS ({select}), w AS ({write}) {summary}").format(
        r=sql.Identifier(READ), select=select, write=write, summary=summary
    )


# prepared statements per connection (they live as long as its session):
# shape -> (name, the text that executes it)
_PREPARED: weakref.WeakKeyDictionary[Any, OrderedDict[tuple[Any, ...], tuple[str, str]]] = (
    weakref.WeakKeyDictionary()
)
PREPARED_PER_CONNECTION = 32  # the least recently used beyond this are deallocated
_names = itertools.count(1)


def _execute(
    cur: Any,
    shape: tuple[Any, ...],
    statement: Callable[[], sql.Composable],
    params: list[Any],
) -> list[tuple[Any, ...]]:
    """Execute the statement of ``shape`` (prepared on first use) with ``params``, index
    ordered with the generic plan (it does not depend on the positions and limits the
    parameters carry)."""
    prepared = _PREPARED.setdefault(cur.connection, OrderedDict())
    found = prepared.get(shape)
    if found is None:
        name = f"backfill_write_view_{next(_names)}"
        # no parameters: the text goes as it is (a PREPARE is not undone by a rollback)
        cur.execute(sql.SQL("PREPARE {} AS ").format(sql.Identifier(name)) + statement())
        run = sql.SQL("EXECUTE {} ({})").format(
            sql.Identifier(name), sql.SQL(", ").join(sql.Placeholder() * len(params))
        )
        found = prepared[shape] = (name, run.as_string(cur))
        while len(prepared) > PREPARED_PER_CONNECTION:
            _, (old, _) = prepared.popitem(last=False)
            cur.execute(sql.SQL("DEALLOCATE {}").format(sql.Identifier(old)))
    else:
        prepared.move_to_end(shape)
    return index_ordered(cur, sql.SQL(found[1]), params, generic_plan=True)
