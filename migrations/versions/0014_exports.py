"""exports: a relation's snapshot at a committed epoch written as files by a worker

``POST /v1/tables/{name}/exports`` queues one (pinning its epoch of the relation in
``epoch_pins`` as ``export:<id>``); a worker claims it, writes the files with Spark and
reports how it ended (``docs/reading.md#exports``).

Revision ID: 0014
Revises: 0013
"""

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "exports",
        sa.Column("id", sa.Integer, primary_key=True),
        # NULL once the relation is dropped: the export's record stays
        sa.Column(
            "relation_id",
            sa.Integer,
            sa.ForeignKey("relations.id", ondelete="SET NULL"),
            nullable=True,
        ),
        sa.Column("relation", sa.Text, nullable=False),
        sa.Column("format", sa.Text, nullable=False),
        sa.Column("path", sa.Text, nullable=False),
        sa.Column("epoch", sa.BigInteger, nullable=False),
        # queued | running | succeeded | failed | cancelled
        sa.Column("state", sa.Text, nullable=False),
        sa.Column("rows", sa.BigInteger, nullable=True),
        sa.Column("error", sa.Text, nullable=True),
        sa.Column("worker_id", sa.Integer, sa.ForeignKey("workers.id"), nullable=True),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
    )
    op.create_index("ix_exports_state", "exports", ["state"])


def downgrade() -> None:
    op.drop_table("exports")
