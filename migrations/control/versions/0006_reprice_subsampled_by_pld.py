"""Re-price every ledger with the tight `pld` accountant (subsampled releases priced by their PLD).

The `pld` accountant before this revision charged a composition holding any subsampled release by its
RDP curve; it now charges the least of that, the unamplified Gaussian and the PLD of Dong, Roth, Su's
C_q trade-off (privacy_wall.accounting.pld), so for the same events the figures only go down. Each re-pricing
is recorded in accountant_changes with the spend before and after; stored costs gain their release groups.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-26 04:20:00
"""

from __future__ import annotations

from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    from privacy_wall.ledger.database import reprice_all

    reprice_all(op.get_bind())


def downgrade() -> None:
    """Stored costs now carry release groups that earlier revisions cannot read: no way back."""
    raise NotImplementedError("0006 cannot be downgraded: restore the control database from a backup")
