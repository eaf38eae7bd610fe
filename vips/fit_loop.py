"""One in-process fit on an in-memory store: sigma for the schedule, the gate, a throwaway ledger (and a
shared PrivacyBudget when given), the VIPS loop and the posterior document. No scikit-learn: `vips fit
--local` calls it directly, the estimators (vips.estimators) through their fit."""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from control.planning.schedules import choose_schedule, chosen_options
from privacy_wall.accounting.accountants import get_accountant
from privacy_wall.accounting.calibration import calibrate_sigma
from privacy_wall.accounting.events import SubsampledGaussianEvent
from privacy_wall.accounting.names import DEFAULT_ACCOUNTANT
from privacy_wall.accounting.sigma_range import sigma_problem
from privacy_wall.data.store import RowStore
from privacy_wall.gate import Gate, PrivacyError
from privacy_wall.ledger.base import InMemoryLedger
from vips.models.registry import model_setup
from vips.posterior import Privacy, build_posterior
from vips.runner import LoopSettings, run_vips

if TYPE_CHECKING:  # a fit without a shared budget (`vips fit --local`) never loads vips.budget
    from vips.budget import PrivacyBudget

Progress = Callable[[int, int, float], None]
"""fit's progress hook: called after each iteration with (iterations done, iterations total, epsilon
spent so far by this fit as the estimator's accountant prices it; math.inf for a sigma = 0 fit). The
epsilon is re-priced at most every PRICE_INTERVAL seconds and after the last iteration (between, the last
price: a DPVI fit's 1,000 prices took 5 of its 6 seconds)."""

#: Seconds between two prices of the spent epsilon for the progress hook (a bar redraws about this often).
PRICE_INTERVAL = 0.1


@dataclass(frozen=True, kw_only=True)
class Schedule:
    """A fit's privacy schedule and step sizes, as the estimators' constructor arguments name them
    (vips.estimators.VipsEstimator documents each)."""

    epsilon: float | None
    delta: float
    sigma: float | None
    batch_size: int | None
    iterations: int | None
    tau0: float = 0.0
    kappa: float = 1.0
    random_state: int | None = None
    sampling: str = "uniform"
    accountant: str = DEFAULT_ACCOUNTANT


@dataclass(frozen=True)
class Fitted:
    """A fit's posterior document, the model's final state and the model options it ran with (those
    given and those the service's rule chose)."""

    document: dict[str, Any]
    state: Any
    options: dict[str, float] = field(default_factory=dict)


def with_chosen(
    schedule: Schedule,
    model: str,
    algorithm: str,
    population: int,
    dimension: int | None = None,
    options: dict[str, float] | None = None,
) -> Schedule:
    """The schedule with iterations and batch size filled in where it left them None, as the service
    chooses them (control.planning.schedules: from the model, N and epsilon alone)."""
    if schedule.iterations is not None and schedule.batch_size is not None:
        return schedule
    chosen = choose_schedule(
        model,
        algorithm,
        max(population, 1),
        schedule.epsilon,
        iterations=schedule.iterations,
        batch_size=schedule.batch_size,
        options=options,
        dimension=dimension,
    )
    return replace(schedule, iterations=chosen.iterations, batch_size=chosen.batch_size)


def resolve_sigma(schedule: Schedule, batch_size: int, population: int) -> float:
    """The given sigma, or the smallest calibrated to the schedule's epsilon at its delta on its own."""
    if (schedule.epsilon is None) == (schedule.sigma is None):
        raise ValueError("give exactly one of epsilon and sigma")
    if schedule.sigma is not None:
        problem = sigma_problem(schedule.sigma) if schedule.sigma >= 0 else "sigma must be >= 0"
        if problem is not None:
            raise ValueError(problem)
        return float(schedule.sigma)
    assert schedule.epsilon is not None and schedule.iterations is not None  # with_chosen filled it
    return calibrate_sigma(
        schedule.epsilon,
        batch_size,
        population,
        schedule.iterations,
        schedule.delta,
        accountant=schedule.accountant,
    )


