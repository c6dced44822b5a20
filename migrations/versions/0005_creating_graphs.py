"""barriers.upstream_epoch: what a creating graph's barrier knew of its upstream

A snapshot backfill runs in a creating graph of its own. Each of its barriers records
the upstream (main) graph's committed epoch at injection: the executor's clock during
the snapshot, and how far behind the job is while it replays the log store.

Revision ID: 0005
Revises: 0004
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("barriers", sa.Column("upstream_epoch", sa.BigInteger, nullable=True))


def downgrade() -> None:
    op.drop_column("barriers", "upstream_epoch")
