"""PrivacyBudget: one (epsilon, delta) budget shared by in-process fits, as diffprivlib's BudgetAccountant.

    budget = PrivacyBudget(epsilon=1.0, delta=1e-5)
    cross_val_score(VIPSLogisticRegression(epsilon=0.4, budget=budget), X, y, cv=KFold(2))
    budget.spent, budget.remaining, budget.history

What the budget covers is each fit's release, on the rows it was given. Split rows by index (`KFold`,
whose folds do not depend on the data), never by the labels: scikit-learn's default for a classifier with
`cv=int` is StratifiedKFold, whose folds move when one record's label changes, so neighbouring datasets
could give a fit inputs that differ in many records. The scores cross_val_score computes on the held-out
folds are not private at all (exact statistics of the rows): they are for data you may see.

Every fit it pays for reserves its whole cost before it starts and is charged for the iterations it released
when it ends (the service's ledger protocol, privacy_wall.ledger.base); costs compose with the accountant,
as a dataset's ledger does (never by adding epsilons): five full-batch fits of epsilon 0.4 compose to about
0.963 at delta 1e-5 under the filter (the default) as under `pld`. A fit that would exceed the budget is
refused before anything is computed, with the service's 409 message (privacy_wall.ledger.refusals; "dataset
D" names the fit's `dataset=`, "local" by default).

Sharing: scikit-learn's clone (GridSearchCV, cross_val_score) deep-copies parameters; a PrivacyBudget's
copy is itself, so every clone charges the one budget. Threads share it too (joblib's threading backend;
a lock serialises admissions). Processes do not: joblib's n_jobs > 1 with its default (loky) or
multiprocessing backend pickles a copy into each worker process, whose charges the original would never
see, so a pickled copy reports what was spent when it was made but refuses to pay for fits (PrivacyError:
those fits fail, and cross_val_score says so). Use n_jobs=1 or `with joblib.parallel_backend("threading"):`
for parallel fits on one budget.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from typing import Any, Self

from privacy_wall.accounting.accountants import Accountant, PrivacyCost, configured_accountant
from privacy_wall.accounting.accountants import get_accountant as accountant_named
from privacy_wall.accounting.events import SubsampledGaussianEvent
from privacy_wall.gate import PrivacyError
from privacy_wall.ledger.base import BudgetExceeded, budget_exceeded
from privacy_wall.ledger.refusals import headroom_epsilon, refusal_detail


@dataclass(frozen=True)
class BudgetCharge:
    """One fit paid for by a budget: its schedule, the iterations it released, its own epsilon and the
    budget's composed spend after it (both at the budget's delta)."""

    dataset: str
    job_id: str
    sigma: float
    batch_size: int
    population: int
    iterations: int
    epsilon: float
    epsilon_spent: float


@dataclass
class _Reservation:
    dataset: str
    event: SubsampledGaussianEvent
    per_iteration: PrivacyCost
    iterations: int


class PrivacyBudget:
    """A total (epsilon, delta) that the fits given it as `budget=` compose within (module docstring);
    accountant: filter (valid however the fits adapt to each other), pld, rdp or paper (default: the
    deployment's, VIPS_ACCOUNTANT)."""

    def __init__(self, epsilon: float, delta: float = 1e-5, accountant: str | None = None) -> None:
        if not (epsilon > 0 and math.isfinite(epsilon)):
            raise ValueError("a PrivacyBudget's epsilon must be a finite number > 0")
        if not 0 < delta < 1:
            raise ValueError("a PrivacyBudget's delta must be in (0, 1)")
        chosen: Accountant = configured_accountant() if accountant is None else accountant_named(accountant)
        self.epsilon = float(epsilon)
        self.delta = float(delta)
        self.accountant = chosen.name
        self._accountant = chosen
        self._spent = chosen.zero()
        self._reservations: dict[str, _Reservation] = {}
        self._history: list[BudgetCharge] = []
        self._lock = threading.Lock()
        self._original = True  # False in a pickled copy

    @property
    def spent(self) -> float:
        """Epsilon (at delta) of every release charged so far, composed."""
        with self._lock:
            return self._spent.epsilon(self.delta)

    @property
    def remaining(self) -> float:
        """The budget less what is spent or reserved by fits under way (never below 0)."""
        with self._lock:
            return max(self.epsilon - self._committed_and_reserved().epsilon(self.delta), 0.0)

    @property
    def history(self) -> tuple[BudgetCharge, ...]:
        """The fits charged so far, in the order they ended."""
        with self._lock:
            return tuple(self._history)

    def _committed_and_reserved(self) -> PrivacyCost:
        total = self._spent
        for held in self._reservations.values():
            total = total + held.per_iteration.scaled(held.iterations)
        return total

    def reserve(self, job_id: str, dataset: str, event: SubsampledGaussianEvent, iterations: int) -> None:
        """Admit a fit of `iterations` releases of `event` on `dataset`, or raise BudgetExceeded (the
        service's 409 message) reserving nothing; PrivacyError in a pickled copy."""
        if not self._original:
            raise PrivacyError(
                "this PrivacyBudget is a pickled copy (e.g. in a joblib worker process): its charges would "
                "never reach the original; fit with n_jobs=1 or joblib's threading backend"
            )
        per_iteration = self._accountant.cost(event)
        with self._lock:
            if job_id in self._reservations:
                raise ValueError(f"fit {job_id} already holds a reservation")
            base = self._committed_and_reserved()
            after = (base + per_iteration.scaled(iterations)).epsilon(self.delta)
            if not after <= self.epsilon:  # NaN fails closed
                exc = budget_exceeded(
                    f"dataset {dataset}", base.epsilon(self.delta), self.epsilon, self.delta, after
                )
                largest = headroom_epsilon(
                    base, self.epsilon, self.delta, event.sample_size, event.population, iterations
                )
                raise BudgetExceeded(
                    refusal_detail(exc, largest), spent=exc.spent, requested=exc.requested, budget=exc.budget
                )
            self._reservations[job_id] = _Reservation(dataset, event, per_iteration, iterations)

    def settle(self, job_id: str, released: int) -> None:
        """Charge a reserved fit for the `released` iterations it released and free the rest."""
        with self._lock:
            held = self._reservations.pop(job_id, None)
            if held is None:
                return
            released = min(max(int(released), 0), held.iterations)
            if released == 0:
                return
            self._spent = self._spent + held.per_iteration.scaled(released)
            self._history.append(
                BudgetCharge(
                    dataset=held.dataset,
                    job_id=job_id,
                    sigma=held.event.noise_multiplier,
                    batch_size=held.event.sample_size,
                    population=held.event.population,
                    iterations=released,
                    epsilon=held.per_iteration.scaled(released).epsilon(self.delta),
                    epsilon_spent=self._spent.epsilon(self.delta),
                )
            )

    def __copy__(self) -> Self:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> Self:
        """Itself: clone and deepcopy share the budget rather than copy what it has spent."""
        return self

    def __getstate__(self) -> dict[str, Any]:
        """What a pickled copy keeps: the budget, its spend and history (not the lock)."""
        with self._lock:
            state = self.__dict__.copy()
        del state["_lock"], state["_accountant"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        """A copy that reports but never pays (module docstring)."""
        self.__dict__.update(state)
        self._accountant = accountant_named(self.accountant)
        self._lock = threading.Lock()
        self._original = False

    def __repr__(self) -> str:
        return (
            f"PrivacyBudget(epsilon={self.epsilon:g}, delta={self.delta:g}, accountant={self.accountant!r})"
        )