def fit_store(
    model: str,
    algorithm: str,
    options: dict[str, float],
    schedule: Schedule,
    make_store: Callable[[bool], RowStore],
    population: int,
    dataset: str,
    *,
    progress: Progress | None = None,
    budget: PrivacyBudget | None = None,
    extra: dict[str, Any] | None = None,
    dimension: int | None = None,
    vocabulary: Sequence[str] | None = None,
    columns: Sequence[str] | None = None,
) -> Fitted:
    """Run the loop on the store `make_store(public)` builds, calling `progress` after each iteration and
    charging `budget` (refused with BudgetExceeded before anything is computed when it would not fit);
    `extra` goes into the posterior document; `dimension` (the data's d, public) for rules read at a
    reference dimension (control.planning.schedules); `vocabulary` (LDA's public word list) for the unigram
    fallback's public prior; `columns` (the public feature names) for BLR's intercept step."""
    schedule = with_chosen(schedule, model, algorithm, population, dimension, options)
    chosen = chosen_options(model, algorithm, max(population, 1), schedule.epsilon, options, dimension)
    options = {**chosen, **options}  # the service's choice for the options the caller left out
    assert schedule.iterations is not None and schedule.batch_size is not None
    iterations, batch_size = schedule.iterations, int(schedule.batch_size)
    sigma = resolve_sigma(schedule, batch_size, max(population, 1))
    settings = LoopSettings(iterations, batch_size, sigma, schedule.tau0, schedule.kappa)
    public = sigma == 0
    if schedule.random_state is not None and not public:
        raise PrivacyError("random_state is only accepted with sigma = 0: private releases cannot be seeded")
    if schedule.sampling not in ("uniform", "passes"):
        raise ValueError("sampling must be 'uniform' or 'passes'")
    passes = schedule.sampling == "passes"
    if passes and not public:
        raise PrivacyError("sampling='passes' is only for sigma = 0: private fits sample uniformly")
    if budget is not None and schedule.delta != budget.delta:
        raise ValueError(
            f"delta {schedule.delta:g} differs from the budget's delta {budget.delta:g}: "
            f"give delta={budget.delta:g}"
        )
    setup = model_setup(
        model, options, sigma=sigma, algorithm=algorithm, vocabulary=vocabulary, columns=columns
    )
    store = make_store(public)
    accountant = get_accountant(schedule.accountant)
    ledger = InMemoryLedger(delta=schedule.delta, epsilon_budget=schedule.epsilon, accountant=accountant)
    # Unpadded (privacy_wall.timing): an in-process fit's times are seen by the data's holder alone.
    gate = Gate(store, ledger, seed=schedule.random_state, passes=passes, padded=False)
    job_id = uuid.uuid4().hex
    event = SubsampledGaussianEvent(sigma, batch_size, population)

    priced = (-math.inf, math.inf)  # (when, epsilon) of the last price

    def report(t: int, _release: object, _state: object) -> None:
        nonlocal priced
        if progress is None:
            return
        now = time.monotonic()
        if sigma > 0 and (t == iterations or now - priced[0] >= PRICE_INTERVAL):
            priced = (now, ledger.epsilon_spent())
        progress(t, iterations, priced[1])

    if budget is not None:
        budget.reserve(job_id, dataset, event, iterations)
    try:
        ledger.reserve(job_id, event, iterations)
        try:
            result = run_vips(
                gate,
                setup.query,
                setup.model,
                settings,
                job_id=job_id,
                dimension=store.info.dimension,
                population=population,
                on_iteration=None if progress is None else report,
            )
        finally:
            ledger.refund(job_id)
    finally:
        if budget is not None:
            budget.settle(job_id, len(ledger.charges()))
    document = build_posterior(
        model=model,
        algorithm=algorithm,
        dataset=dataset,
        job_id=job_id,
        privacy=Privacy(
            epsilon=ledger.epsilon_spent() if sigma > 0 else math.inf,
            delta=schedule.delta,
            sigma=sigma,
            iterations=iterations,
            batch_size=batch_size,
            population=population,
            accountant=accountant.version,
            sampling="shuffled_passes" if passes else "without_replacement",
        ),
        parameters=setup.model.posterior(result.state),
        extra=extra,
    )
    return Fitted(document, result.state, options)
