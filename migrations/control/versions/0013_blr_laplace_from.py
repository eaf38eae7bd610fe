"""VIPS-BLR jobs from before the Laplace releases keep the Polya-Gamma E-step: laplace_from 0 (issue 51).

The model's default became laplace_from 2 (releases from the second on are taken at q's mean:
worker.models.blr). A job's options decide how its stored releases are read when it resumes and what its
posterior was fitted with, so every earlier VIPS-BLR job without the option gets the value it ran with.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-07 07:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

jobs = sa.table(
    "jobs",
    sa.column("id", sa.String),
    sa.column("model", sa.String),
    sa.column("algorithm", sa.String),
    sa.column("options", sa.JSON),
)


def _vips_blr_options(conn: sa.Connection) -> list[tuple[str, dict[str, float]]]:
    """(id, options) of every VIPS-BLR job."""
    query = sa.select(jobs.c.id, jobs.c.options).where(jobs.c.model == "blr", jobs.c.algorithm == "vips")
    return [(job_id, options) for job_id, options in conn.execute(query).all()]


def upgrade() -> None:
    conn = op.get_bind()
    for job_id, options in _vips_blr_options(conn):
        if "laplace_from" not in options:
            conn.execute(
                sa.update(jobs).where(jobs.c.id == job_id).values(options={**options, "laplace_from": 0})
            )


def downgrade() -> None:
    conn = op.get_bind()
    for job_id, options in _vips_blr_options(conn):
        if options.get("laplace_from") == 0:
            rest = {name: value for name, value in options.items() if name != "laplace_from"}
            conn.execute(sa.update(jobs).where(jobs.c.id == job_id).values(options=rest))
