"""job_progress.total_estimate: the total behind the percent, fixed when the job starts

The upstream's row estimate when the job was created (the rows of its snapshot), so the
percent never goes back while the upstream grows. NULL: unknown then (a table the
planner has not analysed yet); the live estimate stands in.

Revision ID: 0006
Revises: 0005
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("job_progress", sa.Column("total_estimate", sa.BigInteger, nullable=True))


def downgrade() -> None:
    op.drop_column("job_progress", "total_estimate")
