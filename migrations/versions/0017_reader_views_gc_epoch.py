"""reader views read past their relation's GC epoch: every view recreated

A full scan of ``mv.<name>`` compares each version only with the versions above the
relation's GC epoch (``docs/reading.md``); views made by 0013 sorted every vnode instead.
Same columns, same rows: the old view is exact too, so the downgrade keeps the new one.

Revision ID: 0017
Revises: 0016
"""

from alembic import op

from service.catalog.reader_views import recreate_all_views

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    cur = op.get_bind().connection.dbapi_connection.cursor()
    recreate_all_views(cur)


def downgrade() -> None:
    pass
