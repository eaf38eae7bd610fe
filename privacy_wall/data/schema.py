"""Tables of the sensitive database: the rows themselves. Only the privacy wall opens this database.

`stored_datasets`: how to decode a dataset's rows (kind, population N, dimension) and whether its
  custodian marked it public (the gate allows seeds and sigma = 0 only then).
`blocks`: the rows in blocks of columns, keyed by (dataset, first_row); a block holds rows first_row ..
  first_row + row_count - 1 (the blocks tile ids 0..N-1), its `features` and `labels` blobs laid
  out by kind (privacy_wall.data.blocks). A full pass reads the blocks in order; a uniform minibatch reads the
  blocks its sampled ids fall in.
"""

from __future__ import annotations

from sqlalchemy import (
    Boolean,
    Column,
    DateTime,
    ForeignKey,
    Integer,
    LargeBinary,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    func,
    text,
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

blocks = Table(
    "blocks",
    metadata,
    Column("dataset", String(128), ForeignKey("stored_datasets.name", ondelete="CASCADE"), nullable=False),
    Column("first_row", Integer, nullable=False),
    Column("row_count", Integer, nullable=False),
    Column("features", LargeBinary, nullable=False),
    Column("labels", LargeBinary, nullable=True),
    PrimaryKeyConstraint("dataset", "first_row"),
)

shard_requests = Table(
    "shard_requests",
    metadata,
    Column("job_id", String(64), nullable=False),
    Column("iteration", Integer, nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("token", String(32), nullable=False),  # a random nonce per request (its tasks carry it)
    Column("shards", Integer, nullable=False, server_default=text("0")),  # the coordinator's K
    Column("params", LargeBinary, nullable=False),  # the query's public parameters (.npz)
    Column("rows", LargeBinary, nullable=True),  # a minibatch's sampled row ids (.npy); NULL: a full pass
    Column("created_at", DateTime(timezone=True), nullable=False),
    # The coordinator's last sign of life, refreshed while it waits (by the database server's clock on
    # PostgreSQL): a request whose heartbeat stopped is removed with its partial sums (shards.py).
    Column("heartbeat_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    PrimaryKeyConstraint("job_id", "iteration", "attempt"),
)

shard_sums = Table(
    "shard_sums",
    metadata,
    Column("job_id", String(64), nullable=False),
    Column("iteration", Integer, nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("shard", Integer, nullable=False),
    Column("sums", LargeBinary, nullable=True),  # the shard's clipped sums (.npz); NULL when it failed
    Column("failed", Boolean, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    PrimaryKeyConstraint("job_id", "iteration", "attempt", "shard"),
)

shard_leases = Table(
    "shard_leases",
    metadata,
    Column("shard", Integer, primary_key=True, autoincrement=False),
    Column("holder", String(255), nullable=False),  # host:pid of the worker serving it
    Column("renewed_at", DateTime(timezone=True), nullable=False),
)
