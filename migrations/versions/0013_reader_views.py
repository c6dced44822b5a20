"""reader views: the schema ``mv`` and a view of every relation's committed snapshot

Other services read a relation through ``mv.<name>`` (``docs/reading.md``); new
relations get theirs when they are created, existing ones here.

Revision ID: 0013
Revises: 0012
"""

import json

from alembic import op
from sqlalchemy import text

from backfill_core.schema import TableSchema
from service.catalog.reader_views import committed_epoch_sql, gc_epoch_sql
from state_store.reader_views import READER_SCHEMA, create_reader_schema, create_reader_view
from state_store.versioned import VersionedTable

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    conn = op.get_bind()
    cur = conn.connection.dbapi_connection.cursor()
    create_reader_schema(cur)
    rows = conn.execute(text("SELECT id, name, storage_table, schema FROM relations")).all()
    for rel_id, name, storage_table, schema in rows:
        if isinstance(schema, str):
            schema = json.loads(schema)
        table = VersionedTable(storage_table, TableSchema.from_json(schema))
        create_reader_view(cur, name, table, committed_epoch_sql(rel_id), gc_epoch_sql(rel_id))


def downgrade() -> None:
    op.execute(f"DROP SCHEMA IF EXISTS {READER_SCHEMA} CASCADE")
