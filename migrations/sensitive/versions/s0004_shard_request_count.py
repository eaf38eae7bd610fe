"""the shard count of each shard request

Revision ID: s0004
Revises: s0003
Create Date: 2026-11-26 19:30:00

`shard_requests.shards`: the K of the coordinator that wrote the request. A shard worker answers a request
only as shard k of that K (privacy_wall/shards.py), so a worker started under another VIPS_SHARDS, or one
lingering from an earlier request, never sums a row range the coordinator did not ask for. Requests exist
only while a release is computed; the default 0 matches no worker (a request left by an older version is
never answered, and is purged after the timeout).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "s0004"
down_revision = "s0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "shard_requests", sa.Column("shards", sa.Integer, nullable=False, server_default=sa.text("0"))
    )


def downgrade() -> None:
    with op.batch_alter_table("shard_requests") as batch:
        batch.drop_column("shards")
