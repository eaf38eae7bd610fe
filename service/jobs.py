"""Job submission and the job's life seen from the API: spec checks, admission, queueing, cancel, reads.

Admission order (docs/design.md section 3): check the spec against the dataset's public metadata, choose sigma
(given, or calibrated to the job's own target epsilon at the dataset's delta), reserve the job's whole
RDP curve atomically, insert the job row, then send the task by name. If the insert or the send fails,
the reservation is refunded and the job marked failed: no budget stays reserved for a job that will not
run. Errors are domain exceptions that service.app turns into HTTP answers; none carries data values.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import uuid
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Engine, Row, Select, and_, func, insert, select, update
from sqlalchemy.exc import IntegrityError

from privacy_wall import ledger_db
from privacy_wall.accounting import (
    CalibrationError,
    PrivacyCost,
    SubsampledGaussianEvent,
    calibrate_sigma,
    configured_accountant,
    event_from_dict,
)
from privacy_wall.accounting import epsilon as job_epsilon
from privacy_wall.control_schema import charges, datasets, reservations
from privacy_wall.ledger import BudgetExceeded
from privacy_wall.sqlengine import reading
from service.auth import sees_job
from service.job_end import end_job
from service.keys import Principal
from service.models import jobs, posteriors, releases
from service.options import MODEL_KINDS, algorithm_problem, option_problem, schedule_problem
from service.queue import JobQueue
from service.schemas import BudgetRefusal, JobCreate, JobPublic, JobQuote, ReleasePublic
from service.settings import ServiceSettings
from service.timestamps import aware

log = logging.getLogger(__name__)

#: The delta of the budget row created on a public dataset's first use (no epsilon cap).
PUBLIC_DEFAULT_DELTA = 1e-5

Loc = tuple[str | int, ...]


# ---- errors -------------------------------------------------------------------------------------------


class ServiceError(Exception):
    """An error with an HTTP status and a message that carries no data values."""

    status_code = 500

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


class NotFound(ServiceError):
    status_code = 404


class Conflict(ServiceError):
    status_code = 409


class QueueUnavailable(ServiceError):
    status_code = 503


class AccountantBusy(ServiceError):
    """Every pricing slot stayed taken for the whole wait: 503, nothing was reserved."""

    status_code = 503


_pricing_slots: dict[int, threading.BoundedSemaphore] = {}
_pricing_lock = threading.Lock()


@contextmanager
def pricing_slot(settings: ServiceSettings) -> Iterator[None]:
    """Hold one of the process's `settings.pricing_slots` accountant slots (bounded waiting).

    Routes run in the request thread pool; this keeps accountant work (milliseconds with the default
    accountant, seconds with `paper`) from ever taking more than a few of its threads, so reads and
    other submissions go on while quotes are priced.
    """
    with _pricing_lock:
        slots = _pricing_slots.setdefault(
            settings.pricing_slots, threading.BoundedSemaphore(settings.pricing_slots)
        )
    if not slots.acquire(timeout=settings.pricing_wait_seconds):
        raise AccountantBusy(
            "the accountant is busy pricing other jobs; nothing was reserved; try again shortly"
        )
    try:
        yield
    finally:
        slots.release()


class BudgetRefused(Conflict):
    """The ledger cannot admit the job; carries the numbers of the 409 body."""

    def __init__(self, refusal: BudgetRefusal) -> None:
        super().__init__(refusal.detail)
        self.refusal = refusal


class SpecError(ValueError):
    """A job spec that is well-typed but invalid for its dataset or the server: 422 naming the fields."""

    def __init__(self, errors: Sequence[tuple[Loc, str]]) -> None:
        super().__init__("; ".join(f"{'.'.join(map(str, loc))}: {msg}" for loc, msg in errors))
        self.errors = list(errors)


# ---- options --------------------------------------------------------------------------------------------


def option_errors(model: str, algorithm: str, options: dict[str, float]) -> list[tuple[Loc, str]]:
    errors: list[tuple[Loc, str]] = []
    for name, value in options.items():
        problem = option_problem(model, name, value, algorithm)
        if problem is not None:
            errors.append((("options", name), problem))
    return errors


# ---- helpers --------------------------------------------------------------------------------------------


def _now() -> datetime:
    return datetime.now(UTC)


def finite(value: float | None) -> float | None:
    """JSON has no infinity: an unbounded epsilon (sigma 0) is reported as null."""
    return value if value is not None and math.isfinite(value) else None


def load_dataset(engine: Engine, name: str) -> Row[Any] | None:
    with reading(engine) as conn:
        return conn.execute(select(datasets).where(datasets.c.name == name)).one_or_none()


def budget_or_none(engine: Engine, name: str) -> ledger_db.BudgetStatus | None:
    try:
        return ledger_db.budget_status(engine, name)
    except ledger_db.UnknownDataset:
        return None


def ensure_budget(engine: Engine, dataset: Row[Any]) -> ledger_db.BudgetStatus:
    """The dataset's budget; a public dataset gets an uncapped one on first use; a private one needs one."""
    status = budget_or_none(engine, dataset.name)
    if status is not None:
        return status
    if not dataset.public:
        raise Conflict(f"the custodian has not set a budget for dataset {dataset.name}")
    try:
        return ledger_db.set_budget(engine, dataset.name, None, PUBLIC_DEFAULT_DELTA)
    except IntegrityError:  # a concurrent first use created it
        return ledger_db.budget_status(engine, dataset.name)


