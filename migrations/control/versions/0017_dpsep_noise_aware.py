"""DP-SEP-BLR jobs from before the noise-aware mode keep the paper's damped site average: noise_aware 0
(issue 51).

The model's default became noise_aware 1 (the wall releases each site centred at the cavity mean and the
public half takes noise-aware Newton steps: worker.models.dpsep). A job's options decide which query its
releases come from, how its stored releases are read when it resumes and what its posterior was fitted
with, so every earlier DP-SEP-BLR job without the option gets the value it ran with.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-07 19:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

jobs = sa.table(
    "jobs",
    sa.column("id", sa.String),
    sa.column("model", sa.String),
    sa.column("algorithm", sa.String),
    sa.column("options", sa.JSON),
)


def _dpsep_blr_options(conn: sa.Connection) -> list[tuple[str, dict[str, float]]]:
    """(id, options) of every DP-SEP-BLR job."""
    query = sa.select(jobs.c.id, jobs.c.options).where(jobs.c.model == "blr", jobs.c.algorithm == "dpsep")
    return [(job_id, options) for job_id, options in conn.execute(query).all()]


def upgrade() -> None:
    conn = op.get_bind()
    for job_id, options in _dpsep_blr_options(conn):
        if "noise_aware" not in options:
            conn.execute(
                sa.update(jobs).where(jobs.c.id == job_id).values(options={**options, "noise_aware": 0})
            )


def downgrade() -> None:
    conn = op.get_bind()
    for job_id, options in _dpsep_blr_options(conn):
        if options.get("noise_aware") == 0:
            rest = {name: value for name, value in options.items() if name != "noise_aware"}
            conn.execute(sa.update(jobs).where(jobs.c.id == job_id).values(options=rest))
