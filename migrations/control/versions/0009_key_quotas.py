"""key_quotas: a custodian's cap on what one key may spend on one dataset (epsilon at the dataset's delta)

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-26 12:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "key_quotas",
        sa.Column("dataset", sa.String(128), sa.ForeignKey("datasets.name"), nullable=False),
        sa.Column("key_id", sa.String(32), sa.ForeignKey("api_keys.id"), nullable=False),
        sa.Column("epsilon", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("dataset", "key_id"),
    )


def downgrade() -> None:
    op.drop_table("key_quotas")
