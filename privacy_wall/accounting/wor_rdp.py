"""Renyi-DP of the Gaussian mechanism on S of N records sampled without replacement, vectorised.

The bound is Theorem 27 of Wang, Balle, Kasiviswanathan (AISTATS 2019, "Subsampled Renyi differential
privacy and analytical moments accountant") for replace-one neighbours, computed exactly as
dp_accounting 0.6.0 computes it (`rdp_privacy_accountant._compute_rdp_sample_wor_gaussian`): for an
integer order a <= 256,

    log A_a = log(1 + sum_{i=2..a} C(a, i) q^i B_i),  B_i = min(4 |Delta^i f|, 2 e^{cgf(i-1)}),

with f = exp(cgf), cgf(x) = x (x + 1) / (2 sigma^2) and Delta^i the i-th forward difference (for i = 2
the term is min(4 (e^{1/sigma^2} - 1), 2 e^{1/sigma^2})); above 256 only the second term of the min
(their "Stirling" branch); fractional orders interpolate the CGF between floor and ceiling (WBK19,
Corollary 10). RDP(a) = log A_a / (a - 1). dp_accounting loops over orders and terms in Python (about
0.3 s per curve); here each curve is a few numpy passes, so calibrating sigma costs milliseconds.
tests/privacy_wall/accounting/test_accountants.py holds the two to 1e-9 relative on a grid of (sigma, q).
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
from numpy.typing import NDArray
from scipy.special import gammaln

Array = NDArray[np.float64]

#: Orders up to this use the forward-difference (exact) term of Theorem 27, as dp_accounting does.
EXACT_MAX_ORDER = 256


#: Terms of the series for the forward differences (below) and the largest difference order needed.
SERIES_TERMS = 600
MAX_DIFFERENCE = EXACT_MAX_ORDER


@lru_cache(maxsize=1)
def _falling_power_table() -> Array:
    """log T[n, k]: (y(y-1))^n = sum_k T[n, k] y(y-1)...(y-k+1), for n <= SERIES_TERMS, k <= MAX_DIFFERENCE.

    Multiplying by y(y-1) maps the falling power of degree m to degrees m+2, m+1, m with coefficients
    1, 2m, m(m-1): all non-negative, so the table is built in log space without cancellation.
    """
    width = MAX_DIFFERENCE + 1
    table = np.full((SERIES_TERMS + 1, width), -np.inf)
    table[0, 0] = 0.0
    m = np.arange(width, dtype=np.float64)
    with np.errstate(divide="ignore"):
        log_2m = np.log(2.0 * m)
        log_mm1 = np.log(m * (m - 1.0))
    for n in range(SERIES_TERMS):
        row = table[n]
        nxt = np.full(width, -np.inf)
        nxt[2:] = row[:-2]
        nxt[1:] = np.logaddexp(nxt[1:], row[:-1] + log_2m[:-1])
        nxt = np.logaddexp(nxt, row + log_mm1)
        table[n + 1] = nxt
    return table


def log_forward_differences(sigma: float) -> Array:
    """Upper bounds on log Delta^k g(0), k = 0..MAX_DIFFERENCE, for g(y) = exp(y (y - 1) / (2 sigma^2)).

    g(y) = sum_n c^n (y(y-1))^n / n! with c = 1 / (2 sigma^2), and Delta^k of a falling power of degree
    k at 0 is k!, of any other degree 0, so Delta^k g(0) = k! sum_n c^n T[n, k] / n!: a sum of positive
    terms (dp_accounting's alternating-sign recursion loses every digit at large sigma and high order,
    where its value and ours differ in the third digit). The series is cut after SERIES_TERMS terms and
    the rest bounded: k! T[n, k] <= (k(k-1))^n (evaluate (y(y-1))^n at y = k), so the remainder is at
    most the Poisson tail sum_{n > N} lam^n / n! with lam = c k (k-1), bounded by its first term over
    1 - lam / (N + 2). Where that bound is useless the result is large and Theorem 27's other term wins.
    """
    table = _falling_power_table()
    c = 1.0 / (2.0 * sigma * sigma)
    n = np.arange(SERIES_TERMS + 1, dtype=np.float64)
    k = np.arange(MAX_DIFFERENCE + 1, dtype=np.float64)
    log_weights = n * math.log(c) - gammaln(n + 1)
    series = np.logaddexp.reduce(table + log_weights[:, None], axis=0) + gammaln(k + 1)
    lam = c * k * np.maximum(k - 1.0, 0.0)
    big_n = float(SERIES_TERMS)
    with np.errstate(divide="ignore", invalid="ignore"):
        tail = (big_n + 1) * np.log(lam) - gammaln(big_n + 2) - np.log1p(-lam / (big_n + 2))
    tail = np.where(lam < big_n + 2, tail, np.inf)
    tail = np.where(lam == 0, -np.inf, tail)
    bound: Array = np.logaddexp(series, tail)
    return bound


@lru_cache(maxsize=8)
def _term_layout(orders: tuple[int, ...]) -> tuple[Array, Array, NDArray[np.intp], NDArray[np.intp]]:
    """For the integer orders given: each (order, i) pair with i = 2..order, flattened.

    Returns i, log C(order, i), the start of each order's segment, and each pair's order index.
    """
    i_values: list[Array] = []
    alphas: list[Array] = []
    owner: list[NDArray[np.intp]] = []
    for index, alpha in enumerate(orders):
        terms = np.arange(2, alpha + 1, dtype=np.float64)
        i_values.append(terms)
        alphas.append(np.full(terms.shape, float(alpha)))
        owner.append(np.full(terms.shape, index, dtype=np.intp))
    i = np.concatenate(i_values)
    a = np.concatenate(alphas)
    log_comb = gammaln(a + 1) - gammaln(i + 1) - gammaln(a - i + 1)
    sizes = np.array([alpha - 1 for alpha in orders])
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.intp)
    return i, log_comb, starts, np.concatenate(owner)


def log_moments(q: float, sigma: float, orders: tuple[int, ...]) -> Array:
    """log A_a of Theorem 27 at each integer order a >= 2 of `orders` (see the module docstring)."""
    i, log_comb, starts, owner = _term_layout(orders)
    alpha = np.asarray(orders, dtype=np.float64)[owner]
    two_sigma2 = 2.0 * sigma * sigma
    func2 = 2.0 / two_sigma2
    log_f2m1 = func2 + math.log1p(-math.exp(-func2))
    cgf_bound = math.log(2.0) + (i - 1.0) * i / two_sigma2
    exact = alpha <= EXACT_MAX_ORDER
    if exact.any():
        deltas = log_forward_differences(sigma)
        lo = np.minimum(2 * np.floor(i / 2.0), MAX_DIFFERENCE).astype(np.intp)
        hi = np.minimum(2 * np.ceil(i / 2.0), MAX_DIFFERENCE).astype(np.intp)
        diff_bound = math.log(4.0) + 0.5 * (deltas[lo] + deltas[hi])
        body = np.where(exact, np.minimum(diff_bound, cgf_bound), cgf_bound)
    else:
        body = cgf_bound
    body = np.where(i == 2, min(math.log(4.0) + log_f2m1, func2 + math.log(2.0)), body)
    with np.errstate(divide="ignore"):
        terms = body + i * math.log(q) + log_comb
    peak = np.maximum.reduceat(terms, starts)
    peak = np.maximum(peak, 0.0)  # the leading 1 of A_a
    with np.errstate(invalid="ignore", over="ignore"):
        scaled = np.add.reduceat(np.exp(terms - peak[owner]), starts)
        out = peak + np.log(scaled + np.exp(-peak))
    return np.where(np.isfinite(peak), out, np.inf)


def sampled_gaussian_rdp(q: float, sigma: float, orders: Array) -> Array:
    """RDP at each order (>= 1) of the Gaussian with multiplier sigma on a fraction q sampled WOR."""
    if q == 0:
        return np.zeros(len(orders))
    if q == 1:
        return orders / (2.0 * sigma * sigma)
    floors = np.floor(orders).astype(int)
    ceils = np.ceil(orders).astype(int)
    needed = tuple(sorted({int(a) for a in np.concatenate([floors, ceils]) if a >= 2}))
    logs = dict(zip(needed, log_moments(q, sigma, needed), strict=True))
    logs[1] = 0.0
    x = np.array([logs[int(a)] for a in floors])
    y = np.array([logs[int(a)] for a in ceils])
    t = orders - floors
    with np.errstate(invalid="ignore"):
        rdp = ((1.0 - t) * x + t * y) / (orders - 1.0)
    return np.where(np.isnan(rdp), np.inf, rdp)
