"""The privacy wall's tables in the control database: the public catalogue of datasets and the ledger.

`datasets`: public metadata a custodian declares at ingestion (N, dimension, schema, public flag).
`budgets`: one row per dataset: epsilon cap, delta, and the running sum of committed RDP curves; the row
  every admission locks.
`reservations`: a job's whole curve, reserved at admission, and how many iterations it has committed.
`charges`: the audit log: one row per released iteration, keyed by (job, t, attempt), with its
  declarative event and RDP curve.
"""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    Boolean,
    Column,
    DateTime,
    Float,
    ForeignKey,
    Integer,
    MetaData,
    String,
    Table,
    UniqueConstraint,
)

metadata = MetaData()

datasets = Table(
    "datasets",
    metadata,
    Column("name", String(128), primary_key=True),
    Column("kind", String(16), nullable=False),  # tabular | regression | bow | binary
    Column("population", Integer, nullable=False),
    Column("dimension", Integer, nullable=False),
    Column("schema", JSON, nullable=False),  # column names or vocabulary size: public by declaration
    Column("public", Boolean, nullable=False, default=False),
    Column("owner", String(64), nullable=True),  # the custodian key id that owns it
    Column("created_at", DateTime(timezone=True), nullable=False),
)

budgets = Table(
    "budgets",
    metadata,
    Column("dataset", String(128), primary_key=True),
    Column("epsilon", Float, nullable=True),  # None: no cap (public datasets)
    Column("delta", Float, nullable=False),
    Column("committed_curve", JSON, nullable=False),
    Column("orders", JSON, nullable=False),
    Column("accountant", String(64), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
)

reservations = Table(
    "reservations",
    metadata,
    Column("job_id", String(64), primary_key=True),
    Column("dataset", String(128), ForeignKey("budgets.dataset"), nullable=False, index=True),
    Column("event", JSON, nullable=False),
    Column("per_iteration_curve", JSON, nullable=False),
    Column("iterations", Integer, nullable=False),
    Column("committed", Integer, nullable=False, default=0),
    Column("open", Boolean, nullable=False, default=True),
    Column("created_at", DateTime(timezone=True), nullable=False),
)

charges = Table(
    "charges",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("dataset", String(128), ForeignKey("budgets.dataset"), nullable=False, index=True),
    Column("job_id", String(64), nullable=False, index=True),
    Column("iteration", Integer, nullable=False),
    Column("attempt", Integer, nullable=False, default=0),
    Column("event", JSON, nullable=False),
    Column("curve", JSON, nullable=False),
    Column("accountant", String(64), nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    UniqueConstraint("job_id", "iteration", "attempt", name="uq_charges_job_iteration_attempt"),
)

#: Every re-pricing of a dataset's ledger by another accountant (same events, another analysis).
accountant_changes = Table(
    "accountant_changes",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("dataset", String(128), ForeignKey("budgets.dataset"), nullable=False, index=True),
    Column("old_accountant", String(64), nullable=False),
    Column("new_accountant", String(64), nullable=False),
    Column("epsilon_spent_before", Float, nullable=True),  # None: unbounded (inf)
    Column("epsilon_spent_after", Float, nullable=True),
    Column("changed_at", DateTime(timezone=True), nullable=False),
)
