"""Re-price every ledger with the filter's Gaussian part at 0.998 of delta, up from 0.9 (issue 50).

Full-batch releases, what the service's automatic schedules make but for DPVI above epsilon x N = 150,000,
are priced exactly by the Gaussian part: at 0.998 of delta they cost what the non-adaptive composition does
to 0.02% (10 on Adult at eps 0.8, delta 1e-5: sigma 14.462 against 14.555 at 0.9). Subsampled releases
pay more in the Renyi part, which now has 0.002 of delta (docs/design.md section 3). Each re-pricing is
recorded in accountant_changes with the spend before (at 0.9) and after; nothing is deleted. A ledger
whose new spend exceeds its cap admits nothing more (its refusals say so).

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-07 11:00:00
"""

from __future__ import annotations

from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    from privacy_wall.ledger.database import reprice_all

    reprice_all(op.get_bind())


def downgrade() -> None:
    """The re-pricing is recorded, not undone: a downgrade leaves the ledgers as they are (the next write
    re-prices them by whatever accountant is configured then)."""
