"""reader views read past their relation's GC epoch: every view recreated

A full scan of ``mv.<name>`` compares each version only with the versions above the
relation's GC epoch (``docs/reading.md``); views made by 0013 sorted every vnode instead.
Same columns, same rows: the old view is exact too, so the downgrade keeps the new one.

Revision ID: 0017
Revises: 0016
"""

import json

from alembic import op
from sqlalchemy import text

from backfill_core.schema import TableSchema
from service.catalog.reader_views import committed_epoch_sql, gc_epoch_sql
from state_store.reader_views import create_reader_view
from state_store.versioned import VersionedTable

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    conn = op.get_bind()
    cur = conn.connection.dbapi_connection.cursor()
    rows = conn.execute(text("SELECT id, name, storage_table, schema FROM relations")).all()
    for rel_id, name, storage_table, schema in rows:
        if isinstance(schema, str):
            schema = json.loads(schema)
        table = VersionedTable(storage_table, TableSchema.from_json(schema))
        create_reader_view(cur, name, table, committed_epoch_sql(rel_id), gc_epoch_sql(rel_id))


def downgrade() -> None:
    pass
