"""Admitting a planned job: reserve its whole cost and insert the job row in one transaction, then send
the task by name. If the send fails, the reservation is refunded and the job marked failed: no budget
stays reserved for a job that will not run. An Idempotency-Key makes a repeated submission return the
first job, also when the repeats race it (a refusal or a conflict then replays the job that won)."""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, NamedTuple

from sqlalchemy import Connection, Engine, Row, and_, func, insert, select
from sqlalchemy.exc import IntegrityError

from control.budgets.quotas import check_quota
from control.errors import BudgetRefused, Conflict, QueueUnavailable, RateLimited, StorageFull
from control.jobs.end import end_job
from control.jobs.queue import JobQueue
from control.jobs.storage import check_storage_room
from control.planning.admission import Plan, job_options, refusal
from control.planning.schedules import rule_option_names
from control.schemas import JobCreate
from control.store.keys import Principal
from control.store.models import api_keys, jobs
from privacy_wall.accounting.accountants import configured_accountant
from privacy_wall.ledger import database as ledger_db
from privacy_wall.ledger.base import BudgetExceeded
from privacy_wall.sqlengine import reading
from service.routes.job_reads import get_job

log = logging.getLogger(__name__)


def _now() -> datetime:
    return datetime.now(UTC)


def previous_submission(engine: Engine, owner: Principal, key: str, spec: JobCreate) -> Row[Any] | None:
    """The job this key already submitted with that Idempotency-Key, if any (409 if its spec differs)."""
    with reading(engine) as conn:
        job = conn.execute(
            select(jobs).where(jobs.c.owner == owner.key_id, jobs.c.idempotency_key == key)
        ).one_or_none()
    if job is None:
        return None
    chosen = rule_option_names(spec.model, spec.algorithm)  # stored with the job when the rule chose them
    stored_options = {
        name: value for name, value in dict(job.options).items() if name in spec.options or name not in chosen
    }
    asked = {
        "dataset": spec.dataset,
        "model": spec.model,
        "algorithm": spec.algorithm,
        "epsilon_target": spec.epsilon,
        "options": dict(spec.options),
    }
    if spec.iterations is not None:  # omitted: the automatic schedule chose it
        asked["iterations"] = spec.iterations
    if spec.batch_size is not None:
        asked["batch_size"] = spec.batch_size
    if spec.sigma is not None:
        asked["sigma"] = spec.sigma
    found = {**{name: getattr(job, name) for name in asked}, "options": stored_options}
    differs = [name for name, value in asked.items() if found[name] != value]
    if differs:
        raise Conflict(
            f"Idempotency-Key {key!r} was used for job {job.id} with another {', '.join(differs)}; "
            "use a new key for a new job"
        )
    return job


_turns: dict[tuple[str, str], tuple[threading.Lock, int]] = {}
_turns_lock = threading.Lock()


@contextmanager
def idempotency_turn(key_id: str, idempotency_key: str, wait_seconds: float) -> Iterator[None]:
    """Let one submission per (key, Idempotency-Key) through at a time in this process.

    Repeats racing the first wait for it (at most `wait_seconds`) and then find its job, so they replay
    it without pricing again or spending the key's pricing rate; across processes the database decides
    (`submit_job`). Locks are kept only while a submission holds or awaits them.
    """
    name = (key_id, idempotency_key)
    with _turns_lock:
        lock, users = _turns.get(name, (threading.Lock(), 0))
        _turns[name] = (lock, users + 1)
    held = lock.acquire(timeout=wait_seconds)
    try:
        yield
    finally:
        if held:
            lock.release()
        with _turns_lock:
            lock, users = _turns[name]
            if users == 1:
                del _turns[name]
            else:
                _turns[name] = (lock, users - 1)


class Submitted(NamedTuple):
    job: Row[Any]
    #: True: the job an earlier submission with the same Idempotency-Key created (nothing was reserved).
    replayed: bool


