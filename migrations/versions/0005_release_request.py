"""operator release as an input: the request waits on the incident until the controller's next
reconcile of the node moves it (the lifecycle table is the only writer of node state)

Revision ID: 0005_release_request
Revises: 0004_ladder
Create Date: 2026-12-03 15:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005_release_request"
down_revision: str | None = "0004_ladder"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("incidents", schema=None) as batch_op:
        batch_op.add_column(sa.Column("release_requested", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("incidents", schema=None) as batch_op:
        batch_op.drop_column("release_requested")
