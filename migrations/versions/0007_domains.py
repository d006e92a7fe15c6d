"""domain incidents: k of n nodes of one rack, switch or NVLink domain bad together are one
incident with one ticket (healer.engine.correlation)

Revision ID: 0007_domains
Revises: 0006_burst_transitions
Create Date: 2026-12-04 04:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import healer.store.types

revision: str = "0007_domains"
down_revision: str | None = "0006_burst_transitions"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "domain_incidents",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("name", sa.String(length=253), nullable=False),
        sa.Column("size", sa.Integer(), nullable=False),
        sa.Column("first_seen", healer.store.types.UTCDateTime(timezone=True), nullable=False),
        sa.Column("opened_at", healer.store.types.UTCDateTime(timezone=True), nullable=False),
        sa.Column("closed_at", healer.store.types.UTCDateTime(timezone=True), nullable=True),
        sa.Column("close_reason", sa.Text(), nullable=True),
        sa.Column("summary", sa.Text(), nullable=False),
        sa.Column("members", sa.JSON(), nullable=False),
        sa.Column("evidence", sa.JSON(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_domain_incidents")),
    )
    op.create_index(
        "ix_domain_incidents_kind_name_closed_at",
        "domain_incidents",
        ["kind", "name", "closed_at"],
        unique=False,
    )
    for table in ("incidents", "tickets"):
        with op.batch_alter_table(table) as batch:
            batch.add_column(sa.Column("domain_incident_id", sa.Integer(), nullable=True))
            batch.create_index(op.f(f"ix_{table}_domain_incident_id"), ["domain_incident_id"], unique=False)
            batch.create_foreign_key(
                op.f(f"fk_{table}_domain_incident_id_domain_incidents"),
                "domain_incidents",
                ["domain_incident_id"],
                ["id"],
                ondelete="SET NULL",
            )


def downgrade() -> None:
    for table in ("tickets", "incidents"):
        with op.batch_alter_table(table) as batch:
            batch.drop_constraint(op.f(f"fk_{table}_domain_incident_id_domain_incidents"), type_="foreignkey")
            batch.drop_index(op.f(f"ix_{table}_domain_incident_id"))
            batch.drop_column("domain_incident_id")
    op.drop_index("ix_domain_incidents_kind_name_closed_at", table_name="domain_incidents")
    op.drop_table("domain_incidents")
