"""What a budget refusal says beyond its one line (privacy_wall.ledger.base.budget_exceeded), wherever a
budget is kept (the service's ledger, a key's quota, an in-process PrivacyBudget): the 409's detail and the
largest job epsilon of a schedule that still fits."""

from __future__ import annotations

import math

from privacy_wall.accounting.accountants import PrivacyCost
from privacy_wall.accounting.calibration import CalibrationError, calibrate_sigma
from privacy_wall.accounting.calibration import epsilon as schedule_epsilon
from privacy_wall.ledger.base import BudgetExceeded

#: Relative tolerance on sigma when pricing the headroom: the epsilon quoted is at most ~1e-4 (relative)
#: below the largest that fits, never above it (tens of milliseconds with the default accountant).
HEADROOM_TOLERANCE = 1e-4


def refusal_detail(exc: BudgetExceeded, largest: float | None) -> str:
    """The 409's detail: the refusal, what is left, and the largest epsilon of the schedule that fits."""
    remaining = max(exc.budget - exc.spent, 0.0)
    fits = (
        f"; a job of this schedule could have at most epsilon {largest:.4g} (submit it as epsilon)"
        if largest is not None
        else "; no job of this schedule fits"
    )
    if largest is not None and largest > remaining:  # not a contradiction: say why (issue 37)
        fits += (
            ", more than what remains because spends compose rather than add up: the budget's spend with "
            "that job composed is at most the cap"
        )
    return f"{exc}; epsilon remaining {remaining:.4g}{fits}"


def headroom_epsilon(
    base: PrivacyCost, cap: float | None, delta: float, sample_size: int, population: int, iterations: int
) -> float | None:
    """The largest job epsilon (on its own, at `delta`) of this schedule whose cost composed with `base`
    stays within `cap` (priced by base's accountant, ~1e-4 below the exact value, never above); None
    without a cap or when no job fits. Prices a dataset's budget, a key's quota and a PrivacyBudget."""
    if cap is None:
        return None
    try:
        sigma = calibrate_sigma(
            cap, sample_size, population, iterations, delta, spent=base, rel_tol=HEADROOM_TOLERANCE
        )
    except CalibrationError:  # nothing is left, or no sigma the calibration tries fits
        return None
    value = schedule_epsilon(sigma, sample_size, population, iterations, delta, base.accountant)
    return value if math.isfinite(value) else None
