"""Tables of the sensitive database: the rows themselves. Only the privacy wall opens this database.

`stored_datasets`: how to decode a dataset's rows (kind, population N, dimension) and whether its
  custodian marked it public (the gate allows seeds and sigma = 0 only then).
`rows`: one row per record, keyed by (dataset, row_id) with row ids 0..N-1, so a uniform minibatch is
  drawn by id without scanning; `payload` is the record's encoding for its kind (tabular and regression:
  float64 features; bow: int32 word ids then int32 counts; binary: packed bits), `label` the tabular
  label or the regression target.
"""

from __future__ import annotations

from sqlalchemy import (
    Boolean,
    Column,
    DateTime,
    Float,
    ForeignKey,
    Integer,
    LargeBinary,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
)

metadata = MetaData()

stored_datasets = Table(
    "stored_datasets",
    metadata,
    Column("name", String(128), primary_key=True),
    Column("kind", String(16), nullable=False),
    Column("population", Integer, nullable=False),
    Column("dimension", Integer, nullable=False),
    Column("public", Boolean, nullable=False),  # marked non-sensitive by its custodian (demos, tests)
    Column("created_at", DateTime(timezone=True), nullable=False),
)

rows = Table(
    "rows",
    metadata,
    Column("dataset", String(128), ForeignKey("stored_datasets.name", ondelete="CASCADE"), nullable=False),
    Column("row_id", Integer, nullable=False),
    Column("payload", LargeBinary, nullable=False),
    Column("label", Float, nullable=True),
    PrimaryKeyConstraint("dataset", "row_id"),
)
