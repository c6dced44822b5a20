"""catalog: relations, sources, graphs, jobs, workers, actors, progress, epoch pins

Revision ID: 0001
Revises:
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def _now() -> sa.Column:
    return sa.Column(
        "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
    )


def upgrade() -> None:
    op.execute("CREATE SCHEMA IF NOT EXISTS store")
    op.create_table(
        "graphs",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("kind", sa.Text, nullable=False),
        sa.Column("job_id", sa.Integer, nullable=True),
        sa.Column("committed_epoch", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("current_epoch", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("state", sa.Text, nullable=False, server_default="running"),
        _now(),
        sa.CheckConstraint("kind IN ('main', 'creating')", name="kind"),
        sa.CheckConstraint("committed_epoch <= current_epoch", name="committed_not_ahead"),
    )
    # the main graph always exists
    op.execute("INSERT INTO graphs (id, kind) VALUES (1, 'main')")
    op.execute("SELECT setval(pg_get_serial_sequence('graphs', 'id'), 1)")
    op.create_table(
        "relations",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("name", sa.Text, nullable=False, unique=True),
        sa.Column("kind", sa.Text, nullable=False),
        sa.Column("schema", JSONB, nullable=False),
        sa.Column("storage_table", sa.Text, nullable=False, unique=True),
        sa.Column("graph_id", sa.Integer, sa.ForeignKey("graphs.id"), nullable=False),
        sa.Column("gc_epoch", sa.BigInteger, nullable=False, server_default="0"),
        _now(),
        sa.CheckConstraint("kind IN ('table', 'mv')", name="kind"),
    )
    op.create_table(
        "sources",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("name", sa.Text, nullable=False, unique=True),
        sa.Column("kafka", JSONB, nullable=False),
        sa.Column("format", sa.Text, nullable=False),
        sa.Column("schema", JSONB, nullable=False),
        sa.Column("rate_limit", sa.Integer),
        _now(),
    )
    op.create_table(
        "jobs",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("name", sa.Text, nullable=False, unique=True),
        sa.Column("kind", sa.Text, nullable=False),
        sa.Column("state", sa.Text, nullable=False, server_default="creating"),
        sa.Column("paused", sa.Boolean, nullable=False, server_default=sa.false()),
        sa.Column("rate_limit", sa.Integer),
        sa.Column("parallelism", sa.Integer, nullable=False),
        sa.Column("upstream_relation_id", sa.Integer, sa.ForeignKey("relations.id")),
        sa.Column("upstream_source_id", sa.Integer, sa.ForeignKey("sources.id")),
        sa.Column("mv_relation_id", sa.Integer, sa.ForeignKey("relations.id", ondelete="SET NULL")),
        sa.Column("columns", JSONB, nullable=False),
        sa.Column("filter", JSONB),
        sa.Column("graph_id", sa.Integer, sa.ForeignKey("graphs.id", ondelete="SET NULL")),
        sa.Column("snapshot_epoch", sa.BigInteger),
        sa.Column("finished_epoch", sa.BigInteger),
        sa.Column("error", sa.Text),
        _now(),
        sa.Column(
            "updated_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.CheckConstraint("kind IN ('arrangement', 'chain', 'snapshot', 'source')", name="kind"),
        sa.CheckConstraint("state IN ('creating', 'created', 'failed', 'cancelled')", name="state"),
        sa.CheckConstraint("parallelism >= 1", name="parallelism"),
        sa.CheckConstraint("rate_limit IS NULL OR rate_limit >= 0", name="rate_limit"),
    )
    op.create_foreign_key(
        "fk_graphs_job_id_jobs", "graphs", "jobs", ["job_id"], ["id"], ondelete="CASCADE"
    )
    op.create_table(
        "workers",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("name", sa.Text, nullable=False),
        sa.Column("capacity", sa.Integer, nullable=False),
        sa.Column("state", sa.Text, nullable=False, server_default="alive"),
        sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column(
            "registered_at",
            sa.DateTime(timezone=True),
            server_default=sa.func.now(),
            nullable=False,
        ),
        sa.Column(
            "last_heartbeat_at",
            sa.DateTime(timezone=True),
            server_default=sa.func.now(),
            nullable=False,
        ),
    )
    op.create_table(
        "actors",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column(
            "job_id",
            sa.Integer,
            sa.ForeignKey("jobs.id", ondelete="CASCADE"),
            nullable=False,
            index=True,
        ),
        sa.Column(
            "graph_id", sa.Integer, sa.ForeignKey("graphs.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column(
            "worker_id", sa.Integer, sa.ForeignKey("workers.id", ondelete="SET NULL"), index=True
        ),
        sa.Column("vnodes", JSONB, nullable=False, server_default="[]"),
        sa.Column("splits", JSONB, nullable=False, server_default="[]"),
        sa.Column("state", sa.Text, nullable=False, server_default="running"),
        _now(),
    )
    op.create_table(
        "vnode_progress",
        sa.Column(
            "job_id", sa.Integer, sa.ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True
        ),
        sa.Column("vnode", sa.Integer, primary_key=True),
        sa.Column("state", sa.Text, nullable=False),
        sa.Column("current_pos", JSONB),
        sa.Column("row_count", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("epoch", sa.BigInteger, nullable=False),
    )
    op.create_table(
        "split_progress",
        sa.Column(
            "job_id", sa.Integer, sa.ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True
        ),
        sa.Column("split", sa.Text, primary_key=True),
        sa.Column("state", sa.Text, nullable=False),
        sa.Column("offset", sa.BigInteger),
        sa.Column("target_offset", sa.BigInteger),
        sa.Column("num_consumed_rows", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("epoch", sa.BigInteger, nullable=False),
    )
    op.create_table(
        "epoch_pins",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column(
            "relation_id",
            sa.Integer,
            sa.ForeignKey("relations.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("holder", sa.Text, nullable=False),
        sa.Column("epoch", sa.BigInteger, nullable=False),
        _now(),
        sa.UniqueConstraint("relation_id", "holder"),
    )


def downgrade() -> None:
    for table in ("epoch_pins", "split_progress", "vnode_progress", "actors", "workers"):
        op.drop_table(table)
    op.drop_constraint("fk_graphs_job_id_jobs", "graphs", type_="foreignkey")
    for table in ("jobs", "sources", "relations", "graphs"):
        op.drop_table(table)
    op.execute("DROP SCHEMA IF EXISTS store CASCADE")
