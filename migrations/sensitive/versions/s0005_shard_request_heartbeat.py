"""the coordinator's heartbeat on each shard request

Revision ID: s0005
Revises: s0004
Create Date: 2026-11-27 10:00:00

`shard_requests.heartbeat_at`: refreshed by the request's coordinator while it waits for the shards'
partial sums (privacy_wall/shards.py). Every worker inside the wall removes a request whose heartbeat
stopped, and the partial sums whose request is gone, so a dead coordinator's un-noised sums are deleted
within a minute, not after the shard timeout. Rows left by an older version get their `created_at`: a
coordinator of that version never refreshes its request, so the request is removed once it is older than
the heartbeat bound (a release still running under the old code then fails at its timeout, its charge
withdrawn as for shards that never answered). The server default (the database's clock) is what an older
version's insert, which names no heartbeat, gets.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "s0005"
down_revision = "s0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Added nullable first, filled, then made NOT NULL with its default: SQLite adds no column whose default
    # is not a constant, so the last step rebuilds the table there (batch mode); PostgreSQL alters it.
    op.add_column("shard_requests", sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=True))
    op.execute("UPDATE shard_requests SET heartbeat_at = created_at")
    with op.batch_alter_table("shard_requests") as batch:
        batch.alter_column(
            "heartbeat_at",
            existing_type=sa.DateTime(timezone=True),
            nullable=False,
            server_default=sa.func.now(),
        )


def downgrade() -> None:
    with op.batch_alter_table("shard_requests") as batch:
        batch.drop_column("heartbeat_at")
