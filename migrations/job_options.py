"""What the control migrations that give earlier jobs an option's old value share (0013, 0017, 0018).

When a model's default changes, a job's options decide which query its releases come from, how its stored
releases are read when it resumes and what its posterior was fitted with; so every earlier job of that
model and algorithm without the option gets the value it ran with, and the downgrade takes exactly that
value back off.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

jobs = sa.table(
    "jobs",
    sa.column("id", sa.String),
    sa.column("model", sa.String),
    sa.column("algorithm", sa.String),
    sa.column("options", sa.JSON),
)


def _options(conn: sa.Connection, model: str, algorithm: str) -> list[tuple[str, dict[str, float]]]:
    """(id, options) of every job of `model` fitted by `algorithm`."""
    query = sa.select(jobs.c.id, jobs.c.options).where(jobs.c.model == model, jobs.c.algorithm == algorithm)
    return [(job_id, options) for job_id, options in conn.execute(query).all()]


def pin_option(model: str, algorithm: str, name: str, value: float) -> None:
    """Upgrade: options[name] = value on every such job that does not name the option."""
    conn = op.get_bind()
    for job_id, options in _options(conn, model, algorithm):
        if name not in options:
            conn.execute(sa.update(jobs).where(jobs.c.id == job_id).values(options={**options, name: value}))


def unpin_option(model: str, algorithm: str, name: str, value: float) -> None:
    """Downgrade: drop options[name] from every such job where it equals `value`."""
    conn = op.get_bind()
    for job_id, options in _options(conn, model, algorithm):
        if options.get(name) == value:
            rest = {key: kept for key, kept in options.items() if key != name}
            conn.execute(sa.update(jobs).where(jobs.c.id == job_id).values(options=rest))