# ---- submission -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """A checked spec with everything admission needs."""

    dataset: str
    batch_size: int
    population: int
    sigma: float
    delta: float
    epsilon_job: float | None

    @property
    def event(self) -> SubsampledGaussianEvent:
        return SubsampledGaussianEvent(self.sigma, self.batch_size, self.population)


def check_spec(spec: JobCreate, dataset: Row[Any], settings: ServiceSettings) -> int:
    """Raise SpecError naming every bad field; return the batch size (default N)."""
    errors: list[tuple[Loc, str]] = []
    if spec.iterations > settings.max_iterations:
        errors.append((("iterations",), f"must be <= {settings.max_iterations} (the server's maximum)"))
    kind = MODEL_KINDS[spec.model]
    if dataset.kind != kind:
        errors.append(
            (("model",), f"model {spec.model} needs a {kind} dataset; {dataset.name} is {dataset.kind}")
        )
    batch_size = spec.batch_size if spec.batch_size is not None else int(dataset.population)
    if batch_size > dataset.population:
        errors.append(
            (("batch_size",), f"must be <= the population of {dataset.name} (N = {dataset.population})")
        )
    if spec.sigma is None and spec.epsilon is None:
        errors.append((("sigma",), "give exactly one of sigma (noise multiplier) or epsilon (target)"))
    elif spec.sigma is not None and spec.epsilon is not None:
        errors.append((("epsilon",), "give exactly one of sigma or epsilon, not both"))
    elif spec.sigma == 0 and not dataset.public:
        errors.append(
            (("sigma",), f"sigma 0 (no noise) is allowed only on public datasets; {dataset.name} is private")
        )
    pairing = algorithm_problem(spec.model, spec.algorithm)
    if pairing is not None:
        errors.append((("algorithm",), pairing))
    else:
        errors.extend(option_errors(spec.model, spec.algorithm, spec.options))
    if errors:
        raise SpecError(errors)
    return batch_size


def plan_job(engine: Engine, spec: JobCreate, dataset: Row[Any], settings: ServiceSettings) -> Plan:
    """Check the spec, find the budget (409 without one) and choose sigma."""
    batch_size = check_spec(spec, dataset, settings)
    budget = ensure_budget(engine, dataset)
    population = int(dataset.population)
    with pricing_slot(settings):  # the accountant's cost is cached for the reservation that follows
        if spec.epsilon is not None:
            try:
                sigma = calibrate_sigma(spec.epsilon, batch_size, population, spec.iterations, budget.delta)
            except CalibrationError as exc:
                raise SpecError([(("epsilon",), str(exc))]) from None
        else:
            assert spec.sigma is not None
            sigma = spec.sigma
        conflict = schedule_problem(spec.model, spec.options, sigma)
        if conflict is not None:
            raise SpecError([(("options", conflict[0]), conflict[1])])
        eps = job_epsilon(sigma, batch_size, population, spec.iterations, budget.delta) if sigma > 0 else None
    return Plan(dataset.name, batch_size, population, sigma, budget.delta, finite(eps))


