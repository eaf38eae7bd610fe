"""The reaper: no job holds budget forever, and no job is lost with its worker. It needs only the control
database (and, to send jobs again, the broker), so it runs in the API process (every
`reaper_interval_seconds`), in every worker, and as Celery beat's periodic task.

Given a way to send jobs (`resend`: the control database is the source of truth for what is queued), a job
whose worker was lost is sent again, up to MAX_RESUMES times, and resumes from its stored releases:
- it is `running` and no worker has reported progress for `heartbeat_timeout_seconds` (its worker died,
  or lost the database for that long), or
- it is `queued`, nothing happened to it for `heartbeat_timeout_seconds` (submitted, last deferred by a
  worker, or last sent again) and its task is not waiting in the broker's queue: a worker took it and
  died before starting it (Redis would keep such a task unacknowledged until its visibility timeout, an
  hour), or the broker lost it (Redis restarted without persistence, a killed embedded worker).
A live worker starts what it takes at once (prefetch 1; a deferred job's heartbeat is refreshed at each
deferral), so a taken job quiet for a heartbeat is its dead worker's. Past MAX_RESUMES, or without
`resend`, such a job is failed with a message that says why and its unspent reservation refunded (a
queued one without `resend` only after `queued_timeout_seconds` and once the broker holds its task
nowhere). Where the broker cannot be read, nothing queued is touched. Every update is conditional on
what it read, so concurrent reapers (several API processes and workers) send or reap each job once.
Charges are never undone: a reaped job keeps what it released.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from sqlalchemy import Engine, or_, select, update

from control.jobs.end import end_job
from control.jobs.periodic import run_every
from control.jobs.queue import JobQueue
from control.store.job_status import TERMINAL
from control.store.models import jobs
from control.store.timestamps import aware
from privacy_wall.ledger import database as ledger_db
from privacy_wall.ledger.schema import reservations

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


#: A job sent again this many times after losing its worker is failed the next time: a job that brings
#: down every worker that takes it must not take them down for ever.
MAX_RESUMES = 3


class Holds(Protocol):
    """Which of these queued jobs' tasks the broker still holds (with `taken`, also those delivered and not
    acknowledged), from one read of it; None when it cannot be read (control.jobs.queue.JobQueue.holds)."""

    def __call__(self, job_ids: AbstractSet[str], taken: bool = True) -> set[str] | None: ...


def exhausted_message(timeout_seconds: float) -> str:
    return (
        f"this job lost its worker {MAX_RESUMES + 1} times (no progress for {timeout_seconds:g} s each time; "
        f"it was sent again {MAX_RESUMES} times): the job was failed and its unspent budget refunded"
    )


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
    resend: Callable[[str], None] | None = None,
) -> list[str]:
    """Send again (with `resend`) or fail the jobs whose worker was lost (module docstring); return the ids
    failed. The broker is read at most once per pass, for all the quiet queued jobs."""
    now = datetime.now(UTC)
    rows = _rows_to_check(control)
    resumed: list[Any] = []
    doomed: list[tuple[str, str, str]] = []
    if resend is not None:
        quiet = {row.id for row in rows if row.status == "queued" and is_quiet(row, now, heartbeat_timeout)}
        waiting = holds(quiet, taken=False) if quiet and holds is not None else set()
        lost = quiet - waiting if waiting is not None else set()  # None: unreadable, none is touched
        for row in rows:
            stale = row.status == "running" and not heartbeat_is_fresh(row, heartbeat_timeout)
            if (stale or row.id in lost) and row.resumes < MAX_RESUMES:
                resumed.append(row)
            elif stale or row.id in lost:
                doomed.append((row.id, row.status, exhausted_message(heartbeat_timeout)))
    else:
        quiet = (
            {row.id for row in rows if row.status == "queued" and is_quiet(row, now, queued_timeout)}
            if queued_timeout is not None
            else set()
        )
        held = holds(quiet) if quiet and holds is not None else set()  # None: unreadable, none is reaped
        for row in rows:
            if row.status == "running" and not heartbeat_is_fresh(row, heartbeat_timeout):
                doomed.append((row.id, "running", lost_worker_message(heartbeat_timeout)))
            elif row.id in quiet and held is not None and row.id not in held:
                assert queued_timeout is not None  # quiet is empty without it
                doomed.append((row.id, "queued", unstarted_message(queued_timeout)))
    for row in resumed:
        assert resend is not None
        _send_again(control, row, resend)
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


def _rows_to_check(control: Engine) -> list[Any]:
    """The queued and running jobs, with what the reaper decides by (and conditions its updates on)."""
    with control.connect() as conn:
        return list(
            conn.execute(
                select(
                    jobs.c.id, jobs.c.status, jobs.c.heartbeat_at, jobs.c.created_at, jobs.c.resumes
                ).where(or_(jobs.c.status == "running", jobs.c.status == "queued"))
            ).all()
        )


def _send_again(control: Engine, row: Any, resend: Callable[[str], None]) -> bool:
    """Queue the job again (its releases and start kept) and send it, if no other reaper did and nothing
    happened to it since it was read; a job sent but not taken is sent again on a later pass."""
    unchanged = [jobs.c.id == row.id, jobs.c.status == row.status, jobs.c.resumes == row.resumes]
    unchanged.append(
        jobs.c.heartbeat_at.is_(None) if row.heartbeat_at is None else jobs.c.heartbeat_at == row.heartbeat_at
    )
    with control.begin() as conn:
        changed = conn.execute(
            update(jobs)
            .where(*unchanged)
            .values(status="queued", heartbeat_at=datetime.now(UTC), resumes=row.resumes + 1)
        ).rowcount
    if not changed:
        return False
    log.warning("job %s lost its worker (%s); sent again (%d of %d)", row.id, row.status, row.resumes + 1,
                MAX_RESUMES)  # fmt: skip
    try:
        resend(row.id)
    except Exception as exc:  # the broker is down: a later pass sends it again (it is quiet by then)
        log.warning("could not send job %s again (%s)", row.id, type(exc).__name__)
    return True


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
    resend: Callable[[str], None] | None = None,
) -> threading.Event:
    """Reap every `interval` seconds in a daemon thread until the returned event is set."""
    return run_every(
        interval, lambda: reap(control, heartbeat_timeout, queued_timeout, holds, resend), "reaper"
    )
