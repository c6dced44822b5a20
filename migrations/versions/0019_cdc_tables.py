"""CDC tables: a table of ours mirroring an upstream Postgres table (issue 36)

``cdc_tables``: one row per CDC table, its upstream (the DSN is a secret: never shown),
publication and slot (and whether the service made them, to drop them with the table),
its job, and the CDC backfill's durable progress, written by the worker in the same
transaction as the rows it writes. ``cdc_epochs``: the upstream LSN our table is exact
at, per epoch it was written at (the slot confirms the one of the committed epoch).

Revision ID: 0019
Revises: 0018
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.drop_constraint("kind", "jobs", type_="check")
    op.create_check_constraint(
        "kind", "jobs", "kind IN ('arrangement', 'chain', 'snapshot', 'source', 'cdc')"
    )
    op.create_table(
        "cdc_tables",
        sa.Column("relation_id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=True),
        sa.Column("dsn", sa.Text(), nullable=False),
        sa.Column("upstream", sa.Text(), nullable=False),
        sa.Column("upstream_host", sa.Text(), nullable=False),
        sa.Column("publication", sa.Text(), nullable=False),
        sa.Column("slot", sa.Text(), nullable=False),
        sa.Column("created_publication", sa.Boolean(), nullable=False),
        sa.Column("created_slot", sa.Boolean(), nullable=False),
        sa.Column("start_lsn", sa.BigInteger(), nullable=False),
        sa.Column("state", sa.Text(), nullable=False, server_default="backfilling"),
        sa.Column("current_pos", JSONB(), nullable=True),
        sa.Column("lsn", sa.BigInteger(), nullable=False),
        sa.Column("row_count", sa.BigInteger(), nullable=False, server_default="0"),
        sa.Column("chunks", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("slot_lag_bytes", sa.BigInteger(), nullable=True),
        sa.Column("confirmed_lsn", sa.BigInteger(), nullable=True),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.ForeignKeyConstraint(
            ["relation_id"],
            ["relations.id"],
            name="fk_cdc_tables_relation_id_relations",
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name="fk_cdc_tables_job_id_jobs", ondelete="SET NULL"
        ),
        sa.PrimaryKeyConstraint("relation_id", name="pk_cdc_tables"),
    )
    op.create_table(
        "cdc_epochs",
        sa.Column("relation_id", sa.Integer(), nullable=False),
        sa.Column("epoch", sa.BigInteger(), nullable=False),
        sa.Column("lsn", sa.BigInteger(), nullable=False),
        sa.Column("state", sa.Text(), nullable=False),
        sa.Column("current_pos", JSONB(), nullable=True),
        sa.ForeignKeyConstraint(
            ["relation_id"],
            ["cdc_tables.relation_id"],
            name="fk_cdc_epochs_relation_id_cdc_tables",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("relation_id", "epoch", name="pk_cdc_epochs"),
    )


def downgrade() -> None:
    op.drop_table("cdc_epochs")
    op.drop_table("cdc_tables")
    op.execute("DELETE FROM jobs WHERE kind = 'cdc'")
    op.drop_constraint("kind", "jobs", type_="check")
    op.create_check_constraint(
        "kind", "jobs", "kind IN ('arrangement', 'chain', 'snapshot', 'source')"
    )
