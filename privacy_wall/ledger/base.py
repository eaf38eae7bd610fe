"""The budget ledger interface and its in-memory implementation.

Protocol (docs/design.md section 3): a job reserves its whole privacy cost at admission; each iteration
commits its share, keyed by (job, t), before its release leaves the gate; cancel or failure refunds the
uncommitted rest. A charge that is not covered by a reservation is admitted on its own if the budget allows
it (and, in the service, the submitting key's quota: ledger_db.ChargeCheck). A crash can only leave budget
over-counted, never under-counted.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Protocol

from privacy_wall.accounting.accountants import Accountant, PrivacyCost, configured_accountant, sum_costs
from privacy_wall.accounting.events import Event, SubsampledGaussianEvent


class BudgetExceeded(RuntimeError):
    """The ledger cannot admit a charge without exceeding the dataset's epsilon budget."""

    def __init__(self, message: str, spent: float, requested: float, budget: float) -> None:
        super().__init__(message)
        self.spent = spent
        self.requested = requested
        self.budget = budget


def budget_exceeded(subject: str, spent: float, budget: float, delta: float, after: float) -> BudgetExceeded:
    """The refusal of a charge that would bring `subject`'s (e.g. "dataset D") spent-or-reserved epsilon
    from `spent` to `after` > `budget`. A spend already above the cap says why nothing more fits."""
    over = (
        "; the spend is already above the cap (the ledger was re-priced by the budget's filter, which holds "
        "however analysts adapt, or the cap was lowered): nothing more is admitted"
        if spent > budget
        else ""
    )
    return BudgetExceeded(
        f"{subject}: epsilon {spent:.4g} of {budget:.4g} is spent or reserved (delta {delta:g}); "
        f"this would bring it to {after:.4g}{over}",
        spent=spent,
        requested=after,
        budget=budget,
    )


class DuplicateCharge(RuntimeError):
    """An iteration (job, t) was already charged: reuse its stored release instead of paying twice."""


@dataclass(frozen=True)
class Charge:
    """One iteration's release, as written to the ledger before the release leaves the gate.

    Keyed by (job, iteration, attempt): attempt > 0 only when an earlier attempt was charged but its
    release was lost before it was stored (a crash); the retry pays again rather than reuse a release
    nobody kept.
    """

    dataset: str
    job_id: str
    iteration: int
    event: SubsampledGaussianEvent
    attempt: int = 0


class Ledger(Protocol):
    def commit(self, charge: Charge) -> None:
        """Record the charge, or raise BudgetExceeded / DuplicateCharge without recording anything."""
        ...

    def withdraw(self, charge: Charge) -> None:
        """Remove a charge whose release never left the wall (computing or storing it failed and no copy of
        its values survives): charges = releases. The job's reservation covers that iteration again. A
        charge that is not recorded is left alone."""
        ...


@dataclass
class _Reservation:
    per_iteration: PrivacyCost
    remaining: int


@dataclass
class InMemoryLedger:
    """A ledger for one process: the estimator and `vips fit --local` use a throwaway one.

    epsilon_budget None means no cap (public data or a researcher's own accounting); delta is the
    dataset's delta, used for every epsilon it reports; the accountant prices every charge (default:
    the configured one).
    """

    delta: float
    epsilon_budget: float | None = None
    accountant: Accountant = field(default_factory=configured_accountant)
    _committed: dict[tuple[str, int, int], Charge] = field(default_factory=dict)
    _committed_curve: PrivacyCost | None = None
    _reservations: dict[str, _Reservation] = field(default_factory=dict)
    _covered: set[tuple[str, int, int]] = field(default_factory=set)  # charges paid from a reservation
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self._committed_curve = self.accountant.zero()

    def spent_cost(self) -> PrivacyCost:
        assert self._committed_curve is not None
        return self._committed_curve

    def reserved_cost(self) -> PrivacyCost:
        return sum_costs(
            [r.per_iteration.scaled(r.remaining) for r in self._reservations.values()], self.accountant.name
        )

    def epsilon_spent(self) -> float:
        return self.spent_cost().epsilon(self.delta)

    def charges(self) -> list[Charge]:
        return list(self._committed.values())

    def _admit(self, extra: PrivacyCost) -> None:
        if self.epsilon_budget is None:
            return
        spent = (self.spent_cost() + self.reserved_cost()).epsilon(self.delta)
        total = (self.spent_cost() + self.reserved_cost() + extra).epsilon(self.delta)
        if not total <= self.epsilon_budget:  # NaN fails closed
            raise budget_exceeded("this ledger", spent, self.epsilon_budget, self.delta, total)

    def reserve(self, job_id: str, event: Event, iterations: int) -> None:
        """Reserve `iterations` repetitions of a per-iteration event for a job, atomically."""
        if not isinstance(event, SubsampledGaussianEvent):
            raise TypeError("reserve takes the per-iteration event")
        if isinstance(iterations, bool) or not isinstance(iterations, int) or iterations < 1:
            raise ValueError("iterations must be an integer >= 1")
        per_iteration = self.accountant.cost(event)
        with self._lock:
            if job_id in self._reservations:
                raise ValueError(f"job {job_id} already holds a reservation")
            self._admit(per_iteration.scaled(iterations))
            self._reservations[job_id] = _Reservation(per_iteration, iterations)

    def commit(self, charge: Charge) -> None:
        key = (charge.job_id, charge.iteration, charge.attempt)
        curve = self.accountant.cost(charge.event)
        with self._lock:
            if key in self._committed:
                raise DuplicateCharge(
                    f"iteration {charge.iteration} of job {charge.job_id} is already charged"
                )
            reservation = self._reservations.get(charge.job_id)
            if reservation is not None and reservation.remaining > 0 and reservation.per_iteration == curve:
                reservation.remaining -= 1
                self._covered.add(key)
            else:
                self._admit(curve)
            self._committed[key] = charge
            self._committed_curve = self.spent_cost() + curve

    def withdraw(self, charge: Charge) -> None:
        key = (charge.job_id, charge.iteration, charge.attempt)
        with self._lock:
            if self._committed.pop(key, None) is None:
                return
            reservation = self._reservations.get(charge.job_id)
            if key in self._covered and reservation is not None:
                reservation.remaining += 1
            self._covered.discard(key)
            self._committed_curve = sum_costs(
                [self.accountant.cost(c.event) for c in self._committed.values()], self.accountant.name
            )

    def refund(self, job_id: str) -> None:
        """Release the uncommitted rest of a job's reservation (cancel, failure, or the job's end)."""
        with self._lock:
            self._reservations.pop(job_id, None)
