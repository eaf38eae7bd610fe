"""Accountants for comparison experiments only, which the ledger never uses: advanced composition (Dwork
and Roth Thm 3.20) of amplified Gaussian releases and its calibration, and autodp's own answer with its
continuous order search (an audit of the `paper` accountant's grid of orders).
"""

from __future__ import annotations

import math

import numpy as np

from privacy_wall.accounting.accountants import exact_orders
from privacy_wall.accounting.calibration import CalibrationError
from privacy_wall.accounting.sigma_range import SIGMA_MAX, SIGMA_MIN


def strong_composition_epsilon(
    sigma: float, sample_size: int, population: int, iterations: int, delta: float
) -> float:
    """Epsilon by advanced composition (Dwork and Roth Thm 3.20) of T amplified Gaussian releases.

    Half of delta is the composition slack delta''; the other half is split over the T releases, each of
    which is amplified by sampling without replacement (Balle, Barthe, Gaboardi 2018, substitution):
    eps' = log(1 + q (e^eps0 - 1)), delta' = q delta0, where eps0 is the analytic Gaussian mechanism's
    epsilon at delta0 (Balle and Wang 2018; valid for every eps0, unlike the classic 1.25/delta bound).
    Only for comparison experiments; the ledger never uses it.
    """
    if sigma <= 0:
        return math.inf
    q = sample_size / population
    if q == 0:
        return 0.0
    delta_slack = delta / 2
    delta0 = delta / 2 / (iterations * q)
    if delta0 >= 1:
        delta0 = 1 - 1e-12
    from autodp import dp_bank  # comparisons only: not loaded by a fit

    eps0 = float(dp_bank.get_eps_ana_gaussian(sigma, delta0))
    eps1 = float(np.logaddexp(math.log1p(-q), math.log(q) + eps0)) if q < 1 else eps0
    t = iterations
    if eps1 > 700:
        return math.inf
    return math.sqrt(2 * t * math.log(1 / delta_slack)) * eps1 + t * eps1 * math.expm1(eps1)


def calibrate_sigma_strong(
    target_epsilon: float, sample_size: int, population: int, iterations: int, delta: float
) -> float:
    """Smallest sigma with strong_composition_epsilon <= target (comparison experiments only)."""

    def gap(log_sigma: float) -> float:
        return (
            strong_composition_epsilon(math.exp(log_sigma), sample_size, population, iterations, delta)
            - target_epsilon
        )

    lo, hi = math.log(SIGMA_MIN), math.log(SIGMA_MAX)
    if gap(hi) > 0:
        raise CalibrationError("target epsilon is unreachable by strong composition")
    if gap(lo) <= 0:
        return SIGMA_MIN
    from scipy.optimize import brentq

    return math.exp(brentq(gap, lo, hi, xtol=1e-8)) * (1 + 1e-9)


def autodp_reference_epsilon(
    sigma: float, sample_size: int, population: int, iterations: int, delta: float
) -> float:
    """autodp's own anaRDPacct answer, with its continuous order search (used to audit our grid).

    Same bound and the same number of exact orders as the `paper` accountant, which differs only by our grid.
    """
    from autodp import rdp_acct, rdp_bank  # audits only: not loaded by a fit

    orders = exact_orders(sigma, sample_size / population)
    acct = rdp_acct.anaRDPacct(m=orders, m_max=orders)

    def gaussian(alpha: float) -> float:
        return float(rdp_bank.RDP_gaussian({"sigma": sigma}, alpha))

    acct.compose_subsampled_mechanism(
        gaussian, sample_size / population, coeff=iterations, improved_bound_flag=True
    )
    return float(acct.get_eps(delta))
