"""api_tokens: the bearer tokens the API accepts, as sha256 hashes with their role

A token is never stored, only the hex sha256 of it. ``source`` says where it came from:
``settings`` (BACKFILL_ADMIN_TOKEN and the like; replaced when the setting changes),
``generated`` (the admin token made at first start and shown once), ``embedded-worker``
(the worker the control plane spawns, one per start) or ``session`` (e.g. the demo's).

Revision ID: 0009
Revises: 0008
"""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "api_tokens",
        sa.Column("token_hash", sa.Text, primary_key=True),
        sa.Column("role", sa.Text, nullable=False),
        sa.Column("source", sa.Text, nullable=False),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.CheckConstraint("role IN ('admin', 'reader', 'worker')", name="role"),
        sa.CheckConstraint("token_hash ~ '^[0-9a-f]{64}$'", name="sha256_hex"),
    )


def downgrade() -> None:
    op.drop_table("api_tokens")
