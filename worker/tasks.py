"""Celery tasks. Tasks take ids, never objects; the job's state lives in the control database."""

from __future__ import annotations

import logging
import threading

from celery.signals import worker_ready

from service.settings import RUN_JOB_TASK, get_settings
from worker.celery_app import app
from worker.context import control_engine, sensitive_engine
from worker.jobs import execute_job, reap

log = logging.getLogger(__name__)


@app.task(name=RUN_JOB_TASK, acks_late=True, reject_on_worker_lost=True)
def run_job(job_id: str) -> str:
    """Run one job through the gate; idempotent under redelivery."""
    return execute_job(
        job_id,
        control_engine(),
        sensitive_engine(),
        heartbeat_timeout=get_settings().heartbeat_timeout_seconds,
    )


def _reaper_loop(stop: threading.Event) -> None:
    timeout = get_settings().heartbeat_timeout_seconds
    while not stop.wait(timeout / 2):
        try:
            for job_id in reap(control_engine(), timeout):
                log.warning("reaped job %s: its worker was lost; unspent budget refunded", job_id)
        except Exception:  # keep reaping after a transient database error
            log.exception("reaper pass failed")


@worker_ready.connect
def _start_reaper(**_: object) -> None:
    """Reap once at start-up (jobs of a worker that died before this one started), then periodically."""
    timeout = get_settings().heartbeat_timeout_seconds
    for job_id in reap(control_engine(), timeout):
        log.warning("reaped job %s at start-up", job_id)
    threading.Thread(target=_reaper_loop, args=(threading.Event(),), name="reaper", daemon=True).start()
