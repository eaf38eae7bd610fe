"""DP-SEP linear regression jobs from before its noise-aware mode keep the paper's model: noise_aware 0
(issue 51).

The model's default became noise_aware 1 (Normal-Gamma sites released and the noise variance learned:
vips.models.linreg.dpsep). A job's options decide which query its releases come from, how its stored releases
are read when it resumes and what its posterior was fitted with, so every earlier DP-SEP linear regression
job without the option gets the value it ran with.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-07 20:00:00
"""

from __future__ import annotations

from migrations.job_options import pin_option, unpin_option

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    pin_option("linreg", "dpsep", "noise_aware", 0)


def downgrade() -> None:
    unpin_option("linreg", "dpsep", "noise_aware", 0)
