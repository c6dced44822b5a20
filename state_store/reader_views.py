"""The SQL view other services read a relation through (``docs/reading.md``).

``mv.<name>`` shows the user's columns of the latest committed snapshot: per key the
latest version at or below the committed epoch, tombstones dropped. The committed epoch
is read inside the view (an expression the caller gives: the store does not know the
catalog), so versions of epochs not committed yet, which a recovery may roll back, never
show. The view walks the key index one vnode after the other, as snapshot reads do, so a
lookup by key probes each vnode's part of the index instead of reading all of it.
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
    cur: Any, name: str, table: VersionedTable, committed: sql.Composable
) -> None:
    """(Re)create the view ``mv.<name>`` of ``table``; ``committed`` is a scalar SQL expression giving
    the committed epoch, evaluated once per query (an uncorrelated subquery).

    The epoch bound is written ``(... <= ...) IS NOT FALSE`` (the same rows: neither side
    is NULL) so that the planner estimates most versions pass it: a plain ``<=`` against
    a value it cannot see is estimated to keep a third, and it then reads each vnode by
    a bitmap scan and sorts it, where walking the key index needs no sort
    (``bench/bench_reader_view.py``: 2.2x a plain table's scan with the sort, 1.8x
    without, in a quick run).
    """

    # the series' alias starts with "_", which no user's name does: a relation named
    # like it would hide it inside the subquery
    def ids(names: list[str], prefix: str | None = None) -> sql.Composed:
        return sql.SQL(", ").join(sql.Identifier(*([prefix] if prefix else []), n) for n in names)

    q = sql.SQL(
        "CREATE OR REPLACE VIEW {view} AS SELECT {xcols} "
        "FROM generate_series(0, {last}) AS _vnodes(vn) CROSS JOIN LATERAL "
        "(SELECT DISTINCT ON ({pk}) {cols}, {dl} FROM {t} "
        "WHERE {vnode} = _vnodes.vn AND ({ep} <= ({committed})) IS NOT FALSE ORDER BY {pk}, {ep} DESC) x "
        "WHERE NOT x.{dl}"
    ).format(
        view=reader_view_ident(name),
        xcols=ids(table.names, "x"),
        last=sql.Literal(table.schema.vnode_count - 1),
        pk=ids(table.pk),
        cols=ids(table.names),
        dl=sql.Identifier(DELETED),
        t=table.ident,
        vnode=sql.Identifier(VNODE),
        ep=sql.Identifier(EPOCH),
        committed=committed,
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
