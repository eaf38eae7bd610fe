"""Celery tasks. Tasks take ids, never objects; the job's state lives in the control database."""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from functools import lru_cache
from pathlib import Path
from typing import Any

from celery.exceptions import WorkerLostError
from celery.signals import task_failure, worker_process_init, worker_ready
from celery.worker import state as worker_state
from sqlalchemy import select
from sqlalchemy.pool import NullPool
from threadpoolctl import threadpool_limits

from control.jobs.end import end_job
from control.jobs.queue import CeleryQueue, send_run_job
from control.jobs.reaper import reap, start_reaper_thread
from control.settings import (
    REAP_TASK,
    RUN_JOB_TASK,
    SHARD_TASK,
    SHARD_WORKER_ENV,
    WORKER_ALIVE_SECONDS,
    get_settings,
    shard_queue,
)
from control.store.models import jobs
from privacy_wall.data.db_store import DatabaseStore
from privacy_wall.data.settings import get_wall_settings
from privacy_wall.shards import SWEEP_SECONDS, ShardedSums, ShardTask, answer, keep_swept, linger, pending
from privacy_wall.sqlengine import create_db_engine, reading
from vips.models.registry import model_setup
from worker.celery_app import app
from worker.context import control_engine, dataset_cache, sensitive_engine
from worker.jobs import DatabaseUnavailable, execute_job
from worker.stored_releases import StorageLimits

log = logging.getLogger(__name__)

MIB = 1 << 20

#: Retries of a job whose database was unreachable (waits double from 5 s, capped at 5 minutes).
MAX_DATABASE_RETRIES = 12


def retry_delay(retries: int, started: bool, heartbeat_timeout: float) -> float:
    """Seconds before retrying: a job that had started waits out its heartbeat so the retry resumes it."""
    backoff = min(5.0 * 2.0**retries, 300.0)
    return backoff + (heartbeat_timeout if started else 0.0)


@app.task(name=RUN_JOB_TASK, bind=True, acks_late=True, reject_on_worker_lost=False)
def run_job(self: Any, job_id: str) -> str:
    """Run one job through the gate; idempotent under redelivery. A database lost while the job runs is
    waited for in the task and the job resumes (worker.jobs.execute_job); one unreachable at the start, or
    for longer than the heartbeat timeout, is retried with backoff (never acknowledged away); past the
    retries the reaper fails the job and refunds it. A job
    process that dies under its job (the kernel's OOM killer, any SIGKILL) fails the job at once from the
    worker's main process (_fail_killed_job), and its message is acknowledged, not requeued: the job does
    not run again. (Its message stays unacknowledged only when the whole worker dies; then the reaper
    sends the job again, control.jobs.reaper, or `vips up`'s supervisor fails it.)"""
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


def killed_message(lost: BaseException) -> str:
    """The `error` of a job whose process died under it, from the pool's WorkerLostError (whose text
    names the signal or exit code, e.g. "Worker exited prematurely: signal 9 (SIGKILL) Job: 3.")."""
    signal = re.search(r"signal (\d+)", str(lost))
    exitcode = re.search(r"exitcode (-?\d+)", str(lost))
    if signal is not None and signal.group(1) == "9":  # what the kernel's OOM killer sends
        what = "was killed (signal 9: out of memory? a smaller batch size or model needs less)"
    elif signal is not None:
        what = f"was killed (signal {signal.group(1)})"
    elif exitcode is not None:
        what = f"ended abruptly (exit code {exitcode.group(1)})"
    else:
        what = "ended abruptly"
    return (
        f"the job's process {what}; the job was failed, what it released stays charged and the rest of its "
        "budget was refunded"
    )


