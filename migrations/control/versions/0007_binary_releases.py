"""releases.arrays: each release's blocks stored as one .npz document instead of JSON text

Adds `arrays` (control.store.release_arrays) and `stored_bytes` (its length), converts every stored release in
batches, then drops `statistics`. The values are unchanged: float64 written as JSON by repr round-trips
exactly. Downgrade writes the JSON back.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-26 09:00:00
"""

from __future__ import annotations

from typing import Any

import numpy as np
import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

#: Releases converted per statement batch (a release holds up to VIPS_MAX_RELEASE_MB).
BATCH = 64


def _releases(*columns: str) -> sa.TableClause:
    types: dict[str, Any] = {
        "job_id": sa.String(32),
        "iteration": sa.Integer(),
        "statistics": sa.JSON(),
        "arrays": sa.LargeBinary(),
        "stored_bytes": sa.Integer(),
    }
    return sa.table("releases", *(sa.column(name, types[name]) for name in columns))


def _convert(source: str, convert: Any, *targets: str) -> None:
    """Rewrite every release's `targets` from its `source` column, BATCH rows at a time, in key order."""
    conn = op.get_bind()
    table = _releases("job_id", "iteration", source, *targets)
    after: tuple[str, int] = ("", -1)
    while True:
        rows = conn.execute(
            sa.select(table.c.job_id, table.c.iteration, table.c[source])
            .where(sa.tuple_(table.c.job_id, table.c.iteration) > sa.tuple_(*after))
            .order_by(table.c.job_id, table.c.iteration)
            .limit(BATCH)
        ).all()
        if not rows:
            return
        for job_id, iteration, value in rows:
            conn.execute(
                sa.update(table)
                .where(table.c.job_id == job_id, table.c.iteration == iteration)
                .values(**convert(value))
            )
        after = (rows[-1][0], rows[-1][1])


def _to_arrays(statistics: dict[str, Any]) -> dict[str, Any]:
    from control.store.release_arrays import encode_arrays

    blob = encode_arrays({name: np.asarray(value, dtype=np.float64) for name, value in statistics.items()})
    return {"arrays": blob, "stored_bytes": len(blob)}


def _to_statistics(blob: bytes) -> dict[str, Any]:
    from control.store.release_arrays import decode_arrays

    return {"statistics": {name: value.tolist() for name, value in decode_arrays(blob).items()}}


def upgrade() -> None:
    with op.batch_alter_table("releases") as batch:
        batch.add_column(sa.Column("arrays", sa.LargeBinary(), nullable=True))
        batch.add_column(sa.Column("stored_bytes", sa.Integer(), nullable=True))
    _convert("statistics", _to_arrays, "arrays", "stored_bytes")
    with op.batch_alter_table("releases") as batch:
        batch.alter_column("arrays", existing_type=sa.LargeBinary(), nullable=False)
        batch.alter_column("stored_bytes", existing_type=sa.Integer(), nullable=False)
        batch.drop_column("statistics")


def downgrade() -> None:
    with op.batch_alter_table("releases") as batch:
        batch.add_column(sa.Column("statistics", sa.JSON(), nullable=True))
    _convert("arrays", _to_statistics, "statistics")
    with op.batch_alter_table("releases") as batch:
        batch.alter_column("statistics", existing_type=sa.JSON(), nullable=False)
        batch.drop_column("stored_bytes")
        batch.drop_column("arrays")
