"""failure policy: a job's failed attempts, a graph's recovery backoff, a source's on_error

A job whose actor fails gets an attempt in ``job_failures`` (the cause, the actor, the
graph's committed epoch, the backoff its graph's recovery waits); too many attempts for
one cause within a window fail the job. ``graphs.recover_after_ms`` is when a graph's
recovery may run (wall-clock ms; NULL: at once). ``sources.on_error`` says what a message
that is not a valid row does: ``skip`` it (counted per split in
``split_progress.skipped``, the last one in ``last_skipped_offset``) or ``fail`` the job.

Revision ID: 0015
Revises: 0014
"""

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "job_failures",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column(
            "job_id",
            sa.Integer,
            sa.ForeignKey("jobs.id", ondelete="CASCADE"),
            nullable=False,
            index=True,
        ),
        sa.Column("at_ms", sa.BigInteger, nullable=False),
        sa.Column("cause", sa.Text, nullable=False),
        sa.Column("message", sa.Text, nullable=False),
        sa.Column("actor_id", sa.Integer, nullable=False),
        sa.Column("epoch", sa.BigInteger, nullable=False),
        # the graph's incarnation that failed: its actors' failures count once
        sa.Column("recovery_seq", sa.Integer, nullable=False),
        sa.Column("backoff_ms", sa.BigInteger, nullable=True),  # NULL: the attempt failed the job
    )
    op.add_column("graphs", sa.Column("recover_after_ms", sa.BigInteger, nullable=True))
    op.add_column("sources", sa.Column("on_error", sa.Text, nullable=False, server_default="skip"))
    op.add_column(
        "split_progress",
        sa.Column("skipped", sa.BigInteger, nullable=False, server_default="0"),
    )
    op.add_column("split_progress", sa.Column("last_skipped_offset", sa.BigInteger))


def downgrade() -> None:
    op.drop_column("split_progress", "last_skipped_offset")
    op.drop_column("split_progress", "skipped")
    op.drop_column("sources", "on_error")
    op.drop_column("graphs", "recover_after_ms")
    op.drop_table("job_failures")