def quote_job(engine: Engine, spec: JobCreate, plan: Plan) -> JobQuote:
    """The dry run: the job's cost and the dataset's budget after it; reserves nothing."""
    quote = ledger_db.quote(engine, plan.dataset, plan.event, spec.iterations)
    return JobQuote(
        dataset=plan.dataset,
        iterations=spec.iterations,
        batch_size=plan.batch_size,
        sigma=plan.sigma,
        delta=plan.delta,
        epsilon_job=plan.epsilon_job,
        epsilon_spent=quote.status.epsilon_spent,
        epsilon_reserved=quote.status.epsilon_reserved,
        epsilon_after=finite(quote.epsilon_after),
        epsilon_budget=quote.status.epsilon_budget,
        epsilon_remaining=quote.status.epsilon_remaining,
        admissible=quote.admissible,
        largest_epsilon=quote.largest_epsilon,
    )


def _refusal(engine: Engine, exc: BudgetExceeded, plan: Plan, iterations: int) -> BudgetRefusal:
    """The 409 body: what is spent or reserved, what is left, and the largest epsilon that would fit."""
    remaining = max(exc.budget - exc.spent, 0.0)
    try:
        largest = ledger_db.largest_epsilon(
            engine, plan.dataset, plan.batch_size, plan.population, iterations
        )
    except ledger_db.UnknownDataset:
        largest = None
    fits = (
        f"; a job of this schedule could have at most epsilon {largest:.4g} (submit it as epsilon)"
        if largest is not None
        else "; no job of this schedule fits"
    )
    return BudgetRefusal(
        detail=f"{exc}; epsilon remaining {remaining:.4g}{fits}",
        epsilon_spent_or_reserved=exc.spent,
        epsilon_requested_total=finite(exc.requested),
        epsilon_budget=exc.budget,
        epsilon_remaining=remaining,
        largest_epsilon=largest,
    )


def previous_submission(engine: Engine, owner: Principal, key: str, spec: JobCreate) -> Row[Any] | None:
    """The job this key already submitted with that Idempotency-Key, if any (409 if its spec differs)."""
    with reading(engine) as conn:
        job = conn.execute(
            select(jobs).where(jobs.c.owner == owner.key_id, jobs.c.idempotency_key == key)
        ).one_or_none()
    if job is None:
        return None
    asked = {
        "dataset": spec.dataset,
        "model": spec.model,
        "algorithm": spec.algorithm,
        "iterations": spec.iterations,
        "epsilon_target": spec.epsilon,
        "options": dict(spec.options),
    }
    if spec.batch_size is not None:
        asked["batch_size"] = spec.batch_size
    if spec.sigma is not None:
        asked["sigma"] = spec.sigma
    differs = [name for name, value in asked.items() if getattr(job, name) != value]
    if differs:
        raise Conflict(
            f"Idempotency-Key {key!r} was used for job {job.id} with another {', '.join(differs)}; "
            "use a new key for a new job"
        )
    return job


def submit_job(
    engine: Engine,
    queue: JobQueue,
    owner: Principal,
    spec: JobCreate,
    plan: Plan,
    idempotency_key: str | None = None,
) -> Row[Any]:
    """Reserve, insert, queue; returns the job row. Raises BudgetRefused, QueueUnavailable.

    With an idempotency key, a concurrent submission that inserted first wins: this one's reservation
    is refunded and the winner's job returned, so one key is never two charged jobs.
    """
    job_id = uuid.uuid4().hex
    try:
        ledger_db.reserve(engine, plan.dataset, job_id, plan.event, spec.iterations)
    except BudgetExceeded as exc:
        raise BudgetRefused(_refusal(engine, exc, plan, spec.iterations)) from None
    except ledger_db.UnknownDataset:
        raise Conflict(f"the custodian has not set a budget for dataset {plan.dataset}") from None
    try:
        with engine.begin() as conn:
            conn.execute(
                insert(jobs).values(
                    id=job_id,
                    dataset=plan.dataset,
                    owner=owner.key_id,
                    model=spec.model,
                    algorithm=spec.algorithm,
                    options=dict(spec.options),
                    iterations=spec.iterations,
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
                )
            )
    except IntegrityError:
        ledger_db.refund(engine, job_id)
        winner = previous_submission(engine, owner, idempotency_key, spec) if idempotency_key else None
        if winner is None:
            raise
        return winner
    except BaseException:
        ledger_db.refund(engine, job_id)
        raise
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
    return job


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


