"""Imports published at a reserved future epoch (issue 36)

``epoch_holds``: an epoch a publication writes at, ahead of the open one; the barrier
that would close an epoch at or past it waits for the publication (and drops the hold).
``relations.write_floor_epoch``: the epoch the table's last import was published at;
later writes of the table go at or above it, so none is hidden by the import's rows.

Revision ID: 0020
Revises: 0019
"""

import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "relations",
        sa.Column("write_floor_epoch", sa.BigInteger(), nullable=False, server_default="0"),
    )
    op.create_table(
        "epoch_holds",
        sa.Column("graph_id", sa.Integer(), nullable=False),
        sa.Column("holder", sa.Text(), nullable=False),
        sa.Column("epoch", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["graph_id"], ["graphs.id"], name="fk_epoch_holds_graph_id_graphs", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("graph_id", "holder", name="pk_epoch_holds"),
    )


def downgrade() -> None:
    op.drop_table("epoch_holds")
    op.drop_column("relations", "write_floor_epoch")
