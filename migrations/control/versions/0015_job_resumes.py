"""jobs.resumes: how many times the reaper sent a job to the broker again after its worker was lost

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-07 11:30:00

A job whose worker died (a stale heartbeat) or whose task the broker lost or a dead worker took is sent
again rather than failed (control.jobs.reaper), up to MAX_RESUMES times; earlier jobs start at 0.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("resumes", sa.Integer(), nullable=False, server_default=sa.text("0")))


def downgrade() -> None:
    # Plain ALTER TABLE (as 0010): a batch would recreate jobs, which releases and posteriors reference.
    op.drop_column("jobs", "resumes")
