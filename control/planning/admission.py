"""A job spec checked and priced before anything is reserved (docs/design.md section 3): the spec
against the dataset's public metadata, sigma (given, or calibrated to the job's own target epsilon at the
dataset's delta), the dry-run quote, and the numbers of a budget refusal."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from sqlalchemy import Engine, Row

from control.budgets.datasets import ensure_budget_delta, finite
from control.budgets.quotas import QuotaExceeded, quota_quote, tighter
from control.errors import Conflict, Loc, SpecError
from control.jobs.storage import MIB, key_stored_bytes, storage_problem
from control.planning.options import (
    MODEL_KINDS,
    algorithm_problem,
    option_problem,
    schedule_problem,
    typed_options,
)
from control.planning.pricing import pricing_slot
from control.planning.resources import Resources, estimate, resource_errors
from control.planning.schedules import Schedule, choose_schedule
from control.schemas import BudgetRefusal, JobCreate, JobQuote, ResourceEstimate, ScheduleChoice
from control.settings import ServiceSettings
from privacy_wall.accounting.calibration import CalibrationError, calibrate_sigma
from privacy_wall.accounting.calibration import epsilon as job_epsilon
from privacy_wall.accounting.events import SubsampledGaussianEvent
from privacy_wall.accounting.sigma_range import SIGMA_MIN
from privacy_wall.accounting.weak import weak_privacy_problem
from privacy_wall.ledger import database as ledger_db
from privacy_wall.ledger.base import BudgetExceeded
from privacy_wall.ledger.delta_policy import delta_problem, suggested_delta
from privacy_wall.ledger.refusals import refusal_detail
from privacy_wall.sqlengine import reading


def option_errors(model: str, algorithm: str, options: dict[str, float]) -> list[tuple[Loc, str]]:
    errors: list[tuple[Loc, str]] = []
    for name, value in options.items():
        problem = option_problem(model, name, value, algorithm)
        if problem is not None:
            errors.append((("options", name), problem))
    return errors


@dataclass(frozen=True)
class Plan:
    """A checked spec with everything admission needs."""

    dataset: str
    batch_size: int
    iterations: int
    schedule: Schedule
    population: int
    sigma: float
    delta: float
    epsilon_job: float | None
    resources: Resources

    @property
    def event(self) -> SubsampledGaussianEvent:
        return SubsampledGaussianEvent(self.sigma, self.batch_size, self.population)


def check_spec(spec: JobCreate, dataset: Row[Any], settings: ServiceSettings) -> tuple[Schedule, Resources]:
    """Raise SpecError naming every bad field, or the resource limits the job exceeds; return the job's
    schedule (what it gives, the rest chosen by control.planning.schedules) and its resource estimate
    (computed once, for the limits and the plan)."""
    errors: list[tuple[Loc, str]] = []
    if spec.iterations is not None and spec.iterations > settings.max_iterations:
        errors.append((("iterations",), f"must be <= {settings.max_iterations} (the server's maximum)"))
    kind = MODEL_KINDS[spec.model]
    if dataset.kind != kind:
        errors.append(
            (("model",), f"model {spec.model} needs a {kind} dataset; {dataset.name} is {dataset.kind}")
        )
    if spec.batch_size is not None and spec.batch_size > dataset.population:
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
    schedule = choose_schedule(  # from public facts only: the model, N and the job's own epsilon
        spec.model,
        spec.algorithm,
        int(dataset.population),
        spec.epsilon,
        iterations=spec.iterations,
        batch_size=spec.batch_size,
        max_iterations=settings.max_iterations,
        options=spec.options,
        dimension=int(dataset.dimension),
    )
    resources = job_resources(spec, dataset, schedule)  # the estimate needs a valid spec
    errors = resource_errors(
        resources,
        schedule.iterations,
        max_memory_mb=settings.max_job_memory_mb,
        max_release_mb=settings.max_release_mb,
        max_stored_mb=settings.max_job_stored_mb,
    )
    if errors:
        raise SpecError(errors)
    return schedule, resources


def job_options(spec: JobCreate, schedule: Schedule) -> dict[str, float]:
    """The options a job runs with: those it gives and, for the rest, those its schedule chose."""
    return {**schedule.options, **spec.options}


def job_resources(spec: JobCreate, dataset: Row[Any], schedule: Schedule) -> Resources:
    """The job's worker memory, release and stored bytes from the dataset's public shape."""
    return estimate(
        spec.model,
        spec.algorithm,
        job_options(spec, schedule),
        int(dataset.dimension),
        schedule.batch_size,
        schedule.iterations,
    )


def plan_job(engine: Engine, spec: JobCreate, dataset: Row[Any], settings: ServiceSettings) -> Plan:
    """Check the spec, find the budget (409 without one) and choose sigma."""
    schedule, resources = check_spec(spec, dataset, settings)
    # The epsilon asked (a job that gives sigma is held by the budget's cap, which needed the same
    # confirmation above WEAK_EPSILON).
    weak = (
        None
        if dataset.public or spec.epsilon is None
        else weak_privacy_problem("a job", spec.epsilon, spec.weak_privacy_ok)
    )
    if weak is not None:
        raise SpecError([(("weak_privacy_ok",), weak)])
    batch_size, iterations = schedule.batch_size, schedule.iterations
    delta = ensure_budget_delta(engine, dataset)
    population = int(dataset.population)
    check_delta(dataset, delta)
    with pricing_slot(settings):  # the accountant's cost is cached for the reservation that follows
        if spec.epsilon is not None:
            try:
                sigma = calibrate_sigma(spec.epsilon, batch_size, population, iterations, delta)
            except CalibrationError as exc:
                raise SpecError([(("epsilon",), str(exc))]) from None
        else:
            assert spec.sigma is not None
            sigma = spec.sigma
        conflict = schedule_problem(spec.model, job_options(spec, schedule), sigma)
        if conflict is not None:
            raise SpecError([(("options", conflict[0]), conflict[1])])
        eps = job_epsilon(sigma, batch_size, population, iterations, delta) if sigma > 0 else None
    return Plan(
        dataset.name,
        batch_size,
        iterations,
        schedule,
        population,
        sigma,
        delta,
        finite(eps),
        resources,
    )


def check_delta(dataset: Row[Any], delta: float) -> None:
    """409 for a private dataset whose budget's delta is not below 1/N: a budget set before the delta
    policy (privacy_wall.ledger.delta_policy) stays in the ledger as it was, but admits no job."""
    problem = None if dataset.public else delta_problem(delta, int(dataset.population))
    if problem is None:
        return
    raise Conflict(
        f"dataset {dataset.name}: its budget's {problem}; no job is admitted until the custodian sets a "
        f"smaller delta (vips budget set {dataset.name} --epsilon E --delta "
        f"{suggested_delta(int(dataset.population)):g}), which is possible while nothing is charged "
        "against it (otherwise ingest the rows as a new dataset)"
    )


def alone_by_pld(
    sigma: float, batch_size: int, population: int, iterations: int, delta: float
) -> float | None:
    """A job's own `pld` price (exact for its fixed schedule, valid for that job alone), shown beside the
    filter's in a quote and on the job page; None at sigma 0 or where it is unbounded."""
    if not sigma > 0:
        return None
    return finite(job_epsilon(sigma, batch_size, population, iterations, delta, "pld"))


