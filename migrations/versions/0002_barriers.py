"""barriers, collects, pending mutations; actor lifetimes; graph recovery bookkeeping

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "graphs", sa.Column("recovery_seq", sa.Integer, nullable=False, server_default="0")
    )
    op.add_column("graphs", sa.Column("recovery_reason", sa.Text))
    op.add_column(
        "graphs", sa.Column("barrier_seq", sa.BigInteger, nullable=False, server_default="0")
    )
    op.add_column("actors", sa.Column("first_epoch", sa.BigInteger))
    op.add_column("actors", sa.Column("last_epoch", sa.BigInteger))
    op.create_table(
        "barriers",
        sa.Column(
            "graph_id", sa.Integer, sa.ForeignKey("graphs.id", ondelete="CASCADE"), primary_key=True
        ),
        sa.Column("curr_epoch", sa.BigInteger, primary_key=True),
        sa.Column("prev_epoch", sa.BigInteger, nullable=False),
        sa.Column("kind", sa.Text, nullable=False),
        sa.Column("mutation", JSONB),
        sa.Column("state", sa.Text, nullable=False, server_default="inflight"),
        sa.Column(
            "injected_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.Column("committed_at", sa.DateTime(timezone=True)),
        sa.CheckConstraint("kind IN ('initial', 'barrier', 'checkpoint')", name="kind"),
        sa.CheckConstraint("state IN ('inflight', 'collected', 'committed')", name="state"),
        sa.CheckConstraint("prev_epoch < curr_epoch", name="order"),
    )
    op.create_index("ix_barriers_graph_id_state", "barriers", ["graph_id", "state"])
    op.create_table(
        "barrier_collects",
        sa.Column(
            "actor_id", sa.Integer, sa.ForeignKey("actors.id", ondelete="CASCADE"), primary_key=True
        ),
        sa.Column("curr_epoch", sa.BigInteger, primary_key=True),
        sa.Column(
            "graph_id", sa.Integer, sa.ForeignKey("graphs.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column("prev_epoch", sa.BigInteger, nullable=False),
        sa.Column("progress", JSONB),
        sa.Column("rows", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("finished", sa.Boolean, nullable=False, server_default=sa.false()),
        sa.Column(
            "collected_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
    )
    op.create_index(
        "ix_barrier_collects_graph_id_curr_epoch", "barrier_collects", ["graph_id", "curr_epoch"]
    )
    op.create_table(
        "pending_mutations",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column(
            "graph_id", sa.Integer, sa.ForeignKey("graphs.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column("mutation", JSONB, nullable=False),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
    )


def downgrade() -> None:
    op.drop_table("pending_mutations")
    op.drop_index("ix_barrier_collects_graph_id_curr_epoch", "barrier_collects")
    op.drop_table("barrier_collects")
    op.drop_index("ix_barriers_graph_id_state", "barriers")
    op.drop_table("barriers")
    op.drop_column("actors", "last_epoch")
    op.drop_column("actors", "first_epoch")
    op.drop_column("graphs", "barrier_seq")
    op.drop_column("graphs", "recovery_reason")
    op.drop_column("graphs", "recovery_seq")
