"""fencing and intent: the Lease holder and fencing number on transitions, a node's step in flight

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01 14:50:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("transitions", schema=None) as batch_op:
        batch_op.add_column(sa.Column("holder", sa.String(length=253), nullable=True))
        batch_op.add_column(sa.Column("fencing_token", sa.BigInteger(), nullable=True))
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.add_column(sa.Column("intent", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.drop_column("intent")
    with op.batch_alter_table("transitions", schema=None) as batch_op:
        batch_op.drop_column("fencing_token")
        batch_op.drop_column("holder")
