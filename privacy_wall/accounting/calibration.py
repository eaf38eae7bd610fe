"""Noise calibration: a job's epsilon on its own, and the smallest noise multiplier sigma whose
composition with what a ledger already spent stays within a target epsilon (bisection on the safe side,
under any accountant of privacy_wall.accounting.accountants).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable

from privacy_wall.accounting import pld
from privacy_wall.accounting.accountants import (
    Accountant,
    PldAccountant,
    PrivacyCost,
    RdpAccountant,
    get_accountant,
    privacy_cost,
    resolve_accountant,
)
from privacy_wall.accounting.events import vips_job_event
from privacy_wall.accounting.sigma_range import SIGMA_MAX, SIGMA_MIN


def epsilon(
    sigma: float,
    sample_size: int,
    population: int,
    iterations: int,
    delta: float,
    accountant: Accountant | str | None = None,
) -> float:
    """Epsilon spent by a job, on its own (default: the configured accountant)."""
    return privacy_cost(vips_job_event(sigma, sample_size, population, iterations), accountant).epsilon(delta)


class CalibrationError(ValueError):
    """No noise multiplier can meet the target."""


def calibrate_sigma(
    target_epsilon: float,
    sample_size: int,
    population: int,
    iterations: int,
    delta: float,
    spent: PrivacyCost | None = None,
    rel_tol: float = 1e-4,
    accountant: Accountant | str | None = None,
) -> float:
    """Smallest sigma with epsilon(spent + job cost) <= target_epsilon, to relative tolerance rel_tol.

    The returned sigma is always on the safe side: its epsilon is <= target (bisection keeps the upper end).
    The accountant is spent's, else the one given, else the configured one.
    """
    chosen = get_accountant(spent.accountant) if spent is not None else resolve_accountant(accountant)
    base = spent if spent is not None else chosen.zero()
    if not target_epsilon > 0:
        raise CalibrationError("target epsilon must be > 0")
    if base.epsilon(delta) >= target_epsilon:
        raise CalibrationError("the budget already spent leaves nothing for this job")

    prices: dict[float, float] = {}  # sigma -> epsilon of spent + job: each sigma is priced once

    def price(sigma: float) -> float:
        if sigma not in prices:
            job = chosen.cost(vips_job_event(sigma, sample_size, population, iterations))
            prices[sigma] = (base + job).epsilon(delta)
        return prices[sigma]

    def fits(sigma: float) -> bool:
        return bool(price(sigma) <= target_epsilon)  # NaN does not fit

    lo, hi = _bracket(fits, *_first_guess(target_epsilon, sample_size, population, iterations, delta, base))
    if lo is None:
        return hi
    # Epsilon is non-increasing in sigma: find the crossing on log sigma (Brent's method), then keep to
    # the side that fits, bisecting should the step past the root not fit.
    step = math.log1p(rel_tol)
    lo_log, hi_log = math.log(lo), math.log(hi)
    sigma_at = {lo_log: lo, hi_log: hi}  # the ends as priced, not exp(log(.)) an ulp away

    def at(log_sigma: float) -> float:
        return sigma_at.get(log_sigma, math.exp(log_sigma))

    def excess(log_sigma: float) -> float:
        value = price(at(log_sigma))  # about a power of sigma: its log is nearly linear in log sigma
        return math.log(value / target_epsilon) if 0 < value < math.inf else (1e300 if value else -1e300)

    # The root is within step/4 of the crossing, so step/2 above it fits (unless epsilon is not smooth there).
    from scipy.optimize import brentq  # ~0.2 s to import: on first calibration only

    root = brentq(excess, lo_log, hi_log, xtol=step / 4)
    candidate = min(root + step / 2, hi_log)
    if fits(at(candidate)):
        return at(candidate)
    lo_log = candidate
    while hi_log - lo_log > step:
        mid = (lo_log + hi_log) / 2
        if fits(at(mid)):
            hi_log = mid
        else:
            lo_log = mid
    return at(hi_log)


def _first_guess(
    target_epsilon: float, sample_size: int, population: int, iterations: int, delta: float, base: PrivacyCost
) -> tuple[float, float | None]:
    """A sigma near the answer, cheap to find, and one known to fit (or None). For `pld` with subsampling:
    the central-limit guess (the composed privacy loss is about mu-GDP, mu^2 its variance: sum over
    releases of q^2 (e^{1/sigma^2} - 1), plus sum 1/sigma^2 on the whole dataset; Dong, Roth, Su 2022,
    Thm 3.5), and the `rdp` sigma of the same composition, which fits as `pld` charges at most what `rdp`
    does. The answer lies between them when the first does not fit. Other accountants: 1, None."""
    if base.accountant != PldAccountant.name or sample_size == population:
        return 1.0, None
    as_rdp = PrivacyCost(base.values, RdpAccountant.name)
    try:
        fitting: float | None = calibrate_sigma(
            target_epsilon, sample_size, population, iterations, delta, as_rdp, 1e-2
        )
    except CalibrationError:
        fitting = None
    from dp_accounting import gaussian_mechanism

    with contextlib.suppress(ValueError, ArithmeticError):
        target_mu2 = 1.0 / gaussian_mechanism.get_sigma_gaussian(target_epsilon, delta) ** 2
        spent_mu2 = base.gaussian_mu_squared + sum(
            count * pld.loss_scale(sigma, size / population) ** 2
            for sigma, size, population, count in base.releases
        )
        left = (target_mu2 - spent_mu2) / (iterations * (sample_size / population) ** 2)
        if left > 0 and math.isfinite(left):
            guess = 1.0 / math.sqrt(math.log1p(left))
            if fitting is None or guess < fitting:
                return guess, fitting
    return (fitting, fitting) if fitting is not None else (1.0, None)


def _bracket(
    fits: Callable[[float], bool], guess: float, fitting: float | None = None
) -> tuple[float | None, float]:
    """(lo, hi) with lo not fitting and hi fitting: (guess, fitting) when the guess does not fit and a
    larger sigma is known to; else grown from the guess by factors 1.1, 1.1^2, 1.1^4, ... (a close guess
    costs few evaluations, a far one few more). lo is None when even the smallest sigma fits; raises
    CalibrationError when even the largest does not."""
    hi = min(max(guess, SIGMA_MIN), SIGMA_MAX)
    lo: float | None = None
    factor = 1.1
    if fitting is not None and hi < fitting and not fits(hi):
        return hi, fitting
    while not fits(hi):
        if hi >= SIGMA_MAX:
            raise CalibrationError(f"target epsilon is unreachable even with sigma = {SIGMA_MAX:g}")
        lo, hi, factor = hi, min(hi * factor, SIGMA_MAX), factor * factor
    while lo is None:
        if hi <= SIGMA_MIN:
            return None, hi
        candidate = max(hi / factor, SIGMA_MIN)
        if fits(candidate):
            hi, factor = candidate, factor * factor
        else:
            lo = candidate
    return lo, hi
