"""A job spec checked and priced before anything is reserved (docs/design.md section 3): the spec
against the dataset's public metadata, sigma (given, or calibrated to the job's own target epsilon at the
dataset's delta), the dry-run quote, and the numbers of a budget refusal."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, Row

from privacy_wall import ledger_db
from privacy_wall.accounting import (
    CalibrationError,
    SubsampledGaussianEvent,
    calibrate_sigma,
)
from privacy_wall.accounting import epsilon as job_epsilon
from privacy_wall.ledger import BudgetExceeded
from service.budgets import ensure_budget, finite
from service.errors import Loc, SpecError
from service.options import MODEL_KINDS, algorithm_problem, option_problem, schedule_problem
from service.pricing import pricing_slot
from service.resources import Resources, estimate, resource_errors
from service.schemas import BudgetRefusal, JobCreate, JobQuote, ResourceEstimate
from service.settings import ServiceSettings


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
    population: int
    sigma: float
    delta: float
    epsilon_job: float | None
    resources: Resources

    @property
    def event(self) -> SubsampledGaussianEvent:
        return SubsampledGaussianEvent(self.sigma, self.batch_size, self.population)


def check_spec(spec: JobCreate, dataset: Row[Any], settings: ServiceSettings) -> tuple[int, Resources]:
    """Raise SpecError naming every bad field, or the resource limits the job exceeds; return the batch
    size (default N) and the job's resource estimate (computed once, for the limits and the plan)."""
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
    resources = job_resources(spec, dataset, batch_size)  # the estimate needs a valid spec
    errors = resource_errors(
        resources,
        spec.iterations,
        max_memory_mb=settings.max_job_memory_mb,
        max_release_mb=settings.max_release_mb,
        max_stored_mb=settings.max_job_stored_mb,
    )
    if errors:
        raise SpecError(errors)
    return batch_size, resources


def job_resources(spec: JobCreate, dataset: Row[Any], batch_size: int) -> Resources:
    """The job's worker memory, release and stored bytes from the dataset's public shape."""
    return estimate(
        spec.model, spec.algorithm, spec.options, int(dataset.dimension), batch_size, spec.iterations
    )


def plan_job(engine: Engine, spec: JobCreate, dataset: Row[Any], settings: ServiceSettings) -> Plan:
    """Check the spec, find the budget (409 without one) and choose sigma."""
    batch_size, resources = check_spec(spec, dataset, settings)
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
    return Plan(dataset.name, batch_size, population, sigma, budget.delta, finite(eps), resources)


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
        resources=ResourceEstimate(
            memory_bytes=plan.resources.memory_bytes,
            release_bytes=plan.resources.release_bytes,
            stored_bytes=plan.resources.stored_bytes,
        ),
    )


def refusal(engine: Engine, exc: BudgetExceeded, plan: Plan, iterations: int) -> BudgetRefusal:
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