def quote_job(
    engine: Engine,
    spec: JobCreate,
    plan: Plan,
    key_id: str | None = None,
    max_key_stored_mb: float | None = None,
) -> JobQuote:
    """The dry run: the job's cost, the dataset's budget after it and, when the submitting key has a quota
    on the dataset, that quota after it; admissible and largest_epsilon within both; admissible also
    within the key's storage cap when given. Reserves nothing."""
    quote = ledger_db.quote(engine, plan.dataset, plan.event, plan.iterations)
    mine = (
        None
        if key_id is None
        else quota_quote(engine, plan.dataset, key_id, plan.event, plan.iterations, quote.status.delta)
    )
    stored = None
    if key_id is not None and max_key_stored_mb is not None:
        with reading(engine) as conn:
            stored = key_stored_bytes(conn, key_id)
    limit: Literal["dataset", "quota", "storage"] | None = None
    if not quote.admissible:
        limit = "dataset"
    elif mine is not None and not mine.admissible:
        limit = "quota"
    elif (
        stored is not None
        and max_key_stored_mb is not None
        and storage_problem(stored, plan.resources.stored_bytes, max_key_stored_mb) is not None
    ):
        limit = "storage"
    capped = quote.status.epsilon_budget is not None
    return JobQuote(
        dataset=plan.dataset,
        iterations=plan.iterations,
        batch_size=plan.batch_size,
        schedule=ScheduleChoice(
            iterations=plan.iterations,
            batch_size=plan.batch_size,
            auto=list(plan.schedule.auto),
            why=plan.schedule.why,
            options=typed_options(spec.model, plan.schedule.options, spec.algorithm),
        ),
        sigma=plan.sigma,
        delta=plan.delta,
        epsilon_job=plan.epsilon_job,
        epsilon_job_pld=alone_by_pld(
            plan.sigma, plan.batch_size, plan.population, plan.iterations, plan.delta
        ),
        epsilon_spent=quote.status.epsilon_spent,
        epsilon_reserved=quote.status.epsilon_reserved,
        epsilon_after=finite(quote.epsilon_after),
        epsilon_budget=quote.status.epsilon_budget,
        epsilon_remaining=quote.status.epsilon_remaining,
        admissible=limit is None,
        largest_epsilon=tighter(quote.largest_epsilon, capped, mine),
        resources=ResourceEstimate(
            memory_bytes=plan.resources.memory_bytes,
            release_bytes=plan.resources.release_bytes,
            stored_bytes=plan.resources.stored_bytes,
            key_stored_bytes=stored,
            key_max_stored_bytes=None if max_key_stored_mb is None else int(max_key_stored_mb * MIB),
        ),
        limit=limit,
        quota_epsilon=None if mine is None else mine.quota,
        quota_epsilon_reserved=None if mine is None else finite(mine.epsilon_reserved),
        quota_epsilon_after=None if mine is None else finite(mine.epsilon_after),
        quota_remaining=None if mine is None else mine.remaining,
        note=floor_note(spec.epsilon, plan.sigma, plan.epsilon_job),
    )


