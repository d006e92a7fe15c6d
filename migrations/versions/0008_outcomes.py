"""outcomes: each closed incident's outcome (confirmed or not, its basis, who set it), a provider's
resolution on its ticket, the repair-target escalations sent, and shadow rules' decisions

Revision ID: 0008_outcomes
Revises: 0007_domains
Create Date: 2026-12-04 04:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import healer.store.types

revision: str = "0008_outcomes"
down_revision: str | None = "0007_domains"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("incidents", schema=None) as batch_op:
        batch_op.add_column(sa.Column("outcome", sa.String(length=16), nullable=True))
        batch_op.add_column(sa.Column("outcome_basis", sa.String(length=200), nullable=True))
        batch_op.add_column(
            sa.Column("outcome_at", healer.store.types.UTCDateTime(timezone=True), nullable=True)
        )
        batch_op.add_column(sa.Column("outcome_by", sa.String(length=200), nullable=True))
        batch_op.add_column(sa.Column("gpus", sa.Integer(), nullable=True))
    with op.batch_alter_table("tickets", schema=None) as batch_op:
        batch_op.add_column(sa.Column("resolution", sa.String(length=32), nullable=True))
        batch_op.add_column(sa.Column("overdue_escalated", sa.JSON(), nullable=True))
    op.create_table(
        "shadow_decisions",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("rule", sa.String(length=200), nullable=False),
        sa.Column("node_name", sa.String(length=253), nullable=False),
        sa.Column("pool", sa.String(length=253), nullable=False),
        sa.Column("gpus", sa.Integer(), nullable=False),
        sa.Column("would", sa.JSON(), nullable=False),
        sa.Column("evidence", sa.JSON(), nullable=True),
        sa.Column("opened_at", healer.store.types.UTCDateTime(timezone=True), nullable=False),
        sa.Column("closed_at", healer.store.types.UTCDateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_shadow_decisions")),
    )
    op.create_index(
        "ix_shadow_decisions_rule_opened_at", "shadow_decisions", ["rule", "opened_at"], unique=False
    )


def downgrade() -> None:
    op.drop_index("ix_shadow_decisions_rule_opened_at", table_name="shadow_decisions")
    op.drop_table("shadow_decisions")
    with op.batch_alter_table("tickets", schema=None) as batch_op:
        batch_op.drop_column("overdue_escalated")
        batch_op.drop_column("resolution")
    with op.batch_alter_table("incidents", schema=None) as batch_op:
        batch_op.drop_column("gpus")
        batch_op.drop_column("outcome_by")
        batch_op.drop_column("outcome_at")
        batch_op.drop_column("outcome_basis")
        batch_op.drop_column("outcome")