def submit_job(
    engine: Engine,
    queue: JobQueue,
    owner: Principal,
    spec: JobCreate,
    plan: Plan,
    idempotency_key: str | None = None,
    max_queued: int | None = None,
    max_key_stored_mb: float | None = None,
) -> Submitted:
    """Reserve and insert (one transaction), queue; returns the job row. Raises BudgetRefused (the
    dataset's budget or the key's quota on it, both checked under the dataset's lock), QueueUnavailable.

    With an idempotency key, a concurrent submission with the same key that committed first wins: this
    one's reservation is rolled back with its row and the winner's job returned, also when the winner's
    reservation left no room for this one, so one key is never two charged jobs nor a refusal.
    A key with `max_queued` jobs queued already is refused (RateLimited, 429) before anything is reserved,
    as is a job whose estimated outputs would take the key's stored bytes past `max_key_stored_mb`
    (StorageFull, 409; control.jobs.storage); both are counted under a lock of the key's row, so concurrent
    submissions never exceed them.
    """
    if idempotency_key is not None:  # the route looked before pricing; a racer may have won meanwhile
        previous = previous_submission(engine, owner, idempotency_key, spec)
        if previous is not None:
            return Submitted(previous, True)
    job_id = uuid.uuid4().hex
    try:
        with engine.begin() as conn:
            conn.execute(select(api_keys.c.id).where(api_keys.c.id == owner.key_id).with_for_update())
            if max_queued is not None:
                _check_queue_room(conn, owner, max_queued)
            if max_key_stored_mb is not None:
                check_storage_room(conn, owner.key_id, plan.resources.stored_bytes, max_key_stored_mb)
            # The reservation and the row commit together: a racer refused by this reservation, or whose
            # row conflicts with this one, finds this job when it looks again.
            budget = ledger_db.reserve_within(conn, plan.dataset, job_id, plan.event, plan.iterations)
            # Still under the budget row's lock, and before this job's row exists: the key's quota.
            job_cost = configured_accountant().cost(plan.event).scaled(plan.iterations)
            check_quota(conn, plan.dataset, owner.key_id, job_cost, budget.delta)
            conn.execute(
                insert(jobs).values(
                    id=job_id,
                    dataset=plan.dataset,
                    owner=owner.key_id,
                    model=spec.model,
                    algorithm=spec.algorithm,
                    options=job_options(spec, plan.schedule),
                    iterations=plan.iterations,
                    batch_size=plan.batch_size,
                    sigma=plan.sigma,
                    epsilon_target=spec.epsilon,
                    epsilon_job=plan.epsilon_job,
                    delta=plan.delta,
                    status="queued",
                    iteration=0,
                    cancel_requested=False,
                    created_at=_now(),
                    idempotency_key=idempotency_key,
                    stored_bytes=plan.resources.stored_bytes,
                )
            )
    except BudgetExceeded as exc:
        winner = _winner(engine, owner, idempotency_key, spec)
        if winner is not None:
            return Submitted(winner, True)
        raise BudgetRefused(refusal(engine, exc, plan, plan.iterations, owner.key_id)) from None
    except ledger_db.UnknownDataset:
        raise Conflict(f"the custodian has not set a budget for dataset {plan.dataset}") from None
    except (RateLimited, StorageFull):  # counted with a racing winner's job: replay it if there is one
        winner = _winner(engine, owner, idempotency_key, spec)
        if winner is None:
            raise
        return Submitted(winner, True)
    except IntegrityError:
        winner = _winner(engine, owner, idempotency_key, spec)
        if winner is None:
            raise
        return Submitted(winner, True)
    try:
        queue.send_run_job(job_id)
    except Exception:
        log.exception("could not queue job %s", job_id)
        if _fail_unsent(engine, job_id):
            raise QueueUnavailable(
                f"the job queue is unavailable: job {job_id} was not queued and its budget reservation "
                "was refunded; try again later"
            ) from None
    job = get_job(engine, job_id)
    assert job is not None
    return Submitted(job, False)


#: What a 429 for a full per-key queue suggests waiting: about one short job's time.
QUEUE_FULL_RETRY_SECONDS = 30


def _check_queue_room(conn: Connection, owner: Principal, max_queued: int) -> None:
    """Raise RateLimited when this key already has `max_queued` queued jobs (the caller holds its row's
    lock)."""
    queued = conn.execute(
        select(func.count()).where(jobs.c.owner == owner.key_id, jobs.c.status == "queued")
    ).scalar_one()
    if queued >= max_queued:
        raise RateLimited(
            f"this key has {queued} jobs queued, the most a key may have (VIPS_MAX_QUEUED_PER_KEY = "
            f"{max_queued}); nothing was reserved; submit again once one has started, or cancel one",
            retry_after=QUEUE_FULL_RETRY_SECONDS,
        )


def _winner(engine: Engine, owner: Principal, key: str | None, spec: JobCreate) -> Row[Any] | None:
    """The job a concurrent submission with the same Idempotency-Key committed, if any."""
    return previous_submission(engine, owner, key, spec) if key is not None else None


def _fail_unsent(engine: Engine, job_id: str) -> bool:
    """Mark a job whose task could not be sent as failed and refund it, unless a worker already took it
    (a send can fail after the broker got the message). Returns whether the job was failed."""
    try:
        with engine.begin() as conn:
            return end_job(
                conn,
                job_id,
                "failed",
                only_if=and_(jobs.c.status == "queued", jobs.c.started_at.is_(None)),
                error="the job queue did not accept the job",
            )
    except Exception:
        ledger_db.refund(engine, job_id)  # the job was never sent: it must not hold budget
        raise
