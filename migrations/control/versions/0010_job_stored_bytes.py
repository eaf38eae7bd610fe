"""jobs.stored_bytes (what a job's outputs take: counted against its key's storage cap) and
jobs.outputs_deleted_at (when its releases and posterior were deleted to free that storage)

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-28 01:00:00

Jobs from before hold their measured outputs: the bytes of their stored releases and of their posterior's
JSON text. A queued or running job's admission estimate is unknown here, so it counts what it has stored
so far until it ends (control.jobs.storage.end_storage then measures it).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "jobs", sa.Column("stored_bytes", sa.BigInteger(), nullable=False, server_default=sa.text("0"))
    )
    op.add_column("jobs", sa.Column("outputs_deleted_at", sa.DateTime(timezone=True), nullable=True))
    posterior = (
        "octet_length(p.document::text)"
        if op.get_bind().dialect.name == "postgresql"
        else "length(CAST(p.document AS BLOB))"
    )
    op.execute(
        "UPDATE jobs SET stored_bytes = "
        "(SELECT COALESCE(SUM(r.stored_bytes), 0) FROM releases r WHERE r.job_id = jobs.id) + "
        f"(SELECT COALESCE(SUM({posterior}), 0) FROM posteriors p WHERE p.job_id = jobs.id)"
    )


def downgrade() -> None:
    # Plain ALTER TABLE (as 0008): a batch would recreate jobs, which releases and posteriors reference.
    op.drop_column("jobs", "outputs_deleted_at")
    op.drop_column("jobs", "stored_bytes")
