"""Re-price every ledger with the configured accountant (tighter analysis of the same events).

Adds accountant_changes and re-prices each dataset's committed and reserved costs from its stored
events with privacy_wall.accounting.accountants's configured accountant (pld unless VIPS_ACCOUNTANT says
otherwise), recording the spend before and after. Ledgers written before this revision hold RDP curves
priced by the paper's classic conversion; every accountant of 0002 charges at most that for the same
events, so the figures only go down.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-23 22:40:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "accountant_changes",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("dataset", sa.String(length=128), nullable=False),
        sa.Column("old_accountant", sa.String(length=64), nullable=False),
        sa.Column("new_accountant", sa.String(length=64), nullable=False),
        sa.Column("epsilon_spent_before", sa.Float(), nullable=True),
        sa.Column("epsilon_spent_after", sa.Float(), nullable=True),
        sa.Column("changed_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["dataset"], ["budgets.dataset"]),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(op.f("ix_accountant_changes_dataset"), "accountant_changes", ["dataset"], unique=False)

    from privacy_wall.ledger.database import reprice_all

    reprice_all(op.get_bind())


def downgrade() -> None:
    op.drop_index(op.f("ix_accountant_changes_dataset"), table_name="accountant_changes")
    op.drop_table("accountant_changes")
