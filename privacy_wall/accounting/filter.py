"""The privacy filter every budget admits by: valid under fully adaptive composition (docs/design.md
section 3).

Setting. Releases t = 1, 2, ... on one dataset are Gaussian mechanisms on a sensitivity-1 query with noise
multiplier sigma_t, on S_t of N records drawn uniformly without replacement (S_t = N: the whole dataset),
under replace-one neighbours. Every parameter of release t (sigma_t, S_t, the query, whether it happens at
all: a new job, a cancelled one, a retry) may depend on every output before it ("fully adaptive", Rogers,
Roth, Ullman, Vadhan 2016); it may not depend on the data otherwise. The ledger charges release t before it
leaves the gate and only if the state after it passes the rule below, at the dataset's cap (eps, delta).

The rule is the union of two filters, each given its own share of delta:

G (Gaussian part, delta_G = GAUSSIAN_SHARE delta): admit while sum_t 1/sigma_t^2 <= mu^2, where mu-GDP is
  (eps, delta_G)-DP (Dong, Roth, Su 2022, Cor. 2.13: the analytic Gaussian mechanism). A release on the
  whole dataset is exactly G_{1/sigma}; a subsampled one is C_q(G_{1/sigma})-DP (ibid., Thm 4.2), and
  C_q(f) >= f, so it is 1/sigma-GDP too. Smith and Thakurta (2022, "Fully adaptive composition for Gaussian
  differential privacy", arXiv 2210.17520, main theorem): when each mechanism is mu_t-GDP with mu_t chosen
  from the outputs before it and the analyst stops once sum mu_t^2 would exceed mu^2, the interaction is
  mu-GDP. So G is exact for full-batch releases (the same price as the non-adaptive composition).

R (Renyi part, delta_R = (1 - GAUSSIAN_SHARE) delta): with rho(a) = sum_t rho_t(a) the releases' Renyi-DP
  curves on ORDERS (a / (2 sigma^2) for S = N; for S < N the least of Wang, Balle, Kasiviswanathan 2019,
  Thm 27, and the RDP from C_q's privacy profile, privacy_wall.accounting.profile_rdp), admit
  while
      sum_a (w / k_a) exp((a - 1)(eps - rho(a))) >= 1 / delta_R,   w = 1 / |ORDERS|,
      k_a = (1/a) (1 - 1/a)^(a - 1).
  Proof. Let L_t be the privacy loss of outputs 1..t for a pair (D, D') and P the output law on D. For each
  a, Z_t(a) = exp((a - 1)(L_t - rho_t(a))) is a non-negative P-supermartingale: rho_t(a) is fixed by the
  outputs before release t, and E_P[exp((a - 1) l_t) | past] = exp((a - 1) D_a) <= exp((a - 1) rho_t(a)) for
  the release's conditional loss l_t (Feldman and Zrnic 2021, "Individual privacy accounting via a Renyi
  filter", Thm 3.1, whose proof this is). So E_P[Z_T(a)] <= 1 at the stopping time T (optional stopping).
  For every real x and every a, (1 - e^(eps - x))_+ <= k_a exp((a - 1)(x - eps)) (the maximum of the
  ratio, at e^(eps - x) = (a - 1)/a; the improved conversion of Balle et al. 2020, Thm 21, and Canonne,
  Kamath, Steinke 2020, Prop. 12, in pointwise form). With c_a = delta_R w exp((a - 1)(eps - rho(a))) / k_a,
  the rule says sum_a c_a >= 1, so (1 - e^(eps - x))_+ <= sum_a c_a k_a exp((a - 1)(x - eps)) at every x,
  and delta(eps) = E_P[(1 - e^(eps - L_T))_+] <= delta_R sum_a w E_P[Z_T(a)] <= delta_R. The mixture over
  orders is at least as good as the union bound over them (Lecuyer 2021, "Practical privacy filters and
  odometers with Renyi differential privacy", which admits while some a has rho(a) within its share): the
  union's condition implies this one.

Why the union of G and R is a filter at (eps, delta_G + delta_R). Both rules are monotone: each release
only adds to sum 1/sigma^2 and to every rho(a). Let M_G (M_R) be the interaction the same analyst would have
with rule G (R) alone, and B_G the set of transcripts where G still holds at the end, B_R the rest (where R
holds: the union admitted every release). On B_G the transcript is M_G's (G held at every step, so M_G
stopped where the union did), on B_R it is M_R's; both sets are functions of the transcript. For every event
E: P_D(E) = P_D(M_G in E n B_G) + P_D(M_R in E n B_R) <= e^eps P_D'(E n B_G) + delta_G + e^eps P_D'(E n B_R)
+ delta_R = e^eps P_D'(E) + delta. Refunds, cancellations and withdrawals change nothing: the rule reads
only releases that were made, and a job's reservation was admitted with all its releases.

A release with sigma = 0 (or so small sigma^2 underflows) leaves no guarantee: the price is inf.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import NDArray
from scipy.special import logsumexp

#: The Gaussian part's share of the dataset's delta (the Renyi part gets the rest). Full-batch prices move
#: by its log, subsampled ones by the log of the rest. At 0.998 (since migration 0014; 0.9 before) 10
#: full-batch releases at eps 0.8, delta 1e-5 need sigma 14.462, within 0.02% of the exact 14.460 at the
#: whole delta (issue 50 keeps full-batch prices where they were), while the Renyi part pays log(500) nats
#: in its conversion instead of log(10): DPVI's usual schedule (T 1,000, S N/50, eps 1, delta 1e-6)
#: needs sigma 4.21 instead of 3.81, the paper's LDA schedule costs eps 2.51 instead of 1.98. The service's
#: automatic schedules are full-batch but for DPVI above eps x N = 150,000 (docs/design.md section 3).
GAUSSIAN_SHARE = 0.998

#: The root of the Renyi rule is found to this absolute tolerance and then rounded up by it (never below).
TOLERANCE = 1e-12


def log_conversion(orders: NDArray[np.float64]) -> NDArray[np.float64]:
    """log k_a = -log a + (a - 1) log(1 - 1/a), of the bound (1 - e^(eps - x))_+ <= k_a e^((a-1)(x - eps))."""
    return np.asarray(-np.log(orders) + (orders - 1.0) * np.log1p(-1.0 / orders))


def renyi_epsilon(orders: NDArray[np.float64], rdp: NDArray[np.float64], delta: float) -> float:
    """The least eps >= 0 at which rule R (module docstring) admits the Renyi curve `rdp` on `orders` at
    delta; inf where no order has a finite curve. Never below the exact root (to TOLERANCE)."""
    rdp = np.asarray(rdp, dtype=np.float64)
    finite = np.isfinite(rdp)
    if not finite.any() or not delta > 0.0:  # a share of a subnormal delta can round to 0: no guarantee
        return math.inf
    a = orders[finite]
    slope = a - 1.0
    offset = -math.log(len(orders)) - log_conversion(a) - slope * rdp[finite]
    target = -math.log(delta)

    def excess(eps: float) -> float:
        return float(logsumexp(offset + slope * eps)) - target

    if excess(0.0) >= 0.0:
        return 0.0
    # Each order alone bounds the root from above (its term reaches the target), and the sum of |orders|
    # terms is at most |orders| times the largest, which bounds it from below.
    alone = (target - offset) / slope
    hi = float(alone.min())
    lo = max(0.0, float(((target - math.log(len(a)) - offset) / slope).min()))
    while excess(hi) < 0.0:  # the bound met the target up to rounding: step up until it is admitted
        hi += TOLERANCE + 1e-15 * abs(hi)
    if hi <= lo or excess(lo) >= 0.0:  # the bracket is within rounding: hi is admitted
        return hi
    from scipy.optimize import brentq  # ~0.2 s to import: on first pricing only

    root = float(brentq(excess, lo, hi, xtol=TOLERANCE))
    safe = root + TOLERANCE
    return safe if excess(safe) >= 0.0 else hi
