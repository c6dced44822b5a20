"""work_queues: the groups of reads a pushed-down Spark job's tasks share

A Spark job's tasks take its groups of vnode reads one at a time, in order, by bumping
``taken`` of the job's row (the worker's driver creates it before the job and deletes it
after; a task that finds it gone stops). A task that finishes early takes the next group
instead of idling while another task works through a share fixed in advance. Unlogged:
a row lives as long as one Spark job, which a server crash fails anyway.

Revision ID: 0011
Revises: 0010
"""

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "work_queues",
        sa.Column("token", sa.Text, primary_key=True),
        sa.Column("taken", sa.Integer, nullable=False, server_default="0"),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        prefixes=["UNLOGGED"],
    )


def downgrade() -> None:
    op.drop_table("work_queues")
