"""work_rounds: a Spark job that spans epochs (its groups run in rounds at released epochs)

A pushed-down Spark job of an unthrottled backfill may outlive a barrier: its tasks run
each group of reads as one transaction (a *round*) at the epoch the worker's driver
released in the job's ``work_queues`` row (``write_epoch``, reading the snapshot at
``read_epoch``), and wait while the graph has moved past it (a barrier was injected).
Each round leaves its per-vnode summary in ``work_rounds``, in the transaction that
wrote its rows, for the driver to account at the next barrier. Unlogged, as
``work_queues``: a row lives as long as one Spark job.

Revision ID: 0012
Revises: 0011
"""

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # NULL: a job of one epoch (its plan carries the epochs)
    op.add_column("work_queues", sa.Column("write_epoch", sa.BigInteger, nullable=True))
    op.add_column("work_queues", sa.Column("read_epoch", sa.BigInteger, nullable=True))
    op.create_table(
        "work_rounds",
        sa.Column("token", sa.Text, primary_key=True),
        sa.Column("grp", sa.Integer, primary_key=True),
        sa.Column("read_epoch", sa.BigInteger, nullable=False),
        sa.Column("write_epoch", sa.BigInteger, nullable=False),
        # JSON: [[vnode, rows read, last key read], ...]
        sa.Column("summary", sa.Text, nullable=False),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        prefixes=["UNLOGGED"],
    )


def downgrade() -> None:
    op.drop_table("work_rounds")
    op.drop_column("work_queues", "read_epoch")
    op.drop_column("work_queues", "write_epoch")
