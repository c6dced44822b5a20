"""events: what happened to jobs, kept for dashboards that reconnect

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "events",
        sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
        # no foreign key: a dropped job's events stay readable
        sa.Column("job_id", sa.Integer),
        sa.Column("kind", sa.Text, nullable=False),
        sa.Column("data", JSONB, nullable=False, server_default="{}"),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
    )
    op.create_index("ix_events_job_id_id", "events", ["job_id", "id"])


def downgrade() -> None:
    op.drop_table("events")
