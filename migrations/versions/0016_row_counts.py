"""row counts: each user table's net rows per epoch of DML, for exact progress totals

A job's total is its upstream table's committed row count when it is created, the sum
of these deltas up to that epoch (``docs/architecture.md#progress-events-and-metrics``). Existing tables get
one delta at epoch 0: their rows now (tables are never rolled back).

Revision ID: 0016
Revises: 0015
"""

import json

import sqlalchemy as sa
from alembic import op
from psycopg2 import sql
from sqlalchemy import text

from backfill_core.schema import TableSchema
from state_store.versioned import DELETED, EPOCH, VersionedTable

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "row_count_deltas",
        sa.Column(
            "relation_id",
            sa.Integer,
            sa.ForeignKey("relations.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("epoch", sa.BigInteger, primary_key=True),
        sa.Column("delta", sa.BigInteger, nullable=False),
    )
    conn = op.get_bind()
    cur = conn.connection.dbapi_connection.cursor()
    tables = conn.execute(
        text("SELECT id, storage_table, schema FROM relations WHERE kind = 'table'")
    ).all()
    for rel_id, storage_table, schema in tables:
        if isinstance(schema, str):
            schema = json.loads(schema)
        table = VersionedTable(storage_table, TableSchema.from_json(schema))
        pk = sql.SQL(", ").join(map(sql.Identifier, table.pk))
        cur.execute(
            sql.SQL(
                "SELECT count(*) FROM (SELECT DISTINCT ON ({pk}) {dl} FROM {t} "
                "ORDER BY {pk}, {ep} DESC) x WHERE NOT x.{dl}"
            ).format(pk=pk, dl=sql.Identifier(DELETED), t=table.ident, ep=sql.Identifier(EPOCH))
        )
        (rows,) = cur.fetchone()
        if rows:
            cur.execute(
                "INSERT INTO row_count_deltas (relation_id, epoch, delta) VALUES (%s, 0, %s)",
                [rel_id, rows],
            )


def downgrade() -> None:
    op.drop_table("row_count_deltas")
