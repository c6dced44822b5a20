"""imports: files loaded into a table by a worker's Spark job, published at one epoch

``POST /v1/tables/{name}/imports`` queues one; a worker claims it (the control plane
creates its staging table, ``store._import_<id>``, recorded in ``staging`` until it is
dropped), loads the files into the staging table with Spark and reports; the control
plane then publishes the rows into the table at one epoch (``docs/api.md#imports``).

Revision ID: 0018
Revises: 0017
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "imports",
        sa.Column("id", sa.Integer, primary_key=True),
        # NULL once the table is dropped: the import's record stays
        sa.Column(
            "relation_id",
            sa.Integer,
            sa.ForeignKey("relations.id", ondelete="SET NULL"),
            nullable=True,
        ),
        sa.Column("relation", sa.Text, nullable=False),
        sa.Column("format", sa.Text, nullable=False),
        sa.Column("path", sa.Text, nullable=False),
        # queued | running | succeeded | failed | cancelled
        sa.Column("state", sa.Text, nullable=False),
        # the epoch the rows were published at, once succeeded
        sa.Column("epoch", sa.BigInteger, nullable=True),
        sa.Column("rows", sa.BigInteger, nullable=True),
        sa.Column("error", sa.Text, nullable=True),
        sa.Column("error_code", sa.Text, nullable=True),
        sa.Column("error_details", JSONB, nullable=True),
        # the staging table in the store's schema while it exists
        sa.Column("staging", sa.Text, nullable=True),
        sa.Column("worker_id", sa.Integer, sa.ForeignKey("workers.id"), nullable=True),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
    )
    op.create_index("ix_imports_state", "imports", ["state"])


def downgrade() -> None:
    op.drop_table("imports")
