"""DP-SEP-BLR jobs from before the noise-aware mode keep the paper's damped site average: noise_aware 0
(issue 51).

The model's default became noise_aware 1 (the wall releases each site centred at the cavity mean and the
public half takes noise-aware Newton steps: vips.models.blr.dpsep). A job's options decide which query its
releases come from, how its stored releases are read when it resumes and what its posterior was fitted
with, so every earlier DP-SEP-BLR job without the option gets the value it ran with.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-07 19:00:00
"""

from __future__ import annotations

from migrations.job_options import pin_option, unpin_option

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    pin_option("blr", "dpsep", "noise_aware", 0)


def downgrade() -> None:
    unpin_option("blr", "dpsep", "noise_aware", 0)
