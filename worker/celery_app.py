"""The Celery application of the worker process: `celery -A worker.celery_app worker` (or `vips worker`)."""

from __future__ import annotations

from celery import Celery

from control.settings import get_settings

LOST_JOB_PROCESS_WAIT_SECONDS = 1.0


def create_celery() -> Celery:
    app = Celery("vips", include=["worker.tasks"])
    app.conf.update(get_settings().celery_config())
    # How long a job process's death waits before its task gets WorkerLostError when the pool has no event
    # loop (the file broker of `vips up`; with Redis it is at once), so that the job fails at once
    # (worker.tasks._fail_killed_job): Celery's 10 s is for results a dying child may have written, and
    # this service keeps no results (the job's row says how it ended).
    app.conf.worker_lost_wait = LOST_JOB_PROCESS_WAIT_SECONDS
    # A worker outlives any broker outage: it reconnects for as long as it takes (Celery's default gives up
    # after 100 attempts, about 45 minutes, and the worker exits), while /readyz reports the broker down.
    app.conf.broker_connection_retry = True
    app.conf.broker_connection_max_retries = None
    return app


app = create_celery()
