"""The service's tables in the control database: API keys, jobs, per-iteration releases, posteriors.

They share the control database (and its MetaData, hence one Alembic history) with the privacy wall's
catalogue and ledger tables (privacy_wall.ledger.schema). Nothing here holds sensitive rows: a release
is the noised output of the gate.
"""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Float,
    ForeignKey,
    Integer,
    LargeBinary,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
    UniqueConstraint,
    text,
)

from privacy_wall.ledger.schema import metadata

api_keys = Table(
    "api_keys",
    metadata,
    Column("id", String(32), primary_key=True),  # public key id, the prefix of the key
    Column("key_hash", String(64), nullable=False, unique=True),  # sha256 of the whole key
    Column("role", String(16), nullable=False),  # admin | custodian | analyst | client
    # Scope: custodian, analyst and client keys may name one dataset. NULL: a custodian's own datasets;
    # every dataset for analyst and client keys (created only with an explicit --all-datasets).
    Column("dataset", String(128), nullable=True),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("revoked", Boolean, nullable=False, default=False),
    Column("expires_at", DateTime(timezone=True), nullable=True),  # NULL: never; after it, 401
    # A label, public inside the deployment, not unique (control.store.keys.key_name_problem); NULL: none.
    Column("name", String(64), nullable=True),
)

jobs = Table(
    "jobs",
    metadata,
    Column("id", String(32), primary_key=True),
    Column("dataset", String(128), ForeignKey("datasets.name"), nullable=False, index=True),
    Column("owner", String(32), ForeignKey("api_keys.id"), nullable=False, index=True),
    Column("model", String(16), nullable=False),
    Column("algorithm", String(16), nullable=False),
    Column("options", JSON, nullable=False),
    Column("iterations", Integer, nullable=False),
    Column("batch_size", Integer, nullable=False),
    Column("sigma", Float, nullable=False),
    Column("epsilon_target", Float, nullable=True),
    Column("epsilon_job", Float, nullable=True),  # the whole job on its own; None when sigma = 0
    Column("delta", Float, nullable=False),
    Column("status", String(16), nullable=False, index=True),  # queued running succeeded failed cancelled
    Column("iteration", Integer, nullable=False, default=0),
    Column("cancel_requested", Boolean, nullable=False, default=False),
    Column("error", Text, nullable=True),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("started_at", DateTime(timezone=True), nullable=True),
    Column("finished_at", DateTime(timezone=True), nullable=True),
    Column("heartbeat_at", DateTime(timezone=True), nullable=True),
    # The submitter's Idempotency-Key: the same key (per submitting key) returns the same job.
    Column("idempotency_key", String(128), nullable=True),
    # Bytes the job's outputs (releases and posterior) take, counted against its key's storage cap
    # (control.jobs.storage): its admission estimate while queued or running, then what it stored; 0 once
    # they are deleted (outputs_deleted_at).
    Column("stored_bytes", BigInteger, nullable=False, server_default=text("0")),
    Column("outputs_deleted_at", DateTime(timezone=True), nullable=True),
    # Times the reaper sent the job again after its worker was lost (control.jobs.reaper.MAX_RESUMES).
    Column("resumes", Integer, nullable=False, server_default=text("0")),
    UniqueConstraint("owner", "idempotency_key", name="uq_jobs_owner_idempotency_key"),
)

releases = Table(
    "releases",
    metadata,
    Column("job_id", String(32), ForeignKey("jobs.id"), nullable=False),
    Column("iteration", Integer, nullable=False),
    # The released blocks as one .npz document (control.store.release_arrays), and its length in bytes: pages
    # of releases and the worker's bound on a job's total are counted in stored bytes.
    Column("arrays", LargeBinary, nullable=False),
    Column("stored_bytes", Integer, nullable=False),
    Column("noise_std", JSON, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    PrimaryKeyConstraint("job_id", "iteration"),
)

#: A succeeded job's posterior document: its UTF-8 JSON text is held in `posterior_chunks`, in order
#: (control.store.posteriors), so that a download reads one chunk at a time.
posteriors = Table(
    "posteriors",
    metadata,
    Column("job_id", String(32), ForeignKey("jobs.id"), primary_key=True),
    # Bytes of the JSON text: the sum of its chunks' lengths (a download's Content-Length)
    Column("stored_bytes", BigInteger, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
)

posterior_chunks = Table(
    "posterior_chunks",
    metadata,
    Column("job_id", String(32), ForeignKey("jobs.id"), nullable=False),
    Column("seq", Integer, nullable=False),
    Column("text", LargeBinary, nullable=False),
    PrimaryKeyConstraint("job_id", "seq"),
)

#: A custodian's cap on what one key may spend on one dataset: the composition of the key's own releases
#: there (charges and open reservations) stays within `epsilon` at the dataset's delta
#: (control.budgets.quotas).
key_quotas = Table(
    "key_quotas",
    metadata,
    Column("dataset", String(128), ForeignKey("datasets.name"), nullable=False),
    Column("key_id", String(32), ForeignKey("api_keys.id"), nullable=False),
    Column("epsilon", Float, nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
    PrimaryKeyConstraint("dataset", "key_id"),
)

ui_sessions = Table(
    "ui_sessions",
    metadata,
    # sha256 of the session cookie's random token: a leaked table opens no session
    Column("token_hash", String(64), primary_key=True),
    Column("key_id", String(32), ForeignKey("api_keys.id"), nullable=False, index=True),
    Column("csrf_token", String(64), nullable=False),  # every state-changing form carries it
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("expires_at", DateTime(timezone=True), nullable=False),
)
