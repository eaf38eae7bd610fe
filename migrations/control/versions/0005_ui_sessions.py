"""ui_sessions: the dashboard's sign-in sessions (a hashed cookie token, its key and CSRF token, expiry)

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-24 15:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "ui_sessions",
        sa.Column("token_hash", sa.String(64), primary_key=True),
        sa.Column("key_id", sa.String(32), sa.ForeignKey("api_keys.id"), nullable=False),
        sa.Column("csrf_token", sa.String(64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_ui_sessions_key_id", "ui_sessions", ["key_id"])


def downgrade() -> None:
    op.drop_index("ix_ui_sessions_key_id", table_name="ui_sessions")
    op.drop_table("ui_sessions")