# ---- reading and cancelling -----------------------------------------------------------------------------


def get_job(engine: Engine, job_id: str) -> Row[Any] | None:
    with reading(engine) as conn:
        return conn.execute(select(jobs).where(jobs.c.id == job_id)).one_or_none()


#: The shortest job id prefix resolved to a job (`vips job 1f3a9c0e`).
MIN_ID_PREFIX = 8


def visible_job(engine: Engine, principal: Principal, job_id: str) -> Row[Any]:
    """The job if this key may read it, by its id or by a prefix of at least MIN_ID_PREFIX characters
    that starts exactly one job this key may read (409 naming them if several); otherwise 404, as if it
    did not exist."""
    job = _readable(engine, principal, get_job(engine, job_id))
    if job is None and len(job_id) >= MIN_ID_PREFIX:
        job = _by_prefix(engine, principal, job_id)
    if job is None:
        short = len(job_id) < MIN_ID_PREFIX
        hint = f" (a shortened id needs at least {MIN_ID_PREFIX} characters)" if short else ""
        raise NotFound(f"job {job_id} not found{hint}")
    return job


def _readable(engine: Engine, principal: Principal, job: Row[Any] | None) -> Row[Any] | None:
    dataset = load_dataset(engine, job.dataset) if job is not None and principal.role == "custodian" else None
    return job if job is not None and sees_job(principal, job, dataset) else None


#: How many candidate ids an ambiguous prefix's 409 names.
_AMBIGUOUS_SHOWN = 3


def _by_prefix(engine: Engine, principal: Principal, prefix: str) -> Row[Any] | None:
    query = _visible_to(principal, select(jobs.c.id))
    if query is None:
        return None
    query = query.where(jobs.c.id.startswith(prefix, autoescape=True)).order_by(jobs.c.id)
    with reading(engine) as conn:
        ids = list(conn.execute(query.limit(_AMBIGUOUS_SHOWN + 1)).scalars())
    if len(ids) > 1:
        shown = ", ".join(ids[:_AMBIGUOUS_SHOWN]) + (", ..." if len(ids) > _AMBIGUOUS_SHOWN else "")
        raise Conflict(f"job id prefix {prefix} is ambiguous: it starts {shown}; give more characters")
    return _readable(engine, principal, get_job(engine, ids[0])) if ids else None


def _visible_to(principal: Principal, query: Select[Any]) -> Select[Any] | None:
    """`query` over jobs restricted to the jobs this key may read (as auth.sees_job); None: none."""
    if principal.role == "analyst":
        return query.where(jobs.c.owner == principal.key_id)
    if principal.role == "client" and principal.dataset is not None:
        return query.where(jobs.c.dataset == principal.dataset)
    if principal.role == "custodian":  # the jobs on the datasets it owns (auth.owns_dataset)
        owned = select(datasets.c.name).where(
            (datasets.c.owner == principal.key_id) | (datasets.c.name == principal.dataset)
        )
        return query.where(jobs.c.dataset.in_(owned))
    if principal.role in ("admin", "client"):
        return query
    return None


def list_jobs(
    engine: Engine,
    principal: Principal,
    *,
    dataset: str | None = None,
    status: str | None = None,
    limit: int = 100,
    offset: int = 0,
) -> list[Row[Any]]:
    """The jobs this key may read, newest first."""
    visible = _visible_to(principal, select(jobs))
    if visible is None:
        return []
    query = visible.order_by(jobs.c.created_at.desc(), jobs.c.id).limit(limit).offset(offset)
    if dataset is not None:
        query = query.where(jobs.c.dataset == dataset)
    if status is not None:
        query = query.where(jobs.c.status == status)
    with reading(engine) as conn:
        return list(conn.execute(query).all())


