"""jobs.idempotency_key: a retried submission with the same key returns the same job

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23 22:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("idempotency_key", sa.String(length=128), nullable=True))
        batch.create_unique_constraint("uq_jobs_owner_idempotency_key", ["owner", "idempotency_key"])


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_constraint("uq_jobs_owner_idempotency_key", type_="unique")
        batch.drop_column("idempotency_key")
