"""Renyi-DP of one release from its privacy profile: the RDP of the pair that every C_q(G_{1/sigma})-DP
mechanism post-processes (docs/design.md section 3).

The argument, for one Gaussian release with noise multiplier sigma on S of N records drawn without
replacement (replace-one neighbours, q = S/N):

1. The release is f-DP with f = C_q(G_{1/sigma}) (Dong, Roth, Su 2022, Thm 4.2), a symmetric trade-off
   function whose privacy profile delta(eps) = max(delta_A(eps), delta_B(eps)) for eps >= 0 is closed-form
   (privacy_wall.accounting.pld.log_profile); delta(-e) = 1 - e^-e + e^-e delta(e).
2. Let (P*, Q*) be a pair with trade-off function f. For every neighbouring D, D', T(M(D), M(D')) >= f, so by
   Blackwell's theorem (Dong, Roth, Su 2022, Thm 2.10) M(D), M(D') are a post-processing of P*, Q*, and Renyi
   divergence does not grow under post-processing (van Erven and Harremoes 2014, Thm 9):
   D_a(M(D) || M(D')) <= D_a(P* || Q*).
3. For any pair, with X = dP/dQ and delta(eps) = E_Q[(X - e^eps)_+], Taylor's formula with integral remainder
   for x^a gives E_Q[X^a] = a (a - 1) integral over the reals of e^((a-1) eps) delta(eps) d eps (the
   boundary terms cancel since E_Q X = 1; infinite when P is not absolutely continuous). With the symmetry
   of step 1:
       exp((a - 1) D_a(P* || Q*)) = 1 + a (a - 1) (I_-(a) + I_+(a)),
       I_-(a) = int_0^inf e^(-a u) delta(u) du,   I_+(a) = int_0^inf e^((a - 1) u) delta(u) du.
   The right side only grows with delta, so upper bounds of delta give an upper bound of the RDP.
4. Numerically, from above: delta is non-increasing, so on a grid u_0 = 0 < u_1 < ... < u_M = U each cell
   contributes at most delta(u_i) times the exact integral of the exponential over it; beyond U, delta <=
   q Phi_c(sigma (u + c) - 1/(2 sigma)) (`_tail_start`), whose integrals against e^((a-1)u) and e^(-a u)
   are closed-form Gaussian integrals. Computed deltas are raised by a relative
   ROUNDING to cover their floating-point error.

The result is valid RDP for each order on its own; privacy_wall.accounting.filter takes, order by order,
the least of it, Wang-Balle-Kasiviswanathan's Theorem 27 and the unamplified a / (2 sigma^2).
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import NDArray
from scipy.special import log_ndtr, logsumexp

from privacy_wall.accounting.pld import log_profile, loss_scale

#: The grid: FINE_CELLS equal cells on [0, s], s the release's loss scale (pld.loss_scale: where the profile
#: falls fastest), then cells growing by the factor 1 + 1/GROWTH up to U.
FINE_CELLS = 256
GROWTH = 512
#: The grid ends where the profile's log has fallen below this (then past -log(1 - q), `_tail_start`);
#: beyond it the Gaussian tail bound takes over.
LOG_TAIL = -700.0
#: Orders whose cell integrals are held at once (16 x ~4,000 cells: half a megabyte).
ORDER_BLOCK = 16
#: Relative allowance for the floating-point error of a computed delta (log_ndtr and a few operations):
#: measured at most 3.2e-7 up to sigma 9,000, so 300 times that margin; above PROFILE_MAX_SIGMA the
#: curve is not used (Thm 27's is taken alone).
ROUNDING = 1e-4
PROFILE_MAX_SIGMA = 1e4


def _reach(sigma: float, q: float) -> float:
    """A loss u with log delta(u) <= LOG_TAIL, by doubling from 1/sigma (the last tried after 80)."""
    u = 1.0 / sigma
    for _ in range(80):
        if float(log_profile(sigma, q, np.array([u]))[0]) <= LOG_TAIL:
            return u
        u *= 2.0
    return u


def _edges(scale: float, reach: float) -> NDArray[np.float64]:
    """0, FINE_CELLS equal steps to min(scale, reach), then a geometric progression to `reach`."""
    fine_end = min(scale, reach)
    fine = np.linspace(0.0, fine_end, FINE_CELLS + 1)
    if fine_end >= reach:
        return fine
    steps = math.ceil(math.log(reach / fine_end) / math.log1p(1.0 / GROWTH))
    coarse = fine_end * (1.0 + 1.0 / GROWTH) ** np.arange(1, steps + 1)
    coarse[-1] = max(coarse[-1], reach)
    return np.concatenate([fine, coarse])


def _tail_start(sigma: float, q: float, reach: float) -> tuple[float, float]:
    """(U, c) with U >= reach such that for u >= U, delta(u) <= q Phi_c(sigma (u + c) - 1/(2 sigma)) and
    U + c >= 1/(2 sigma^2). Beyond -log(1 - q) only delta_A is left (B's loss is unreachable), and
    delta_A <= q Phi_c((x* - 1)/sigma) with x* = sigma^2 log((e^u - 1 + q)/q) + 1/2 >= sigma^2 (u + c) + 1/2,
    c = log(1 - (1 - q) e^-U) - log q: log(e^u - 1 + q) grows at least as fast as u (its slope is
    e^u / (e^u - 1 + q) >= 1), so it is >= log(e^U - 1 + q) + u - U for u >= U (equality at U)."""
    start = max(reach, -math.log1p(-q) * (1.0 + 1e-9) if q < 1.0 else 0.0, 1e-12)
    for _ in range(200):
        shift = -math.log(q) + math.log1p(-(1.0 - q) * math.exp(-start))
        if start + shift >= 1.0 / (2.0 * sigma * sigma):
            return start, shift
        start *= 2.0
    raise OverflowError("no tail start found")


def _log_gaussian_tail(sigma: float, lam: float, start: float) -> float:
    """log of an upper bound on int_start^inf e^(lam u) Phi_c(u sigma - 1/(2 sigma)) du (any real lam),
    using Phi_c(x) <= e^(-x^2 / 2) for x >= 0 (start >= 1/(2 sigma^2): x >= 0 there):
    with mu = 1/sigma the exponent lam u - (u - mu^2/2)^2 / (2 mu^2) peaks at c = mu^2/2 + lam mu^2."""
    mu2 = 1.0 / (sigma * sigma)
    c = mu2 / 2.0 + lam * mu2
    peak = lam * c - (c - mu2 / 2.0) ** 2 / (2.0 * mu2)
    return peak + 0.5 * math.log(2.0 * math.pi * mu2) + float(log_ndtr(-(start - c) / math.sqrt(mu2)))


def _log_cell_integrals(lam: NDArray[np.float64], edges: NDArray[np.float64]) -> NDArray[np.float64]:
    """log of int_{edges[i]}^{edges[i+1]} e^(lam u) du for each order's lam (rows) and cell (columns)."""
    lam = lam[:, None]
    lo, hi = edges[None, :-1], edges[None, 1:]
    width = hi - lo
    small = np.abs(lam) * width < 1e-8
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        # log((e^(lam hi) - e^(lam lo)) / lam) = lam lo + log(expm1(lam width) / lam)
        exact = lam * lo + np.log(np.expm1(lam * width) / np.where(lam == 0.0, 1.0, lam))
    return np.where(small, lam * lo + np.log(width), exact)


def profile_rdp(
    sigma: float, sample_size: int, population: int, orders: tuple[float, ...]
) -> tuple[float, ...]:
    """RDP on `orders` of the pair every C_q(G_{1/sigma})-DP release post-processes, from above (module
    docstring); inf where the bound overflows. Not cached here: the accountant caches each release's cost."""
    q = sample_size / population
    a = np.asarray(orders, dtype=np.float64)
    reach, shift = _tail_start(sigma, q, _reach(sigma, q))
    edges = _edges(loss_scale(sigma, q), reach)
    log_delta = log_profile(sigma, q, edges[:-1]) + math.log1p(ROUNDING)  # delta(u_i) bounds cell i
    terms = []
    for lam in (a - 1.0, -a):  # I_+ and I_-
        blocks = [  # ORDER_BLOCK orders at a time: a few MB at most
            logsumexp(log_delta[None, :] + _log_cell_integrals(lam[i : i + ORDER_BLOCK], edges), axis=1)
            for i in range(0, len(lam), ORDER_BLOCK)
        ]
        terms.append(np.concatenate(blocks))
        # Beyond reach, delta(u) <= q Phi_c(sigma (u + shift) - 1/(2 sigma)): substitute v = u + shift.
        tail = [_log_gaussian_tail(sigma, float(value), reach + shift) - value * shift for value in lam]
        terms.append(math.log(q) + np.array(tail))
    total = np.logaddexp.reduce(np.stack(terms), axis=0)
    with np.errstate(over="ignore"):
        curve = np.logaddexp(0.0, np.log(a) + np.log(a - 1.0) + total) / (a - 1.0)
    return tuple(float(v) if math.isfinite(v) else math.inf for v in curve)
