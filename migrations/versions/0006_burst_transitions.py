"""burst transitions: a capacity rule opening or closing a burst node, recorded apart from the
health lifecycle (whose single writer is the lifecycle table)

Revision ID: 0006_burst_transitions
Revises: 0005_release_request
Create Date: 2026-12-03 21:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import healer.store.types

revision: str = "0006_burst_transitions"
down_revision: str | None = "0005_release_request"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "burst_transitions",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("rule", sa.String(length=63), nullable=False),
        sa.Column("node", sa.String(length=253), nullable=False),
        sa.Column("from_state", sa.String(length=16), nullable=False),
        sa.Column("to_state", sa.String(length=16), nullable=False),
        sa.Column("by_hand", sa.Boolean(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("actor", sa.String(length=200), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("evidence", sa.JSON(), nullable=True),
        sa.Column("at", healer.store.types.UTCDateTime(timezone=True), nullable=False),
        sa.Column("holder", sa.String(length=253), nullable=True),
        sa.Column("fencing_token", sa.BigInteger(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_burst_transitions")),
    )
    op.create_index(
        "ix_burst_transitions_rule_node_at", "burst_transitions", ["rule", "node", "at"], unique=False
    )


def downgrade() -> None:
    op.drop_index("ix_burst_transitions_rule_node_at", table_name="burst_transitions")
    op.drop_table("burst_transitions")
