"""Stopping a job: cancel now if it never started (refunded in the same transaction), else ask the
worker to stop before its next release."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, Row, and_, update

from control.errors import Conflict
from control.jobs.end import end_job
from control.store.models import jobs


def cancel_job(engine: Engine, job: Row[Any]) -> None:
    """Ask the job to stop. A queued job that has not started is cancelled now and its reservation
    refunded; a running one stops before its next release (the worker refunds the rest)."""
    if job.status in ("succeeded", "failed"):
        raise Conflict(f"job {job.id} has already {job.status}")
    if job.status == "cancelled":
        return
    with engine.begin() as conn:
        conn.execute(update(jobs).where(jobs.c.id == job.id).values(cancel_requested=True))
        end_job(
            conn, job.id, "cancelled", only_if=and_(jobs.c.status == "queued", jobs.c.started_at.is_(None))
        )
