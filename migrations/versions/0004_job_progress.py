"""job_progress: consumed rows that never go back, and a rows/s window in epoch time

Kept apart from ``jobs`` so that the commit, which writes it at every barrier, never
waits for a job row that an API call has locked (pause, rate change, drop).

Revision ID: 0004
Revises: 0003
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "job_progress",
        sa.Column("job_id", sa.Integer, primary_key=True),
        sa.Column("consumed_rows", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("window_rows", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("window_epoch", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("rows_per_s", sa.Float, nullable=False, server_default="0"),
    )


def downgrade() -> None:
    op.drop_table("job_progress")
