"""reader views: the schema ``mv`` and a view of every relation's committed snapshot

Other services read a relation through ``mv.<name>`` (``docs/reading.md``); new
relations get theirs when they are created, existing ones here.

Revision ID: 0013
Revises: 0012
"""

from alembic import op

from service.catalog.reader_views import recreate_all_views
from state_store.reader_views import READER_SCHEMA, create_reader_schema

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    cur = op.get_bind().connection.dbapi_connection.cursor()
    create_reader_schema(cur)
    recreate_all_views(cur)


def downgrade() -> None:
    op.execute(f"DROP SCHEMA IF EXISTS {READER_SCHEMA} CASCADE")
