"""the shard channel: requests and partial sums of sharded passes

Revision ID: s0003
Revises: s0002
Create Date: 2026-11-26 17:00:00

Two tables inside the wall (privacy_wall/shards.py): `shard_requests` holds one release's public
parameters for its shards, `shard_sums` each shard's clipped partial sums (un-noised: they never leave
the sensitive database). Both hold rows only while a release is being computed. `shard_leases`: which
worker serves which shard (`vips worker --shard auto`), renewed while it lives.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "s0003"
down_revision = "s0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "shard_requests",
        sa.Column("job_id", sa.String(64), nullable=False),
        sa.Column("iteration", sa.Integer, nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("token", sa.String(32), nullable=False),
        sa.Column("params", sa.LargeBinary, nullable=False),
        sa.Column("rows", sa.LargeBinary, nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("job_id", "iteration", "attempt"),
    )
    op.create_table(
        "shard_sums",
        sa.Column("job_id", sa.String(64), nullable=False),
        sa.Column("iteration", sa.Integer, nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("shard", sa.Integer, nullable=False),
        sa.Column("sums", sa.LargeBinary, nullable=True),
        sa.Column("failed", sa.Boolean, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("job_id", "iteration", "attempt", "shard"),
    )

    op.create_table(
        "shard_leases",
        sa.Column("shard", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("holder", sa.String(255), nullable=False),
        sa.Column("renewed_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("shard_leases")
    op.drop_table("shard_sums")
    op.drop_table("shard_requests")
