"""What each key's jobs store in the control database, and the per-key cap on it (docs/design.md section 3).

A job's `stored_bytes` is its admission estimate (control.planning.resources: T releases and the posterior)
while it is queued or running, and what it stored (its releases' bytes and its posterior's JSON text) once it
has ended; deleting its outputs sets it to 0. A key stores the sum over its jobs. Submission checks
  stored(key) + estimate(job) <= VIPS_MAX_KEY_STORED_MB
under a lock of the key's row, in the transaction that inserts the job, so concurrent submissions of one
key never pass the cap together. The worker bounds each job by VIPS_MAX_JOB_STORED_MB as it stores.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, Engine, Row, delete, func, select, update
from sqlalchemy.sql.elements import ColumnElement

from control.errors import Conflict, StorageFull
from control.schemas import StorageRefusal
from control.store.job_status import TERMINAL
from control.store.models import jobs, posteriors, releases
from control.store.posteriors import delete_posterior

MIB = 1 << 20


def human_bytes(count: float) -> str:
    """1.3 GB, 64 MB, 12 kB (decimal units, two significant figures)."""
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if count >= size:
            return f"{count / size:.2g} {unit}" if count < 10 * size else f"{count / size:.0f} {unit}"
    return f"{int(count)} B"


def measured_bytes(job_id: str) -> ColumnElement[Any]:
    """What the job stores now, as an SQL expression: its releases' bytes plus its posterior's JSON text.
    end_job sets it in the same UPDATE as the job's terminal status: a second UPDATE of the row in that
    transaction would re-check the row's foreign keys (PostgreSQL does for a row its own transaction wrote)
    and wait on the key row a submission holds, while the submission waits on the budget row end_job holds."""
    released = (
        select(func.coalesce(func.sum(releases.c.stored_bytes), 0))
        .where(releases.c.job_id == job_id)
        .scalar_subquery()
    )
    posterior = (
        select(func.coalesce(func.sum(posteriors.c.stored_bytes), 0))
        .where(posteriors.c.job_id == job_id)
        .scalar_subquery()
    )
    return released + posterior


def key_stored_bytes(conn: Connection, key_id: str) -> int:
    """The bytes `key_id`'s jobs store or, while they run, may store."""
    total = conn.execute(
        select(func.coalesce(func.sum(jobs.c.stored_bytes), 0)).where(jobs.c.owner == key_id)
    ).scalar_one()
    return int(total)


def storage_problem(stored: int, estimate: int, max_key_stored_mb: float) -> str | None:
    """Why a job estimated at `estimate` bytes does not fit beside the key's `stored` bytes, or None."""
    cap = int(max_key_stored_mb * MIB)
    if stored + estimate <= cap:
        return None
    return (
        f"this key's jobs store {human_bytes(stored)} (queued and running jobs at their estimates) and this "
        f"job would store about {human_bytes(estimate)}: together more than the {human_bytes(cap)} a key "
        "may store (VIPS_MAX_KEY_STORED_MB); nothing was reserved. Delete finished jobs' outputs you no "
        "longer need (vips delete JOB, or DELETE /v1/jobs/{id}/outputs) or run fewer iterations"
    )


def check_storage_room(conn: Connection, key_id: str, estimate: int, max_key_stored_mb: float) -> None:
    """Raise StorageFull unless the key's storage has room for `estimate` more bytes. The caller holds
    the key's row lock (service.routes.submission) and inserts the job in the same transaction."""
    stored = key_stored_bytes(conn, key_id)
    problem = storage_problem(stored, estimate, max_key_stored_mb)
    if problem is not None:
        cap = int(max_key_stored_mb * MIB)
        raise StorageFull(
            StorageRefusal(
                detail=problem, key_stored_bytes=stored, key_max_stored_bytes=cap, stored_bytes=estimate
            )
        )


def delete_outputs(engine: Engine, job: Row[Any]) -> bool:
    """Delete an ended job's releases and posterior (its record, charges and ledger entries stay) and
    free its storage. Returns False when they were deleted already; 409 for a job still queued or running."""
    if job.status not in TERMINAL:
        raise Conflict(
            f"job {job.id} is {job.status}: its outputs can be deleted once it has ended (cancel it first)"
        )
    with engine.begin() as conn:
        deleted = conn.execute(
            update(jobs)
            .where(jobs.c.id == job.id, jobs.c.outputs_deleted_at.is_(None))
            .values(stored_bytes=0, outputs_deleted_at=datetime.now(UTC))
        ).rowcount
        if deleted:
            conn.execute(delete(releases).where(releases.c.job_id == job.id))
            delete_posterior(conn, job.id)
    return bool(deleted)
