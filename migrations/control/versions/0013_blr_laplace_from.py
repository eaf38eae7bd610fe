"""VIPS-BLR jobs from before the Laplace releases keep the Polya-Gamma E-step: laplace_from 0 (issue 51).

The model's default became laplace_from 2 (releases from the second on are taken at q's mean:
vips.models.blr.model). A job's options decide how its stored releases are read when it resumes and what its
posterior was fitted with, so every earlier VIPS-BLR job without the option gets the value it ran with.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-07 07:00:00
"""

from __future__ import annotations

from migrations.job_options import pin_option, unpin_option

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    pin_option("blr", "vips", "laplace_from", 0)


def downgrade() -> None:
    unpin_option("blr", "vips", "laplace_from", 0)
