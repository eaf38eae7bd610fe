"""Celery tasks. Tasks take ids, never objects; the job's state lives in the control database."""

from __future__ import annotations

import logging
import os
import threading
import time
from functools import lru_cache
from pathlib import Path
from typing import Any

from celery.signals import worker_process_init, worker_ready
from sqlalchemy import select
from threadpoolctl import threadpool_limits

from privacy_wall.db_store import DatabaseStore
from privacy_wall.shards import ShardedSums, ShardTask, answer, linger, pending
from privacy_wall.sqlengine import reading
from service.models import jobs
from service.queue import CeleryQueue, send_run_job
from service.reaper import reap, start_reaper_thread
from service.settings import (
    REAP_TASK,
    RUN_JOB_TASK,
    SHARD_TASK,
    SHARD_WORKER_ENV,
    WORKER_ALIVE_SECONDS,
    get_settings,
    shard_queue,
)
from worker.celery_app import app
from worker.context import control_engine, dataset_cache, sensitive_engine
from worker.jobs import DatabaseUnavailable, StorageLimits, execute_job
from worker.models.registry import model_setup

log = logging.getLogger(__name__)

MIB = 1 << 20

#: Retries of a job whose database was unreachable (waits double from 5 s, capped at 5 minutes).
MAX_DATABASE_RETRIES = 12


def retry_delay(retries: int, started: bool, heartbeat_timeout: float) -> float:
    """Seconds before retrying: a job that had started waits out its heartbeat so the retry resumes it."""
    backoff = min(5.0 * 2.0**retries, 300.0)
    return backoff + (heartbeat_timeout if started else 0.0)


@app.task(name=RUN_JOB_TASK, bind=True, acks_late=True, reject_on_worker_lost=True)
def run_job(self: Any, job_id: str) -> str:
    """Run one job through the gate; idempotent under redelivery. A database outage is retried with
    backoff (never acknowledged away); past the retries the reaper fails the job and refunds it."""
    settings = get_settings()
    try:
        status = execute_job(
            job_id,
            control_engine(),
            sensitive_engine(),
            heartbeat_timeout=settings.heartbeat_timeout_seconds,
            max_running_per_key=settings.max_running_per_key,
            max_job_seconds=settings.max_job_seconds or None,
            limits=StorageLimits(
                release_bytes=int(settings.max_release_mb * MIB),
                stored_bytes=int(settings.max_job_stored_mb * MIB),
            ),
            cache=dataset_cache(),
            shards=sharded_sums(),
        )
    except DatabaseUnavailable as exc:
        delay = retry_delay(self.request.retries, exc.started, settings.heartbeat_timeout_seconds)
        log.warning("%s; retry %d in %g s", exc, self.request.retries + 1, delay)
        raise self.retry(exc=exc, countdown=delay, max_retries=MAX_DATABASE_RETRIES) from None
    if status == "deferred":  # its key runs enough jobs: this slot goes to the next task, this one waits
        send_run_job(app, job_id, countdown=settings.defer_seconds)
    return status


def send_shard_task(task: ShardTask) -> None:
    """Queue one shard's part of a release on that shard's queue (public ids only)."""
    app.send_task(
        SHARD_TASK,
        args=[task.job_id, task.iteration, task.attempt, task.shard, task.shards, task.token],
        queue=shard_queue(task.shard),
    )


def sharded_sums() -> ShardedSums | None:
    """The coordinator of sharded full passes when VIPS_SHARDS > 1, else None (each job computes its own)."""
    settings = get_settings()
    if settings.shards < 2:
        return None
    return ShardedSums(
        sensitive_engine(),
        settings.shards,
        send_shard_task,
        resend_seconds=settings.shard_resend_seconds,
        timeout_seconds=settings.shard_timeout_seconds,
    )


@app.task(name=SHARD_TASK, acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def shard_sums(job_id: str, iteration: int, attempt: int, shard: int, shards: int, token: str) -> None:
    """One shard's clipped sums of a release, written inside the wall (privacy_wall.shards.answer), then
    the job's next releases' as they come (privacy_wall.shards.linger); the query is rebuilt from the job's
    public row. Returns nothing: no sum crosses the broker."""
    task = ShardTask(job_id, iteration, attempt, shard, shards, token)
    if not pending(sensitive_engine(), task):  # answered by a lingering worker meanwhile, or over
        return
    with reading(control_engine()) as conn:
        job = conn.execute(
            select(jobs.c.dataset, jobs.c.model, jobs.c.algorithm, jobs.c.options, jobs.c.sigma).where(
                jobs.c.id == job_id
            )
        ).one_or_none()
    if job is None:
        return
    query = model_setup(job.model, dict(job.options), sigma=job.sigma, algorithm=job.algorithm).query
    store = DatabaseStore(sensitive_engine(), job.dataset, dataset_cache())
    if answer(sensitive_engine(), task, store, query):
        settings = get_settings()
        linger(
            sensitive_engine(),
            task,
            store,
            query,
            settings.shard_linger_seconds,
            stale_seconds=settings.shard_resend_seconds,
        )


@lru_cache
def broker_queue() -> CeleryQueue:
    """This process's reader of the broker's queue: the reaper asks it whether a queued job's task is lost."""
    return CeleryQueue(get_settings())


@app.task(name=REAP_TASK, ignore_result=True)
def reap_jobs() -> list[str]:
    """Celery beat's periodic reaper pass (service.reaper)."""
    settings = get_settings()
    return reap(
        control_engine(),
        settings.heartbeat_timeout_seconds,
        settings.queued_timeout_seconds,
        broker_queue().holds,
    )


@worker_process_init.connect
def _one_blas_thread(**_: object) -> None:
    """Each job process (and each shard worker) is one unit of parallelism: one BLAS thread. Two BLAS
    threads per process under a neighbour's load ran BLR's full pass 3-4x slower (1.1 s instead of 0.3 s
    at 10^6 rows on 2 cores: threads waiting on a core another process holds); more cores for one job come
    from shards (VIPS_SHARDS), not threads."""
    threadpool_limits(1)


@worker_process_init.connect
def _own_connections(**_: object) -> None:
    """A job process forked after the worker opened its databases or its broker reader builds its own:
    connections are never shared across a fork (those of the parent are left to the parent, untouched)."""
    for resource in (control_engine, sensitive_engine):
        if resource.cache_info().currsize:
            resource().dispose(close=False)
        resource.cache_clear()
    dataset_cache.cache_clear()
    broker_queue.cache_clear()


@worker_ready.connect
def _start_reaper(**_: object) -> None:
    """Reap once at start-up (jobs of a worker that died before this one started), then periodically.
    Shard workers leave this to the job worker."""
    if os.environ.get(SHARD_WORKER_ENV):
        return
    settings = get_settings()
    holds = broker_queue().holds
    reap(control_engine(), settings.heartbeat_timeout_seconds, settings.queued_timeout_seconds, holds)
    start_reaper_thread(
        control_engine(),
        settings.reaper_interval_seconds,
        settings.heartbeat_timeout_seconds,
        settings.queued_timeout_seconds,
        holds,
    )
    if settings.embedded:
        threading.Thread(
            target=_report_alive, args=(settings.worker_alive_path(),), name="alive", daemon=True
        ).start()


def _report_alive(path: Path) -> None:
    """Embedded mode: touch the alive file /readyz reads, for as long as this worker lives."""
    while True:
        path.touch()
        time.sleep(WORKER_ALIVE_SECONDS)
