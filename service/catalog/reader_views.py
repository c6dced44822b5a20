"""A relation's SQL view for other services (``docs/reading.md``), created and dropped in
the transaction that creates or drops the relation. The view reads the committed epoch
of the relation's graph and the relation's garbage-collection epoch from the catalog each
time it is queried (an MV's graph changes when its snapshot backfill merges into the main
graph)."""

from __future__ import annotations

import json
from typing import Any

from psycopg2 import sql

from backfill_core.schema import TableSchema
from service.catalog.models import Graph, Relation
from service.catalog.queries import storage_of
from state_store.reader_views import READER_SCHEMA, create_reader_view, drop_reader_view
from state_store.versioned import VersionedTable


def sql_name(rel: Relation) -> str:
    """The view's name as a SQL client writes it (names are lower-case identifiers)."""
    return f"{READER_SCHEMA}.{rel.name}"


def committed_epoch_sql(relation_id: int) -> sql.Composed:
    return sql.SQL(
        "SELECT g.committed_epoch FROM {graphs} g JOIN {relations} r ON r.graph_id = g.id "
        "WHERE r.id = {id}"
    ).format(
        graphs=sql.Identifier(Graph.__tablename__),
        relations=sql.Identifier(Relation.__tablename__),
        id=sql.Literal(relation_id),
    )


def gc_epoch_sql(relation_id: int) -> sql.Composed:
    return sql.SQL("SELECT r.gc_epoch FROM {relations} r WHERE r.id = {id}").format(
        relations=sql.Identifier(Relation.__tablename__), id=sql.Literal(relation_id)
    )


def create_view_of(cur: Any, rel: Relation) -> None:
    create_reader_view(
        cur, rel.name, storage_of(rel), committed_epoch_sql(rel.id), gc_epoch_sql(rel.id)
    )


def drop_view_of(cur: Any, rel: Relation) -> None:
    drop_reader_view(cur, rel.name)


def recreate_all_views(cur: Any) -> None:
    """(Re)create every relation's view with the current definition (migrations)."""
    cur.execute(f"SELECT id, name, storage_table, schema FROM {Relation.__tablename__}")
    for rel_id, name, storage_table, schema in cur.fetchall():
        if isinstance(schema, str):
            schema = json.loads(schema)
        table = VersionedTable(storage_table, TableSchema.from_json(schema))
        create_reader_view(cur, name, table, committed_epoch_sql(rel_id), gc_epoch_sql(rel_id))
