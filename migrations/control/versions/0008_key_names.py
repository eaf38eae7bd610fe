"""api_keys.name: an optional label of a key, public inside the deployment; keys made before have none

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-26 10:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("api_keys", sa.Column("name", sa.String(length=64), nullable=True))


def downgrade() -> None:
    # Plain ALTER TABLE (SQLite >= 3.35 has DROP COLUMN): a batch would recreate api_keys, which the jobs
    # that reference it forbid while foreign keys are on.
    op.drop_column("api_keys", "name")
