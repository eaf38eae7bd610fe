"""A job's releases as the VIPS loop sees them (StoredReleases): each (job, t) is stored once in
`releases` with the job's progress, a stored release is reused instead of charged again, and a job stops
between iterations when it is cancelled, over its time or over its storage; what a running job is doing
(Stage), for the message of a failure. worker.jobs runs the job around it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import bindparam, func, insert, select, update
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError

from control.jobs.storage import human_bytes
from control.store.models import jobs, releases
from control.store.release_arrays import decode_arrays, encode_arrays, stored_bound
from privacy_wall.gate import Gate, Release
from privacy_wall.ledger.schema import charges
from privacy_wall.queries.base import Array, Query
from privacy_wall.sqlengine import (
    Bind,
    reading,
    run_writes,
    transaction,
)

log = logging.getLogger(__name__)

#: Errors of an unreachable or lost database (control or sensitive): the job is resumed later, not failed.
DATABASE_ERRORS = (OperationalError, InterfaceError)


def database_lost(exc: BaseException) -> bool:
    """A DATABASE_ERRORS error, or any driver error after which SQLAlchemy dropped the connection as dead
    (PostgreSQL ending a transaction left idle past its timeout raises InternalError so)."""
    return isinstance(exc, DATABASE_ERRORS) or (isinstance(exc, DBAPIError) and exc.connection_invalidated)


def utc_now() -> datetime:
    return datetime.now(UTC)


class JobCancelled(Exception):
    """The analyst cancelled the job between iterations."""


class JobOverTime(Exception):
    """The job reached the server's wall-time limit before computing release `iteration`."""

    def __init__(self, iteration: int) -> None:
        super().__init__(f"over time before release {iteration}")
        self.iteration = iteration


class JobOverStorage(Exception):
    """The job's releases reached a storage bound (VIPS_MAX_RELEASE_MB, VIPS_MAX_JOB_STORED_MB); the
    message is for the job's readers."""


@dataclass(frozen=True)
class StorageLimits:
    """What one job may store: each release, and all its releases together (bytes of their .npz)."""

    release_bytes: int
    stored_bytes: int


class JobNoLongerRunning(Exception):
    """Someone else ended the job (the reaper failed it while this worker was cut off): stop charging."""


class Stage:
    """What a running job is doing, named in the error a failure stores (failure_message)."""

    def __init__(self) -> None:
        self.doing = "starting"


_STORE_RELEASE = insert(releases).values(
    job_id=bindparam("p_job_id"),
    iteration=bindparam("p_iteration"),
    arrays=bindparam("p_arrays", type_=releases.c.arrays.type),
    stored_bytes=bindparam("p_stored_bytes"),
    noise_std=bindparam("p_noise_std", type_=releases.c.noise_std.type),
    created_at=bindparam("p_now", type_=releases.c.created_at.type),
)
_RECORD_PROGRESS = (
    update(jobs)
    .where(
        jobs.c.id == bindparam("p_job_id"), jobs.c.status == "running", jobs.c.resumes == bindparam("p_run")
    )
    .values(
        iteration=bindparam("p_iteration"), heartbeat_at=bindparam("p_now", type_=jobs.c.heartbeat_at.type)
    )
    .returning(jobs.c.cancel_requested)
)


