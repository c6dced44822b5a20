"""Staging tables of imports: an unlogged table of a versioned table's layout, without
its indexes, that a Spark job's tasks fill in parallel with COPY, and one statement
that publishes its rows into the versioned table at one epoch (``docs/api.md#imports``).

Rows are staged in the storage layout (``_vnode, <pk>, _epoch, _deleted, <values>``,
the staged ``_epoch`` unused): publishing only stamps the epoch. Every function takes a
psycopg2 cursor and runs in the caller's transaction; identifiers are quoted with
``psycopg2.sql``.
"""

from __future__ import annotations

from typing import Any

from psycopg2 import errors, sql

from backfill_core.changes import Row
from state_store.versioned import DELETED, EPOCH, SCHEMA, VNODE, VersionedTable


def _ids(names: list[str]) -> sql.Composed:
    return sql.SQL(", ").join(sql.Identifier(n) for n in names)


# no epoch is that late: "the latest version of a key", whatever its epoch
LATEST = (1 << 63) - 1


def staging_name(import_id: int) -> str:
    """The staging table of an import (a leading "_", which no table's name has)."""
    return f"_import_{import_id}"


def create_staging(cur: Any, table: VersionedTable, name: str) -> None:
    cur.execute(
        sql.SQL("CREATE UNLOGGED TABLE {} (LIKE {} INCLUDING DEFAULTS)").format(
            sql.Identifier(SCHEMA, name), table.ident
        )
    )


def drop_staging(cur: Any, name: str) -> None:
    cur.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(SCHEMA, name)))


def copy_into_staging(cur: Any, table: VersionedTable, name: str, data: Any) -> None:
    """COPY storage-layout CSV (a file-like ``data``) into the staging table."""
    cur.copy_expert(
        sql.SQL("COPY {} ({}) FROM STDIN WITH (FORMAT csv)").format(
            sql.Identifier(SCHEMA, name), _ids(table.storage_columns)
        ),
        data,
        size=1 << 20,
    )


def first_existing_key(cur: Any, table: VersionedTable, name: str) -> Row | None:
    """A staged key whose latest version in the table is live: an insert of a key that
    exists. (The caller holds the lock that serializes the table's writers.)"""
    return table.first_live_key(cur, LATEST, sql.Identifier(SCHEMA, name))


def first_duplicate_key(cur: Any, table: VersionedTable, name: str) -> Row | None:
    """A key staged more than once."""
    cur.execute(
        sql.SQL("SELECT {} FROM {} GROUP BY {} HAVING count(*) > 1 LIMIT 1").format(
            _ids(table.pk), sql.Identifier(SCHEMA, name), _ids([VNODE, *table.pk])
        )
    )
    row = cur.fetchone()
    return None if row is None else table.decode_key(row)


class DuplicateKey(Exception):
    """Two staged rows have the same key."""


def publish(
    cur: Any,
    table: VersionedTable,
    name: str,
    epoch: int,
    *,
    replace: bool,
    first_load: bool = False,
) -> int:
    """Insert the staged rows into the table as live versions at ``epoch``, in (vnode,
    pk) order (the heap then follows the key index); the rows inserted. ``replace``:
    some key may have a version at ``epoch`` already (a tombstone of a delete in the
    same epoch: the import's row wins, the store's write rule). ``first_load``: the
    table is empty and no job reads it, so its key index may be built after the rows
    (``VersionedTable.drop_key_index_for_load``). ``DuplicateKey`` when two staged rows
    share a key (nothing is written then: the statement failed)."""
    cols = _ids(table.storage_columns)
    chosen = sql.SQL(", ").join(
        sql.Literal(epoch)
        if c == EPOCH
        else sql.SQL("false")
        if c == DELETED
        else sql.Identifier(c)
        for c in table.storage_columns
    )
    q = sql.SQL("INSERT INTO {t} ({cols}) SELECT {chosen} FROM {s} ORDER BY {order}").format(
        t=table.ident,
        cols=cols,
        chosen=chosen,
        s=sql.Identifier(SCHEMA, name),
        order=_ids([VNODE, *table.pk]),
    )
    if replace:
        q = q + table.last_write_wins
    cur.execute("SAVEPOINT import_publish")
    # the sort by (vnode, pk) in memory, not in temporary files (until the savepoint ends)
    cur.execute("SET LOCAL work_mem = '128MB'")
    if first_load:
        # the staged rows first: a wait for them (a task of a stopped job still holding
        # them) must not come while the lock below keeps the table's readers waiting
        cur.execute(
            sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(sql.Identifier(SCHEMA, name))
        )
    dropped = first_load and table.drop_key_index_for_load(cur)
    try:
        cur.execute(q)
        rows = int(cur.rowcount)
        if dropped:
            table.build_key_index(cur)
    except (errors.UniqueViolation, errors.CardinalityViolation):
        cur.execute("ROLLBACK TO SAVEPOINT import_publish")
        raise DuplicateKey from None
    cur.execute("SET LOCAL work_mem TO DEFAULT")
    cur.execute("RELEASE SAVEPOINT import_publish")
    return rows