@task_failure.connect
def _fail_killed_job(sender: Any = None, exception: BaseException | None = None, **info: Any) -> None:
    """In the worker's main process: a run_job whose job process died (WorkerLostError: killed by the
    kernel, or any signal) fails its job now, by the path every job end takes (control.jobs.end: charges
    kept, the reservation closed), instead of leaving it `running` until its heartbeat goes stale. Only a
    job still `running` is failed (one that ended meanwhile keeps its status). A cold shutdown of the
    worker (which kills its job processes itself) fails nothing: the reaper does, on the stale heartbeat;
    so does a database that cannot be reached now."""
    if getattr(sender, "name", None) != RUN_JOB_TASK or not isinstance(exception, WorkerLostError):
        return
    if worker_state.should_terminate:
        return
    args = info.get("args") or ()
    job_id = str(args[0]) if args else str(info.get("task_id"))
    message = killed_message(exception)
    try:
        with control_engine().begin() as conn:
            failed = end_job(conn, job_id, "failed", only_if=jobs.c.status == "running", error=message)
    except Exception:
        log.exception("job %s: its process died; failing it failed (the reaper will)", job_id)
        return
    if failed:
        log.warning("job %s failed: %s", job_id, message)


@lru_cache
def broker_queue() -> CeleryQueue:
    """This process's reader of the broker's queue: the reaper asks it whether a queued job's task is lost."""
    return CeleryQueue(get_settings())


def resend_job(job_id: str) -> None:
    """The reaper's way to send a job whose worker was lost back to the broker."""
    send_run_job(app, job_id)


@app.task(name=REAP_TASK, ignore_result=True)
def reap_jobs() -> list[str]:
    """Celery beat's periodic reaper pass (control.jobs.reaper)."""
    settings = get_settings()
    return reap(
        control_engine(),
        settings.heartbeat_timeout_seconds,
        settings.queued_timeout_seconds,
        broker_queue().holds,
        resend_job,
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
def _start_shard_sweeper(**_: object) -> None:
    """Every worker inside the wall, job worker and shard worker alike, removes abandoned shard requests and
    their partial sums (a coordinator that died or stalled: privacy_wall.shards.keep_swept) at its start
    and, with VIPS_SHARDS > 1, every SWEEP_SECONDS, from a daemon thread of its main process: a job process
    killed mid-release is swept by its own worker, a whole worker lost by any other; with none running, by
    the first to start. With VIPS_SHARDS = 1 once at start (what an earlier K > 1 left). Its engine has no
    pool: the job processes this process forks inherit no connection of it (privacy_wall.shards._SWEEPING
    keeps forks out of a sweep)."""
    every = SWEEP_SECONDS if get_settings().shards > 1 else None
    engine = create_db_engine(get_wall_settings().sensitive_url(), poolclass=NullPool)
    threading.Thread(target=keep_swept, args=(engine, every), name="shard-sweeper", daemon=True).start()


@worker_ready.connect
def _start_reaper(**_: object) -> None:
    """Reap once at start-up (jobs of a worker that died before this one started), then periodically.
    Shard workers leave this to the job worker. In the embedded mode each worker also touches its alive
    file (control.settings.worker_alive_path) for as long as it lives."""
    settings = get_settings()
    shard = os.environ.get(SHARD_WORKER_ENV)
    if settings.embedded:
        path = settings.worker_alive_path(None if not shard else int(shard))
        threading.Thread(target=_report_alive, args=(path,), name="alive", daemon=True).start()
    if shard:
        return
    holds = broker_queue().holds
    timeouts = (settings.heartbeat_timeout_seconds, settings.queued_timeout_seconds)
    reap(control_engine(), *timeouts, holds, resend_job)
    start_reaper_thread(control_engine(), settings.reaper_interval_seconds, *timeouts, holds, resend_job)


def _report_alive(path: Path) -> None:
    """Embedded mode: touch the alive file (/readyz, the supervisor) for as long as this worker lives."""
    while True:
        try:
            path.touch()
        except OSError as exc:  # a full disk: not a reason to kill this thread (and so, the worker)
            log.warning("could not touch %s (%s)", path.name, type(exc).__name__)
        time.sleep(WORKER_ALIVE_SECONDS)
