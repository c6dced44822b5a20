"""sources: start offsets and splits; source_offsets: each epoch's end offsets

The main graph advances every source at each barrier: the barrier opening epoch ``e``
fixes the offsets the source has reached at the end of ``e`` (``source_offsets``), so
the rows of ``e`` are the messages between the previous epoch's offsets and these. A
recovery drops the rows above the committed epoch, as it drops the barriers.

Revision ID: 0007
Revises: 0006
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # split -> first offset the shared source reads (the high watermark at creation)
    op.add_column("sources", sa.Column("start_offsets", JSONB, nullable=False, server_default="{}"))
    op.create_table(
        "source_offsets",
        sa.Column(
            "source_id",
            sa.Integer,
            sa.ForeignKey("sources.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("epoch", sa.BigInteger, primary_key=True),
        # split -> end offset (exclusive) reached at the end of the epoch
        sa.Column("offsets", JSONB, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("source_offsets")
    op.drop_column("sources", "start_offsets")
