"""remediation ladder: the incident's ladder, the step in progress, since when, the repair nonce,
and the validation Job

Revision ID: 0004_ladder
Revises: 0003
Create Date: 2026-12-01 16:10:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from healer.store.types import UTCDateTime

revision: str = "0004_ladder"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("incidents", schema=None) as batch_op:
        batch_op.add_column(sa.Column("ladder", sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column("ladder_index", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("ladder_started_at", UTCDateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column("repair_nonce", sa.String(length=100), nullable=True))
        batch_op.add_column(sa.Column("validation", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("incidents", schema=None) as batch_op:
        batch_op.drop_column("validation")
        batch_op.drop_column("repair_nonce")
        batch_op.drop_column("ladder_started_at")
        batch_op.drop_column("ladder_index")
        batch_op.drop_column("ladder")
