"""Running one job: the VIPS loop over the gate, with every release stored under (job, t).

Order per iteration: the gate writes the charge (job, t, attempt) to the ledger, computes and noises;
then the release is stored in `releases` under (job, t) (its arrays as .npz, control.store.release_arrays) and
the job's progress is updated. A retried or resumed task replays stored releases through the M-step
without paying again. A release that cannot be stored (too large, refused by the database, out of memory)
is dropped and its charge withdrawn; if a crash loses a release after its charge, the retry charges a new
attempt: the ledger can only over-count. (A lost database is waited out in the task, which keeps the
computed release whose store it cut off and stores it on resumption, charged once: execute_job.) A
charge beyond the job's reservation (such a retry once the reservation is used up, a charge after the
reaper's refund) must fit the submitting key's quota as well as the dataset's budget; refused by either,
the job fails and its reservation is closed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any

import numpy as np
from sqlalchemy import Connection, Engine, and_, func, select, update
from sqlalchemy.exc import DataError, DBAPIError, IntegrityError

from control.budgets.quotas import QuotaExceeded, check_charge_quota
from control.jobs.end import end_job
from control.jobs.reaper import heartbeat_is_fresh
from control.store.job_status import TERMINAL
from control.store.models import api_keys, jobs, posteriors
from control.store.posteriors import store_posterior
from control.store.timestamps import aware
from privacy_wall.accounting.accountants import configured_accountant
from privacy_wall.data.dataset_cache import DatasetCache
from privacy_wall.data.db_store import DatabaseStore
from privacy_wall.gate import Gate, PrivacyError, Release
from privacy_wall.ledger import database as ledger_db
from privacy_wall.ledger.base import BudgetExceeded
from privacy_wall.ledger.schema import budgets, datasets
from privacy_wall.noise.mechanisms import GridError
from privacy_wall.shards import ShardedSums, ShardFailed, ShardsUnavailable
from privacy_wall.sqlengine import (
    Bind,
    autocommit_reads,
    reading,
    relaxed_connection,
)
from vips.models.registry import model_setup, public_schema_extra
from vips.posterior import Privacy, build_posterior, dumps_posterior
from vips.runner import LoopSettings, UnrunnableOptions, run_vips
from worker.stored_releases import (
    JobCancelled,
    JobNoLongerRunning,
    JobOverStorage,
    JobOverTime,
    Stage,
    StorageLimits,
    StoredReleases,
    database_lost,
    utc_now,
)

log = logging.getLogger(__name__)


class DatasetInconsistent(Exception):
    """The sensitive store and the catalogue disagree on the dataset's rows (an interrupted append): the
    job stops before its first charge; the message is for the job's readers."""


def over_time_message(limit_seconds: float, iteration: int) -> str:
    return (
        f"the job ran longer than this server allows ({limit_seconds:g} s, VIPS_MAX_JOB_SECONDS) and was "
        f"stopped before release {iteration}; what it released stays charged and the rest of its budget "
        "was refunded: submit fewer iterations, or ask the operator for a longer limit"
    )


#: Why a job failed, by the exception's type (first match), as users read it in the job's `error`.
_FAILURE_REASONS: tuple[tuple[type[BaseException] | tuple[type[BaseException], ...], str], ...] = (
    (DataError, "the database refused a value (out of range, or larger than it accepts)"),
    (IntegrityError, "the database refused a write that conflicts with what it holds"),
    (DBAPIError, "the database reported an error"),
    (QuotaExceeded, "the submitting key's privacy quota on the dataset has no room for the charge"),
    (BudgetExceeded, "the dataset's privacy budget has no room for the charge"),
    (PrivacyError, "the privacy wall refused the request"),
    (
        GridError,
        "exact noise has no grid for this sigma and this many numbers per release (sigma times the square "
        "root of the release's size is too large): a smaller sigma (its epsilon is near 0 already) or a "
        "smaller model",
    ),
    (MemoryError, "the worker ran out of memory (a smaller batch size needs less)"),
    (
        UnrunnableOptions,
        "the job's options cannot run: its first update, rehearsed on a public stand-in before any "
        "charge, failed or overflowed; nothing was spent",
    ),
    (
        ShardFailed,
        "a shard worker could not compute its part of a full pass (the shard worker's log says why)",
    ),
    (
        ShardsUnavailable,
        "shard workers did not answer in time (VIPS_SHARD_TIMEOUT_SECONDS): are they running?",
    ),
    ((ArithmeticError, np.linalg.LinAlgError), "a numerical error in the model's computation"),
)


