"""relations.epoch_indexed: whether the state-store table has its index on ``_epoch``

An MV is created without it (its backfill's writes would keep it up row by row, a
third of their time) and gets it once the backfill is done; until then garbage
collection leaves the MV alone, and rollback and change-log reads scan it.

Revision ID: 0010
Revises: 0009
"""

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "relations",
        sa.Column("epoch_indexed", sa.Boolean, nullable=False, server_default=sa.true()),
    )


def downgrade() -> None:
    op.drop_column("relations", "epoch_indexed")
