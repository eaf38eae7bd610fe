"""The reaper: no job holds budget forever. It needs only the control database, so it runs in the API
process (every `reaper_interval_seconds`), in every worker, and as Celery beat's periodic task.

A job is reaped (failed with a message that says why, its unspent reservation refunded) when
- it is `running` and no worker has reported progress for `heartbeat_timeout_seconds` (its worker died,
  or lost the database for that long), or
- it is still `queued` `queued_timeout_seconds` after its submission (or after a worker last deferred
  it, service.settings: a key at its running limit) and the broker no longer holds its task (the broker
  lost it, e.g. Redis restarted without persistence). A job whose task waits in the broker behind a
  backlog is never reaped; where the broker cannot be read, nothing queued is reaped.
Every update is conditional on the status it read, so concurrent reapers (several API processes and
workers) reap each job once. Charges are never undone: a reaped job keeps what it released.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Engine, or_, select, update

from privacy_wall.ledger import database as ledger_db
from privacy_wall.ledger.schema import reservations
from service.jobs.end import end_job
from service.jobs.periodic import run_every
from service.jobs.queue import JobQueue
from service.store.job_status import TERMINAL
from service.store.models import jobs
from service.store.timestamps import aware

log = logging.getLogger(__name__)


def heartbeat_is_fresh(job: Any, timeout_seconds: float) -> bool:
    beat = aware(job.heartbeat_at)
    return beat is not None and beat > datetime.now(UTC) - timedelta(seconds=timeout_seconds)


def lost_worker_message(timeout_seconds: float) -> str:
    return (
        f"no worker reported progress on this job for {timeout_seconds:g} s (its worker died or lost the "
        "database); the job was failed and its unspent budget refunded"
    )


def unstarted_message(timeout_seconds: float) -> str:
    return (
        f"no worker started this job within {timeout_seconds:g} s and the job queue no longer holds it (it "
        "was lost, e.g. the broker restarted without its data); the job was failed and its budget refunded: "
        "submit it again"
    )


#: Which of these queued jobs' tasks the broker still holds, from one read of it; None when it cannot be
#: read (service.jobs.queue.JobQueue.holds).
Holds = Callable[[AbstractSet[str]], set[str] | None]


def is_quiet(job: Any, now: datetime, timeout_seconds: float) -> bool:
    """Nothing happened to the queued job for timeout_seconds: submitted, or last deferred by a worker."""
    signs = [aware(job.created_at), aware(job.heartbeat_at)]
    last = max((sign for sign in signs if sign is not None), default=None)
    return last is not None and last < now - timedelta(seconds=timeout_seconds)


def reap(
    control: Engine,
    heartbeat_timeout: float,
    queued_timeout: float | None = None,
    holds: Holds | None = None,
) -> list[str]:
    """Fail stale running jobs, and queued ones quiet for queued_timeout whose task `holds` says the broker
    no longer has (without `holds`, by age alone); return the ids reaped. The broker is read at most once
    per pass, for all the quiet queued jobs."""
    now = datetime.now(UTC)
    with control.connect() as conn:
        rows = conn.execute(
            select(jobs.c.id, jobs.c.status, jobs.c.heartbeat_at, jobs.c.created_at).where(
                or_(jobs.c.status == "running", jobs.c.status == "queued")
            )
        ).all()
    quiet = (
        {row.id for row in rows if row.status == "queued" and is_quiet(row, now, queued_timeout)}
        if queued_timeout is not None
        else set()
    )
    held = holds(quiet) if quiet and holds is not None else set()  # None: unreadable, none is reaped
    doomed: list[tuple[str, str, str]] = []
    for row in rows:
        if row.status == "running" and not heartbeat_is_fresh(row, heartbeat_timeout):
            doomed.append((row.id, "running", lost_worker_message(heartbeat_timeout)))
        elif row.id in quiet and held is not None and row.id not in held:
            assert queued_timeout is not None  # quiet is empty without it
            doomed.append((row.id, "queued", unstarted_message(queued_timeout)))
    reaped = []
    for job_id, status, message in doomed:
        with control.begin() as conn:
            changed = end_job(conn, job_id, "failed", only_if=jobs.c.status == status, error=message)
        if changed:
            log.warning("reaped job %s (%s): %s", job_id, status, message)
            reaped.append(job_id)
    # A job ended with an open reservation (its submission failed between reserving and queueing, or a
    # database older than end_job's single transaction left one): close those too.
    with control.connect() as conn:
        stranded = conn.execute(
            select(reservations.c.job_id)
            .join(jobs, jobs.c.id == reservations.c.job_id)
            .where(reservations.c.open.is_(True), jobs.c.status.in_(TERMINAL))
        ).scalars()
        stranded_ids = list(stranded)
    for job_id in stranded_ids:
        ledger_db.refund(control, job_id)
    return reaped


def fail_running_jobs(control: Engine, message: str) -> list[str]:
    """Fail every running job now with `message` and refund it (the embedded worker died: they were its)."""
    with control.connect() as conn:
        running = list(conn.execute(select(jobs.c.id).where(jobs.c.status == "running")).scalars())
    failed = []
    for job_id in running:
        with control.begin() as conn:
            if end_job(conn, job_id, "failed", only_if=jobs.c.status == "running", error=message):
                failed.append(job_id)
    return failed


def requeue_interrupted_jobs(control: Engine, queue: JobQueue) -> list[str]:
    """Embedded mode's restart, before its only worker starts: every job still `running` (the last `vips up`
    stopped under it) goes back to `queued` (its start and releases kept) and is sent to the broker again,
    as is every queued job the broker no longer holds (a deferred task the stopped worker kept in memory).
    The worker resumes each from its stored releases, as after any lost task. Returns the job ids sent."""
    now = datetime.now(UTC)
    with control.begin() as conn:
        running = list(conn.execute(select(jobs.c.id).where(jobs.c.status == "running")).scalars())
        if running:
            conn.execute(
                update(jobs)
                .where(jobs.c.id.in_(running), jobs.c.status == "running")
                .values(status="queued", heartbeat_at=now)
            )
        queued = set(conn.execute(select(jobs.c.id).where(jobs.c.status == "queued")).scalars())
    held = queue.holds(queued - set(running))
    lost = sorted(queued - set(running) - (held if held is not None else queued))
    for job_id in [*running, *lost]:
        queue.send_run_job(job_id)
    return [*running, *lost]


def start_reaper_thread(
    control: Engine,
    interval: float,
    heartbeat_timeout: float,
    queued_timeout: float | None,
    holds: Holds | None = None,
) -> threading.Event:
    """Reap every `interval` seconds in a daemon thread until the returned event is set."""
    return run_every(interval, lambda: reap(control, heartbeat_timeout, queued_timeout, holds), "reaper")