def failure_message(job_id: str, stage: Stage, exc: BaseException) -> str:
    """The `error` a failed job stores, written for its readers (client keys included): what failed and
    where to look. Never the exception's text, which may quote SQL and the values it carried (released
    statistics); that goes to the worker's log only (execute_job)."""
    reason = next((text for kinds, text in _FAILURE_REASONS if isinstance(exc, kinds)), "an unexpected error")
    return (
        f"the job failed while {stage.doing}: {reason}; the worker's log has the details (job {job_id}), "
        "ask the service's operator"
    )


# Run once per iteration of every job: built once, with bound parameters.
#: How often a job's heartbeat, and a job waiting for its lost database, try the database again.
OUTAGE_POLL_SECONDS = 0.5


def _beat(control: Engine, job_id: str, run: int) -> bool:
    """Refresh the job's heartbeat; returns whether it is still running in this task's run (`run`: its
    `resumes` when claimed; the reaper sending the job again makes another task its runner)."""
    with control.begin() as conn:
        return bool(
            conn.execute(
                update(jobs)
                .where(jobs.c.id == job_id, jobs.c.status == "running", jobs.c.resumes == run)
                .values(heartbeat_at=utc_now())
            ).rowcount
        )


@contextmanager
def heartbeat(control: Engine, job_id: str, run: int, every_seconds: float) -> Iterator[None]:
    """Refresh the job's heartbeat in the background while it runs (long iterations included). After a
    failed beat (the database unreachable) it tries every OUTAGE_POLL_SECONDS, so the heartbeat is fresh
    again as soon as the database is back: an outage shorter than the heartbeat timeout (less one beat)
    never lets the reaper fail the job."""
    stop = threading.Event()

    def beat() -> None:
        wait = every_seconds
        while not stop.wait(wait):
            try:
                _beat(control, job_id, run)
                wait = every_seconds
            except DBAPIError as exc:  # an outage: beat again soon (a long one lets the reaper act)
                if not database_lost(exc):
                    raise
                if wait == every_seconds:
                    log.warning("job %s: heartbeat failed (database unavailable)", job_id)
                wait = min(every_seconds, OUTAGE_POLL_SECONDS)

    thread = threading.Thread(target=beat, name=f"heartbeat-{job_id}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


#: Waits before each retry of recording a job's end (seconds).
FINISH_RETRY_WAITS = (0.5, 1.0, 2.0, 4.0)


class DatabaseUnavailable(Exception):
    """A database was unreachable; `started` says whether the job had begun (then it resumes from its
    stored releases once its heartbeat is stale; nothing released is paid twice)."""

    def __init__(self, job_id: str, started: bool) -> None:
        where = "while it ran" if started else "before it started"
        super().__init__(f"job {job_id}: a database was unreachable {where}")
        self.started = started


#: In-task resumptions of a job after its database came back, before the task gives up (DatabaseUnavailable).
MAX_RESUMPTIONS = 10


def _store_posterior(control: Engine, job_id: str, document: dict[str, Any]) -> None:
    """Store the document's JSON text (vips.posterior.dumps_posterior) in chunks, in one transaction."""
    text = dumps_posterior(document)
    with control.begin() as conn:
        store_posterior(conn, job_id, text, utc_now())


def _has_posterior(control: Engine, job_id: str) -> bool:
    """Whether the job's posterior is stored (its insert committed though the answer was lost)."""
    with reading(control) as conn:
        return (
            conn.execute(select(posteriors.c.job_id).where(posteriors.c.job_id == job_id)).first() is not None
        )


def _wait_for_databases(
    control: Engine, sensitive: Engine, job_id: str, run: int, heartbeat_timeout: float
) -> bool:
    """Wait, up to the heartbeat timeout, for both databases to answer again: True once they do and the
    job is still running (its heartbeat refreshed: the job resumes in this task, before the reaper could
    see it stale); raises JobNoLongerRunning if someone ended it meanwhile (the reaper, for an outage
    longer than the timeout); False when they stay away (the task's retry takes over)."""
    give_up = time.monotonic() + heartbeat_timeout
    while time.monotonic() < give_up:
        time.sleep(OUTAGE_POLL_SECONDS)
        try:
            running = _beat(control, job_id, run)
            with sensitive.connect() as conn:
                conn.execute(select(1))
        except DBAPIError as exc:
            if not database_lost(exc):
                raise
            continue
        if not running:
            raise JobNoLongerRunning
        return True
    return False


def _finish(control: Engine, job_id: str, run: int, status: str, error: str | None = None) -> None:
    """Record the job's end and refund its unspent reservation, retried through a database blip; if the
    database stays away the job keeps its stale heartbeat and the reaper fails and refunds it. Never over
    a status someone else ended it with (the reaper), nor once the reaper gave the job to another run."""
    ours = and_(jobs.c.status.in_(("queued", "running")), jobs.c.resumes == run)
    for wait in (*FINISH_RETRY_WAITS, None):
        try:
            with control.begin() as conn:
                end_job(conn, job_id, status, only_if=ours, error=error)
            return
        except DBAPIError as exc:
            if wait is None or not database_lost(exc):
                raise
            log.warning("job %s: recording its end failed (database unavailable); retrying", job_id)
            time.sleep(wait)


def execute_job(
    job_id: str,
    control: Engine,
    sensitive: Engine,
    *,
    heartbeat_timeout: float = 60.0,
    max_running_per_key: int | None = None,
    max_job_seconds: float | None = None,
    limits: StorageLimits | None = None,
    cache: DatasetCache | None = None,
    shards: ShardedSums | None = None,
) -> str:
    """Run (or resume) a job to a terminal status and return it, or "deferred" (not started: its key
    already runs `max_running_per_key` jobs; the caller queues it again).

    A job that is running with a fresh heartbeat belongs to another worker and is left alone; one whose
    heartbeat went stale (its worker died, the broker redelivered the task) is resumed. A database lost
    while the job runs is waited for here (up to the heartbeat timeout, the heartbeat refreshed as soon
    as it is back: _wait_for_databases) and the job resumes from its stored releases in this call; one
    unreachable at the start, or for longer, raises DatabaseUnavailable (the task retries it later)
    instead of failing the job. A job
    still running `max_job_seconds` after it first started stops before its next release: failed, what
    it released stays charged, the rest of its reservation is refunded. With `shards`, full passes are
    summed by shard workers (privacy_wall.shards).
    """
    try:
        claimed = _claim(job_id, control, heartbeat_timeout, max_running_per_key)
    except DBAPIError as exc:
        if not database_lost(exc):
            raise
        raise DatabaseUnavailable(job_id, started=False) from exc
    if isinstance(claimed, str):
        return claimed
    job = claimed
    if job.cancel_requested:
        _finish(control, job_id, job.resumes, "cancelled")
        return "cancelled"
    stage = Stage()
    started = aware(job.started_at) or utc_now()
    deadline = started + timedelta(seconds=max_job_seconds) if max_job_seconds else None
    try:
        with heartbeat(control, job_id, job.resumes, heartbeat_timeout / 4):
            carried: dict[int, Release] = {}  # releases whose store an outage cut off (StoredReleases)
            for resumption in range(MAX_RESUMPTIONS + 1):
                try:
                    if resumption == 0 or not _has_posterior(control, job_id):
                        document = _run(
                            job, control, sensitive, stage, deadline, limits, cache, shards, carried
                        )
                        stage.doing = "storing the posterior"
                        _store_posterior(control, job_id, document)
                    break
                except Exception as exc:  # a lost database: wait for it here, then resume (or give up)
                    if not database_lost(exc) or resumption == MAX_RESUMPTIONS:
                        raise
                    log.warning("job %s: database unavailable while %s; waiting for it", job_id, stage.doing)
                    if not _wait_for_databases(control, sensitive, job_id, job.resumes, heartbeat_timeout):
                        raise
                    log.warning("job %s: the database is back; resuming from its stored releases", job_id)
    except JobCancelled:
        _finish(control, job_id, job.resumes, "cancelled")
        return "cancelled"
    except JobOverTime as over:
        _finish(
            control, job_id, job.resumes, "failed", over_time_message(max_job_seconds or 0.0, over.iteration)
        )
        return "failed"
    except (JobOverStorage, DatasetInconsistent) as over:
        _finish(control, job_id, job.resumes, "failed", str(over))
        return "failed"
    except JobNoLongerRunning:  # whoever ended it closed its reservation in the same transaction (end_job)
        with reading(control) as conn:
            return str(conn.execute(select(jobs.c.status).where(jobs.c.id == job_id)).scalar_one())
    except Exception as exc:
        if database_lost(exc):
            log.warning("job %s: database unavailable (%s); it resumes later", job_id, type(exc).__name__)
            raise DatabaseUnavailable(job_id, started=True) from exc
        # The job fails and its unspent reservation is refunded. The exception's type, text and traceback
        # go to this log only; the job's `error` is a message for its readers (failure_message).
        log.exception("job %s failed while %s", job_id, stage.doing)
        _finish(control, job_id, job.resumes, "failed", failure_message(job_id, stage, exc))
        return "failed"
    _finish(control, job_id, job.resumes, "succeeded")
    return "succeeded"


def _claim(job_id: str, control: Engine, heartbeat_timeout: float, max_running_per_key: int | None) -> Any:
    """Mark the job running and return its row, or the status to return without running it: "deferred"
    when it has not started and its key already runs `max_running_per_key` jobs (it then records, in
    heartbeat_at, that a worker holds its task, so the reaper knows the job is not lost)."""
    with control.begin() as conn:
        job = conn.execute(select(jobs).where(jobs.c.id == job_id).with_for_update()).one_or_none()
        if job is None:
            log.warning("job %s does not exist", job_id)
            return "missing"
        if job.status in TERMINAL:
            return str(job.status)
        if job.status == "running" and heartbeat_is_fresh(job, heartbeat_timeout):
            return "running"
        at_limit = (
            job.status == "queued"
            and max_running_per_key is not None
            and not job.cancel_requested
            and _running_of_key(conn, job.owner, heartbeat_timeout) >= max_running_per_key
        )
        if at_limit:
            conn.execute(update(jobs).where(jobs.c.id == job_id).values(heartbeat_at=utc_now()))
            return "deferred"
        conn.execute(
            update(jobs)
            .where(jobs.c.id == job_id, jobs.c.status.in_(("queued", "running")))
            .values(status="running", started_at=job.started_at or utc_now(), heartbeat_at=utc_now())
        )
    return job


def _running_of_key(conn: Connection, owner: str, heartbeat_timeout: float) -> int:
    """Jobs of this key running now (a fresh heartbeat), counted with the key's row locked, so two workers
    claiming two jobs of one key at once see each other (SQLite: BEGIN IMMEDIATE serialises them)."""
    conn.execute(select(api_keys.c.id).where(api_keys.c.id == owner).with_for_update())
    fresh = utc_now() - timedelta(seconds=heartbeat_timeout)
    return int(
        conn.execute(
            select(func.count()).where(
                jobs.c.owner == owner, jobs.c.status == "running", jobs.c.heartbeat_at > fresh
            )
        ).scalar_one()
    )


def _check_population(reads: Bind, dataset: str, stored: int) -> None:
    """Refuse (before any charge) a dataset whose stored population is not the catalogue's: the job's
    reservation and every charge are priced at the catalogue's N, and the rows past it are an append that
    did not finish."""
    with reading(reads) as conn:
        population = select(datasets.c.population).where(datasets.c.name == dataset)
        catalogued = conn.execute(population).scalar_one()
    if int(catalogued) != stored:
        raise DatasetInconsistent(
            f"dataset {dataset} is being changed (its stored rows and its catalogue entry disagree, as an "
            "append that did not finish leaves them): nothing was charged; finish or repeat the append "
            "(vips data ingest --append), then submit again"
        )


def _run(
    job: Any,
    control: Engine,
    sensitive: Engine,
    stage: Stage,
    deadline: datetime | None = None,
    limits: StorageLimits | None = None,
    cache: DatasetCache | None = None,
    shards: ShardedSums | None = None,
    carried: dict[int, Release] | None = None,
) -> dict[str, Any]:
    stage.doing = "setting up the model"
    options = dict(job.options)
    # The dataset's public schema: LDA's vocabulary (for the unigram fallback's prior), the features' names
    # (for BLR's intercept step) and the posterior's columns. It cannot change while the job holds its
    # reservation (an append needs none open).
    with reading(control) as conn:
        schema = conn.execute(select(datasets.c.schema).where(datasets.c.name == job.dataset)).scalar_one()
    public = schema if isinstance(schema, dict) else {}
    # The dataset's public vocabulary (bag of words) or feature names (tabular): each model's setup reads
    # what it uses.
    setup = model_setup(
        job.model,
        options,
        sigma=job.sigma,
        algorithm=job.algorithm,
        vocabulary=public.get("vocabulary"),
        columns=public.get("features"),
    )
    # One connection of each kind for the whole job: no pool checkout (and its ping) per iteration.
    with (
        control.connect() as reads,
        control.connect() as writes,
        relaxed_connection(control) as relaxed,
        sensitive.connect() as rows,
    ):
        stage.doing = "opening the dataset"
        store = DatabaseStore(autocommit_reads(rows), job.dataset, cache)
        _check_population(autocommit_reads(reads), job.dataset, store.info.population)
        gate = Gate(
            store,
            ledger_db.SqlLedger(writes, check_charge_quota),
            shards=shards,
            shard_minibatches=shards is not None and not store.fits_cache(),
        )
        settings = LoopSettings(
            job.iterations, job.batch_size, job.sigma, options.get("tau0", 0.0), options.get("kappa", 1.0)
        )
        stage.doing = "rehearsing the first update on a public stand-in"
        result = run_vips(
            StoredReleases(
                gate, autocommit_reads(reads), relaxed, job.id, stage, deadline, limits, carried, job.resumes
            ),
            setup.query,
            setup.model,
            settings,
            job_id=job.id,
            dimension=store.info.dimension,
            population=store.info.population,
        )
    stage.doing = "building the posterior"
    with reading(control) as conn:
        delta = conn.execute(select(budgets.c.delta).where(budgets.c.dataset == job.dataset)).scalar_one()
    return build_posterior(
        model=job.model,
        algorithm=job.algorithm,
        dataset=job.dataset,
        job_id=job.id,
        privacy=Privacy(
            epsilon=ledger_db.job_epsilon_spent(control, job.id, delta),
            delta=delta,
            sigma=job.sigma,
            iterations=job.iterations,
            batch_size=job.batch_size,
            population=store.info.population,
            accountant=configured_accountant().version,
        ),
        parameters=setup.model.posterior(result.state),
        extra=public_schema_extra(job.model, schema),
    )
