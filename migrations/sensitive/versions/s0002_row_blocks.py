"""rows in blocks of columns

Revision ID: s0002
Revises: s0001
Create Date: 2026-11-26 11:40:00

Each dataset's rows move from one table row per record (`rows`: payload, label) to blocks of columns
(`blocks`, privacy_wall/data/blocks.py), a dataset at a time and a block at a time; the downgrade moves them
back. Self-contained: the layouts are restated here so later code changes cannot change this migration.
Rows at or past a dataset's population (a killed ingest's leftover) are not carried over.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import sqlalchemy as sa
from alembic import op

revision = "s0002"
down_revision = "s0001"
branch_labels = None
depends_on = None

#: Rows per block written by this migration (any size is valid: blocks carry their first row and count).
BLOCK_ROWS = 4096

_datasets = sa.table(
    "stored_datasets",
    sa.column("name", sa.String),
    sa.column("kind", sa.String),
    sa.column("population", sa.Integer),
    sa.column("dimension", sa.Integer),
)
_rows = sa.table(
    "rows",
    sa.column("dataset", sa.String),
    sa.column("row_id", sa.Integer),
    sa.column("payload", sa.LargeBinary),
    sa.column("label", sa.Float),
)
_blocks = sa.table(
    "blocks",
    sa.column("dataset", sa.String),
    sa.column("first_row", sa.Integer),
    sa.column("row_count", sa.Integer),
    sa.column("features", sa.LargeBinary),
    sa.column("labels", sa.LargeBinary),
)


def _create_rows() -> None:
    op.create_table(
        "rows",
        sa.Column("dataset", sa.String(length=128), nullable=False),
        sa.Column("row_id", sa.Integer(), nullable=False),
        sa.Column("payload", sa.LargeBinary(), nullable=False),
        sa.Column("label", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(["dataset"], ["stored_datasets.name"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("dataset", "row_id"),
    )


def _stored(conn: sa.Connection) -> list[Any]:
    return list(conn.execute(sa.select(_datasets).order_by(_datasets.c.name)).all())


def _block(kind: str, payloads: list[bytes], labels: list[float | None]) -> tuple[bytes, bytes | None]:
    """One block's (features, labels) blobs from per-row payloads (the s0001 encodings)."""
    if kind == "bow":  # per row: m int32 ids then m int32 counts; per block: indptr, ids, counts
        ids, counts, indptr = [], [], [0]
        for payload in payloads:
            pairs = np.frombuffer(payload, dtype="<i4")
            m = pairs.size // 2
            ids.append(pairs[:m])
            counts.append(pairs[m:])
            indptr.append(indptr[-1] + m)
        flat = (
            np.concatenate(ids) if ids else np.zeros(0),
            np.concatenate(counts) if counts else np.zeros(0),
        )
        return (
            np.asarray(indptr, dtype="<i8").tobytes()
            + flat[0].astype("<i4").tobytes()
            + flat[1].astype("<i4").tobytes(),
            None,
        )
    if kind == "binary":  # the packed rows, concatenated
        return b"".join(payloads), None
    return b"".join(payloads), np.asarray(labels, dtype="<f8").tobytes()


def _row_payloads(
    kind: str, dimension: int, count: int, features: bytes, labels: bytes | None
) -> Iterator[tuple[bytes, float | None]]:
    """The per-row (payload, label) of one block (the s0001 encodings)."""
    if kind == "bow":
        indptr = np.frombuffer(features, dtype="<i8", count=count + 1)
        entries = int(indptr[-1])
        ids = np.frombuffer(features, dtype="<i4", count=entries, offset=8 * (count + 1))
        counts = np.frombuffer(features, dtype="<i4", count=entries, offset=8 * (count + 1) + 4 * entries)
        for d in range(count):
            lo, hi = int(indptr[d]), int(indptr[d + 1])
            yield ids[lo:hi].tobytes() + counts[lo:hi].tobytes(), None
        return
    width = (dimension + 7) // 8 if kind == "binary" else 8 * dimension
    values = None if labels is None else np.frombuffer(labels, dtype="<f8")
    for r in range(count):
        yield features[r * width : (r + 1) * width], None if values is None else float(values[r])


def upgrade() -> None:
    op.create_table(
        "blocks",
        sa.Column("dataset", sa.String(length=128), nullable=False),
        sa.Column("first_row", sa.Integer(), nullable=False),
        sa.Column("row_count", sa.Integer(), nullable=False),
        sa.Column("features", sa.LargeBinary(), nullable=False),
        sa.Column("labels", sa.LargeBinary(), nullable=True),
        sa.ForeignKeyConstraint(["dataset"], ["stored_datasets.name"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("dataset", "first_row"),
    )
    conn = op.get_bind()
    for stored in _stored(conn):
        for first in range(0, max(int(stored.population), 0), BLOCK_ROWS):
            last = min(first + BLOCK_ROWS, int(stored.population))
            part = conn.execute(
                sa.select(_rows.c.payload, _rows.c.label)
                .where(_rows.c.dataset == stored.name, _rows.c.row_id >= first, _rows.c.row_id < last)
                .order_by(_rows.c.row_id)
            ).all()
            if len(part) != last - first:
                raise RuntimeError(f"stored dataset {stored.name!r} is missing rows: cannot convert it")
            features, labels = _block(stored.kind, [p for p, _ in part], [label for _, label in part])
            conn.execute(
                sa.insert(_blocks).values(
                    dataset=stored.name,
                    first_row=first,
                    row_count=last - first,
                    features=features,
                    labels=labels,
                )
            )
    op.drop_table("rows")


def downgrade() -> None:
    _create_rows()
    conn = op.get_bind()
    for stored in _stored(conn):
        starts = conn.execute(
            sa.select(_blocks.c.first_row)
            .where(_blocks.c.dataset == stored.name, _blocks.c.first_row < stored.population)
            .order_by(_blocks.c.first_row)
        ).scalars()
        for first in list(starts):
            block = conn.execute(
                sa.select(_blocks).where(_blocks.c.dataset == stored.name, _blocks.c.first_row == first)
            ).one()
            rows = _row_payloads(
                stored.kind, int(stored.dimension), int(block.row_count), block.features, block.labels
            )
            conn.execute(
                sa.insert(_rows),
                [
                    {"dataset": stored.name, "row_id": first + i, "payload": payload, "label": label}
                    for i, (payload, label) in enumerate(rows)
                ],
            )
    op.drop_table("blocks")
