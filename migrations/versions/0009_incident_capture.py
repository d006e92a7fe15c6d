"""log capture: the incident remembers the log bundle capture it asked of the node agent at
quarantine (nonce, when, its answer), so its replacement ticket waits for the bundle

Revision ID: 0009_incident_capture
Revises: 0008_outcomes
Create Date: 2026-12-04 10:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009_incident_capture"
down_revision: str | None = "0008_outcomes"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("incidents", schema=None) as batch_op:
        batch_op.add_column(sa.Column("capture", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("incidents", schema=None) as batch_op:
        batch_op.drop_column("capture")