def epsilon_spent(engine: Engine, deltas: dict[str, float]) -> dict[str, float]:
    """Epsilon of the charges each job has committed so far, on their own, at the job's delta."""
    costs = job_costs(engine, list(deltas))
    return {job_id: costs[job_id].epsilon(delta) for job_id, delta in deltas.items()}


def job_costs(engine: Engine, ids: list[str]) -> dict[str, PrivacyCost]:
    """The additive privacy cost of the charges each job has committed so far (compose by adding).

    Priced from the stored events by the configured accountant. A job whose every charge was covered by
    its reservation (the count of its charges equals the reservation's committed count) has spent
    exactly committed x the reserved per-iteration event: one row read. Otherwise (a retried attempt
    beyond the reservation, a job without one) its charges' events are counted and priced once each.
    """
    accountant = configured_accountant()
    totals: dict[str, PrivacyCost] = {}
    charge_count = select(func.count()).where(charges.c.job_id == reservations.c.job_id).scalar_subquery()
    with reading(engine) as conn:
        for chunk in _chunks(ids):
            rows = conn.execute(
                select(
                    reservations.c.job_id,
                    reservations.c.event,
                    reservations.c.committed,
                    charge_count.label("charges"),
                ).where(reservations.c.job_id.in_(chunk))
            )
            for job_id, event, committed, count in rows:
                if committed == count:
                    totals[job_id] = accountant.cost(event_from_dict(event)).scaled(committed)
        rest = [job_id for job_id in ids if job_id not in totals]
        counts: dict[str, Counter[str]] = {job_id: Counter() for job_id in rest}
        for chunk in _chunks(rest):
            stored = conn.execute(
                select(charges.c.job_id, charges.c.event).where(charges.c.job_id.in_(chunk))
            )
            for job_id, event in stored:
                counts[job_id][json.dumps(event, sort_keys=True)] += 1
    for job_id, counter in counts.items():
        total = accountant.zero()
        for key, n in counter.items():
            total = total + accountant.cost(event_from_dict(json.loads(key))).scaled(n)
        totals[job_id] = total
    return totals


def _chunks(ids: list[str], size: int = 500) -> Iterable[list[str]]:
    for start in range(0, len(ids), size):
        yield ids[start : start + size]


def to_public(engine: Engine, rows: Sequence[Row[Any]]) -> list[JobPublic]:
    spent = epsilon_spent(engine, {row.id: row.delta for row in rows})
    return [
        JobPublic(
            id=row.id,
            dataset=row.dataset,
            model=row.model,
            algorithm=row.algorithm,
            status=row.status,
            iteration=row.iteration,
            iterations=row.iterations,
            batch_size=row.batch_size,
            sigma=row.sigma,
            epsilon_target=row.epsilon_target,
            epsilon_job=row.epsilon_job,
            epsilon_spent=finite(spent[row.id]),
            delta=row.delta,
            options=dict(row.options),
            cancel_requested=bool(row.cancel_requested),
            error=row.error,
            created_at=aware(row.created_at),
            started_at=aware(row.started_at),
            finished_at=aware(row.finished_at),
        )
        for row in rows
    ]


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


def job_releases(
    engine: Engine, job_id: str, after: int = 0, limit: int | None = None
) -> list[ReleasePublic]:
    query = (
        select(releases)
        .where(releases.c.job_id == job_id, releases.c.iteration > after)
        .order_by(releases.c.iteration)
    )
    if limit is not None:
        query = query.limit(limit)
    with reading(engine) as conn:
        rows = conn.execute(query).all()
    return [
        ReleasePublic(
            iteration=r.iteration,
            statistics=dict(r.statistics),
            noise_std=dict(r.noise_std),
            created_at=aware(r.created_at),
        )
        for r in rows
    ]


def job_posterior(engine: Engine, job: Row[Any]) -> dict[str, Any]:
    if job.status != "succeeded":
        raise Conflict(f"job {job.id} is {job.status}: a posterior exists once the job has succeeded")
    with reading(engine) as conn:
        document = conn.execute(select(posteriors.c.document).where(posteriors.c.job_id == job.id)).scalar()
    if document is None:
        raise NotFound(f"job {job.id} has no stored posterior")
    return dict(document)