def floor_note(asked: float | None, sigma: float, epsilon_job: float | None) -> str | None:
    """One line when the calibrated sigma sits at its floor SIGMA_MIN and the job's epsilon differs from
    the epsilon asked (no larger sigma reaches it; a smaller one is not run), else None."""
    if (
        asked is None
        or epsilon_job is None
        or sigma > SIGMA_MIN
        or math.isclose(epsilon_job, asked, rel_tol=1e-3)
    ):
        return None
    return (
        f"no sigma at or above its floor {SIGMA_MIN:g} reaches epsilon {asked:.4g}: sigma is {SIGMA_MIN:g} "
        f"and the job costs epsilon {epsilon_job:.4g}, not the {asked:.4g} asked"
    )


def refusal(
    engine: Engine, exc: BudgetExceeded, plan: Plan, iterations: int, key_id: str | None = None
) -> BudgetRefusal:
    """The 409 body: which limit refused the job (the dataset's budget or the key's quota), what is spent
    or reserved against it, what is left, and the largest epsilon that would fit both."""
    limit: Literal["dataset", "quota"] = "quota" if isinstance(exc, QuotaExceeded) else "dataset"
    try:
        status = ledger_db.budget_status(engine, plan.dataset)
        dataset_largest = ledger_db.largest_epsilon(
            engine, plan.dataset, plan.batch_size, plan.population, iterations
        )
        mine = (
            None
            if key_id is None
            else quota_quote(engine, plan.dataset, key_id, plan.event, iterations, status.delta)
        )
        largest = tighter(dataset_largest, status.epsilon_budget is not None, mine)
    except ledger_db.UnknownDataset:
        largest = None
    return (
        BudgetRefusal(  # the message names the limit: "dataset D: ..." or "key K's quota on dataset D: ..."
            detail=refusal_detail(exc, largest),
            epsilon_spent_or_reserved=exc.spent,
            epsilon_requested_total=finite(exc.requested),
            epsilon_budget=exc.budget,
            epsilon_remaining=max(exc.budget - exc.spent, 0.0),
            largest_epsilon=largest,
            limit=limit,
        )
    )