class StoredReleases:
    """The Releaser the loop sees: stored releases of (job, t) are reused, new ones go through the gate.

    A job holds its control-database connections for all its iterations: `reads` (autocommit on
    PostgreSQL: one round trip per read) and `relaxed`, whose writes commit without waiting for their
    WAL flush. That is safe for stored releases alone: a release lost in a database crash is paid again
    by the retry, because its charge was committed durably (on the gate's ledger connection) before the
    gate computed it; WAL losses are a suffix, so a lost release never outlives its charge.

    Round trips: what a resumed job already has (its stored iterations, the attempts charged per
    iteration, the cancel flag) is read once; afterwards each iteration's store returns the cancel flag,
    so a cancel that arrives during iteration t stops the job before iteration t + 1 is charged.
    """

    def __init__(
        self,
        gate: Gate,
        reads: Bind,
        relaxed: Bind,
        job_id: str,
        stage: Stage,
        deadline: datetime | None = None,
        limits: StorageLimits | None = None,
        carried: dict[int, Release] | None = None,
        run: int = 0,
    ) -> None:
        self._gate = gate
        self._run = run  # the job's `resumes` when this task claimed it: its progress counts while it holds
        # Releases charged and computed whose store was cut off by a lost database (execute_job resumes
        # the job in the same task once it is back): stored on resumption instead of charged again.
        self._carried = {} if carried is None else carried
        self._deadline = deadline  # no new release after it (JobOverTime)
        self._limits = limits
        self._stage = stage  # what the job is doing, for the message of a failure
        self._reads = reads
        self._relaxed = relaxed
        self._job_id = job_id
        self._stopped = False
        with reading(reads) as conn:
            self._cancel = bool(
                conn.execute(select(jobs.c.cancel_requested).where(jobs.c.id == job_id)).scalar_one()
            )
            sizes = dict(
                conn.execute(
                    select(releases.c.iteration, releases.c.stored_bytes).where(releases.c.job_id == job_id)
                ).all()
            )
            self._stored = set(sizes)
            self._stored_bytes = sum(sizes.values())  # the job's releases so far
            self._release_bytes = max(sizes.values(), default=0)  # the largest: the next one's forecast
            self._attempts: dict[int, int] = {
                int(t): int(n)
                for t, n in conn.execute(
                    select(charges.c.iteration, func.count())
                    .where(charges.c.job_id == job_id)
                    .group_by(charges.c.iteration)
                )
            }

    def _replay(self, iteration: int, sigma: float, batch_size: int) -> Release:
        with reading(self._reads) as conn:
            stored = conn.execute(
                select(releases.c.arrays, releases.c.noise_std).where(
                    releases.c.job_id == self._job_id, releases.c.iteration == iteration
                )
            ).one()
        return Release(
            job_id=self._job_id,
            iteration=iteration,
            statistics=decode_arrays(stored.arrays),
            noise_std=dict(stored.noise_std),
            sigma=sigma,
            batch_size=batch_size,
            population=self._gate.population,
        )

    def release(
        self,
        query: Query,
        params: dict[str, Array],
        *,
        job_id: str,
        iteration: int,
        sigma: float,
        batch_size: int,
    ) -> Release:
        if job_id != self._job_id:
            raise ValueError("this releaser serves one job")
        if iteration in self._stored:
            self._carried.pop(iteration, None)  # its store committed after all (only its answer was lost)
            self._stage.doing = f"reading stored release {iteration}"
            stored = self._replay(iteration, sigma, batch_size)
            self._stage.doing = f"updating the model with release {iteration}"
            return stored
        # Paid for before an outage cut its store off, computed from the same state: stored, not paid again.
        release = self._carried.pop(iteration, None)
        if release is None:
            release = self._new_release(
                query, params, iteration=iteration, sigma=sigma, batch_size=batch_size
            )
        self._stage.doing = f"storing release {iteration}"
        try:
            self._keep(release)
        except (JobOverStorage, DBAPIError) as exc:
            # Refused before its INSERT (above the release limit, judged from its shapes) or by it (the
            # database rejected the statement): not stored, never shown, and the refusal does not depend on
            # the values, so its charge goes too. A lost database may have committed the row all the same,
            # and any other failure (out of memory) may come after the commit: those keep the charge.
            if not database_lost(exc) and not self._is_stored(iteration):
                self._gate.withdraw(release)
            raise
        self._stage.doing = f"updating the model with release {iteration}"
        return release

    def _new_release(
        self, query: Query, params: dict[str, Array], *, iteration: int, sigma: float, batch_size: int
    ) -> Release:
        """Charge and compute release `iteration` through the gate, unless the job must stop first."""
        if self._cancel:
            raise JobCancelled
        if self._stopped:
            raise JobNoLongerRunning
        if self._deadline is not None and utc_now() >= self._deadline:
            raise JobOverTime(iteration)
        limits = self._limits
        if limits is not None and self._stored_bytes + self._release_bytes > limits.stored_bytes:
            raise JobOverStorage(
                f"the job's releases reached what this server stores for one job "
                f"({human_bytes(limits.stored_bytes)}, VIPS_MAX_JOB_STORED_MB) before release {iteration}; "
                "what it released stays charged and the rest of its budget was refunded: submit fewer "
                "iterations or a smaller model, or ask the operator for a larger limit"
            )
        self._stage.doing = f"computing release {iteration}"
        release = self._gate.release(
            query,
            params,
            job_id=self._job_id,
            iteration=iteration,
            sigma=sigma,
            batch_size=batch_size,
            attempt=self._attempts.get(iteration, 0),
        )
        self._attempts[iteration] = self._attempts.get(iteration, 0) + 1
        return release

    def _keep(self, release: Release) -> None:
        """Store the release; one whose store a lost database cut off is carried to the job's resumption."""
        try:
            running = self._store(release)
        except DBAPIError as exc:
            if database_lost(exc):
                self._carried[release.iteration] = release
            raise
        if running is None:
            self._stopped = True
        else:
            self._cancel = bool(running)
        self._stored.add(release.iteration)

    def _is_stored(self, iteration: int) -> bool:
        """Whether release `iteration` is in the database (True when that cannot be read)."""
        try:
            with reading(self._reads) as conn:
                found = conn.execute(
                    select(releases.c.iteration).where(
                        releases.c.job_id == self._job_id, releases.c.iteration == iteration
                    )
                ).first()
        except DBAPIError:
            return True
        return found is not None

    def _store(self, release: Release) -> bool | None:
        """Store `release` and the job's progress in one transaction; returns the job's cancel flag, None
        when the job is no longer running. Raises JobOverStorage, storing nothing, for a release whose
        shapes could take more than the limit (a bound from its shapes, not its values)."""
        limits = self._limits
        bound = stored_bound(release.statistics)
        if limits is not None and bound > limits.release_bytes:
            raise JobOverStorage(
                f"release {release.iteration} could take {human_bytes(bound)}, more than this server "
                f"stores for one release ({human_bytes(limits.release_bytes)}, VIPS_MAX_RELEASE_MB); it "
                "was neither stored nor charged and the rest of the job's budget was refunded: use a "
                "smaller model, or ask the operator for a larger limit"
            )
        blob = encode_arrays(release.statistics)
        with transaction(self._relaxed) as conn:
            progress = run_writes(
                conn,
                _STORE_RELEASE,
                _RECORD_PROGRESS,
                parameters={
                    "p_job_id": release.job_id,
                    "p_run": self._run,
                    "p_iteration": release.iteration,
                    "p_arrays": blob,
                    "p_stored_bytes": len(blob),
                    "p_noise_std": release.noise_std,
                    "p_now": utc_now(),
                },
            )
            running = progress.scalar_one_or_none()
        self._stored_bytes += len(blob)
        self._release_bytes = max(self._release_bytes, len(blob))
        return None if running is None else bool(running)
