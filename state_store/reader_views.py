"""The SQL view other services read a relation through (``docs/reading.md``).

``mv.<name>`` shows the user's columns of the latest committed snapshot: per key the
latest version at or below the committed epoch, tombstones dropped. The committed epoch
is read inside the view (an expression the caller gives: the store does not know the
catalog), so versions of epochs not committed yet, which a recovery may roll back, never
show. The view reads one vnode after the other, so a lookup by key probes each vnode's
part of the key index instead of reading all of it.
"""

from __future__ import annotations

from typing import Any

from psycopg2 import sql

from state_store.versioned import DELETED, EPOCH, VNODE, VersionedTable

READER_SCHEMA = "mv"


def reader_view_ident(name: str) -> sql.Identifier:
    return sql.Identifier(READER_SCHEMA, name)


def create_reader_schema(cur: Any) -> None:
    cur.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(READER_SCHEMA)))


def create_reader_view(
    cur: Any,
    name: str,
    table: VersionedTable,
    committed: sql.Composable,
    gc_epoch: sql.Composable,
) -> None:
    """(Re)create the view ``mv.<name>`` of ``table``. ``committed`` and ``gc_epoch`` are
    scalar SQL expressions giving the committed epoch and the table's garbage-collection
    epoch, each evaluated once per query (uncorrelated subqueries, read in the query's
    snapshot with the table's rows).

    A version is shown when it is at or below the committed epoch, not a tombstone, and no
    version of its key in ``(its epoch, committed]`` supersedes it. After garbage
    collection a key has at most one version at or below the GC epoch (``VersionedTable.gc``
    deletes the others in the transaction that moves the epoch, and nothing is written at
    or below it after), so only versions above the GC epoch can supersede one: per vnode
    they are few, and the check is a hash anti-join against them instead of a sort of the
    whole vnode (``bench/HISTORY.md``, reader view). A lookup by key probes the key index
    per vnode on both sides.

    Two bounds are written so that the planner cannot take them for selective (against
    values it cannot see, a range looks like half a percent of the rows, a bound like a
    third): the one on the versions shown as ``(... <= ...) IS NOT FALSE`` (the same rows:
    neither side is NULL), else it reads them through the epoch index; the range
    ``(gc epoch, committed]`` of the superseding versions as a ``CASE``, else it expects a
    handful of them per vnode and compares each version with each of them (a nested
    loop) where it should hash them, which with many versions above the GC epoch (or
    before the first collection) costs their number times the vnode's.
    """

    # aliases start with "_", which no user's name does: a relation named like one of
    # them would hide it inside the subqueries
    def ids(names: list[str], prefix: str | None = None) -> sql.Composed:
        return sql.SQL(", ").join(sql.Identifier(*([prefix] if prefix else []), n) for n in names)

    same_key = sql.SQL(" AND ").join(
        sql.SQL("{} = {}").format(sql.Identifier("_n", c), sql.Identifier("_v", c))
        for c in [VNODE, *table.pk]
    )
    q = sql.SQL(
        "CREATE OR REPLACE VIEW {view} AS SELECT {xcols} "
        "FROM generate_series(0, {last}) AS _vnodes(vn) CROSS JOIN LATERAL "
        "(SELECT {vcols} FROM {t} _v WHERE _v.{vnode} = _vnodes.vn "
        "AND (_v.{ep} <= ({committed})) IS NOT FALSE AND NOT _v.{dl} "
        "AND NOT EXISTS (SELECT FROM {t} _n WHERE {same_key} AND _n.{ep} > _v.{ep} "
        "AND CASE WHEN _n.{ep} > ({gc_epoch}) THEN _n.{ep} <= ({committed}) ELSE false END)) _x"
    ).format(
        view=reader_view_ident(name),
        xcols=ids(table.names, "_x"),
        last=sql.Literal(table.schema.vnode_count - 1),
        vcols=ids(table.names, "_v"),
        dl=sql.Identifier(DELETED),
        t=table.ident,
        vnode=sql.Identifier(VNODE),
        ep=sql.Identifier(EPOCH),
        committed=committed,
        gc_epoch=gc_epoch,
        same_key=same_key,
    )
    cur.execute(q)


def drop_reader_view(cur: Any, name: str) -> None:
    cur.execute(sql.SQL("DROP VIEW IF EXISTS {}").format(reader_view_ident(name)))


def create_reader_role(cur: Any, role: str, password: str | None) -> None:
    """A role that may select from the views in ``mv`` and nothing else: no other
    schema's tables are granted to it, its transactions are read-only, and views created
    later by the current role are granted to it as they come."""
    r = sql.Identifier(role)
    schema = sql.Identifier(READER_SCHEMA)
    login = (
        sql.SQL("LOGIN PASSWORD {}").format(sql.Literal(password)) if password else sql.SQL("LOGIN")
    )
    cur.execute(sql.SQL("CREATE ROLE {} {} NOSUPERUSER NOCREATEDB NOCREATEROLE").format(r, login))
    cur.execute(sql.SQL("ALTER ROLE {} SET default_transaction_read_only = on").format(r))
    cur.execute(sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(schema, r))
    cur.execute(sql.SQL("GRANT SELECT ON ALL TABLES IN SCHEMA {} TO {}").format(schema, r))
    cur.execute(
        sql.SQL("ALTER DEFAULT PRIVILEGES IN SCHEMA {} GRANT SELECT ON TABLES TO {}").format(
            schema, r
        )
    )
