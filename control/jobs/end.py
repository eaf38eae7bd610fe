"""Ending a job. Its terminal status and the refund of its unspent reservation commit in one transaction,
so no reader (the API, the dashboard, an auditor) ever sees an ended job whose reservation still holds
budget; its estimated stored bytes become what it stored (control.jobs.storage). Lock order: the job's row,
then the dataset's budget row (a charge locks only the latter)."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import ColumnElement, Connection, update

from control.jobs.storage import measured_bytes
from control.store.job_status import TERMINAL
from control.store.models import jobs
from privacy_wall.ledger import database as ledger_db


def end_job(
    conn: Connection,
    job_id: str,
    status: str,
    *,
    only_if: ColumnElement[bool],
    error: str | None = None,
) -> bool:
    """Set a terminal `status` where `only_if` holds (the status the caller read: concurrent enders end a
    job once) and close its reservation, in the caller's transaction. Returns whether this call ended it."""
    if status not in TERMINAL:
        raise ValueError(f"{status!r} is not a terminal status")
    changed = conn.execute(
        update(jobs)
        .where(jobs.c.id == job_id, only_if)
        .values(
            status=status,
            error=error,
            finished_at=datetime.now(UTC),
            stored_bytes=measured_bytes(job_id),  # what it stored replaces its estimate
        )
    ).rowcount
    if changed:
        ledger_db.close_reservation(conn, job_id)
    return bool(changed)
