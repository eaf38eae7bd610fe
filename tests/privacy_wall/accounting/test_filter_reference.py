"""The ledger's price against an accurate reference in every regime (issue 50, item 6): sigma, q, T and delta
from the usual to the extreme (delta 1e-12, T 10^5), and injected under-prices confined to one regime fail.

The reference prices the same filter independently of the ledger's summation and root-finding (it shares only
the closed-form profile, pld.log_profile, which tests/privacy_wall/accounting/test_pld.py checks against
quadrature; tests/privacy_wall/accounting/test_profile_rdp.py checks the curve against each ordered pair's
exact RDP, tiny sigma included): the Gaussian part by the analytic Gaussian mechanism written out
(tests.privacy_wall.test_privacy_audit.gaussian_dp_epsilon); the Renyi curve of a release as the least of
dp_accounting's own Theorem 27 (its scalar loop) and the profile formula of docs/design.md integrated by the
trapezoid rule on ~100,000 points spaced geometrically (0.03%) from the release's loss scale (the ledger sums
from above on ~4,000 cells, so it may only be higher); the mixture's root by bisection on the rule as the docs
state it.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from unittest import mock

import numpy as np
import pytest
from dp_accounting.rdp import rdp_privacy_accountant as dp_rdp
from scipy.special import logsumexp

from privacy_wall.accounting import filter as filter_rule
from privacy_wall.accounting.accountants import ORDERS, FilterAccountant, PrivacyCost
from privacy_wall.accounting.calibration import epsilon
from privacy_wall.accounting.pld import log_profile, loss_scale
from tests.privacy_wall.test_privacy_audit import gaussian_dp_epsilon

#: (sigma, S, N, T, delta): every regime the ledger prices, tiny delta and long T included.
REGIMES = [
    (1.24, 20_000, 400_000, 20, 1e-4),
    (1.0, 130, 32_561, 100, 1e-3),
    (3.0, 651, 32_561, 1_000, 1e-6),
    (10.0, 651, 32_561, 1_000, 1e-12),
    (2.0, 100, 60_000, 100_000, 1e-5),
    (0.7, 10, 100_000, 10_000, 1e-10),
    (0.8, 50, 200, 10, 1e-2),
    (5.0, 1, 1_000_000, 100_000, 1e-12),
    (20.0, 5_000, 10_000, 300, 1e-8),
    (1.5, 1_000, 1_000, 50, 1e-12),
]
#: The ledger sums the profile's integrals from above on a grid: it may exceed the reference by this much.
LOOSENESS = 0.01


@cache
def reference_curve(sigma: float, size: int, population: int) -> tuple[float, ...]:
    """One release's Renyi curve on ORDERS: a / (2 sigma^2) on the whole dataset; else the least of
    dp_accounting's Theorem 27, the unamplified Gaussian and the profile formula by the trapezoid rule."""
    gaussian = ORDERS / (2 * sigma * sigma)
    if size == population:
        return tuple(gaussian)
    q = size / population
    wbk = np.array([dp_rdp._compute_rdp_sample_wor_gaussian_scalar(q, sigma, float(a)) for a in ORDERS])
    first, last = 1e-3 * loss_scale(sigma, q), 100.0 / sigma + 4096.0 / (sigma * sigma)
    u = np.concatenate(
        [[0.0], first * 1.0003 ** np.arange(math.ceil(math.log(last / first) / math.log(1.0003)))]
    )
    log_delta = log_profile(sigma, q, u)
    widths = np.diff(u)
    log_weights = np.log(np.concatenate([[widths[0]], widths[:-1] + widths[1:], [widths[-1]]]) / 2)
    with np.errstate(divide="ignore"):
        plus = logsumexp(log_delta[None, :] + log_weights + (ORDERS[:, None] - 1) * u[None, :], axis=1)
        minus = logsumexp(log_delta[None, :] + log_weights - ORDERS[:, None] * u[None, :], axis=1)
    profile = np.logaddexp(0.0, np.log(ORDERS * (ORDERS - 1)) + np.logaddexp(plus, minus)) / (ORDERS - 1)
    return tuple(np.minimum.reduce([wbk, profile, gaussian]))


def reference_price(sigma: float, size: int, population: int, iterations: int, delta: float) -> float:
    """The filter's epsilon for T equal releases, from the rule as docs/design.md states it."""
    share = filter_rule.GAUSSIAN_SHARE
    gaussian = gaussian_dp_epsilon(math.sqrt(iterations) / sigma, share * delta)
    rdp = iterations * np.array(reference_curve(sigma, size, population))
    log_k = -np.log(ORDERS) + (ORDERS - 1) * np.log1p(-1 / ORDERS)

    def admitted(eps: float) -> bool:
        total = logsumexp(-math.log(len(ORDERS)) - log_k + (ORDERS - 1) * (eps - rdp))
        return bool(total >= -math.log((1 - share) * delta))

    lo, hi = 0.0, 1.0
    while not admitted(hi):
        lo, hi = hi, 2 * hi
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if admitted(mid) else (mid, hi)
    return min(gaussian, hi)


@pytest.mark.slow
@pytest.mark.parametrize("regime", REGIMES)
def test_the_ledger_never_charges_less_than_the_reference_nor_much_more(
    regime: tuple[float, int, int, int, float],
) -> None:
    charged = epsilon(*regime, "filter")
    reference = reference_price(*regime)
    assert reference * (1 - 1e-9) <= charged <= reference * (1 + LOOSENESS), (regime, charged, reference)


@contextmanager
def underpriced_where(condition: str, factor: float = 0.98) -> Iterator[None]:
    """The filter's price times `factor` only where delta < 1e-5, or only where >= 100 releases compose."""
    real = FilterAccountant.epsilon

    def mutated(self: FilterAccountant, cost: PrivacyCost, delta: float) -> float:
        hit = delta < 1e-5 if condition == "tiny delta" else cost.subsampled_releases >= 100
        return factor * real(self, cost, delta) if hit else real(self, cost, delta)

    with mock.patch.object(FilterAccountant, "epsilon", mutated):
        yield


@pytest.mark.slow
@pytest.mark.parametrize("condition", ["tiny delta", "long T"])
def test_an_under_price_confined_to_one_regime_fails_the_reference_check(condition: str) -> None:
    """A 2% under-price only at delta < 1e-5, or only at T >= 100, fails at least one regime above."""
    failures = 0
    with underpriced_where(condition):
        for regime in REGIMES:
            if epsilon(*regime, "filter") < reference_price(*regime) * (1 - 1e-9):
                failures += 1
    assert failures >= 2, f"a 2% under-price at {condition} passes the reference check"
