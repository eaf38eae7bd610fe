"""Re-price every ledger with the `filter` accountant: the budget as a privacy filter (issue 50).

Until this revision the default `pld` accountant admitted while the composed PLD epsilon of a ledger stayed
under its cap, which is not a filter under fully adaptive composition (docs/design.md section 3). The
`filter` accountant prices the same events by a rule proven valid under it; full-batch ledgers move little
(the Gaussian part has 0.9 of delta), subsampled ones go up (Renyi's price). Each re-pricing is recorded in
accountant_changes with the spend before and after; nothing is deleted. A ledger whose new spend exceeds its
cap admits nothing more (its refusals say so).

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-07 03:30:00
"""

from __future__ import annotations

from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    from privacy_wall.ledger.database import reprice_all

    reprice_all(op.get_bind())


def downgrade() -> None:
    """The re-pricing is recorded, not undone: a downgrade leaves the ledgers as they are (the next write
    re-prices them by whatever accountant is configured then)."""
