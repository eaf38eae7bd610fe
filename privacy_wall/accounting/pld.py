"""Tight privacy loss distributions (PLDs) of Gaussian releases on S of N records (docs/design.md section 3).

The analysis (replace-one neighbours, exactly S of N records drawn uniformly without replacement, one
Gaussian with noise multiplier sigma on a sensitivity-1 query per release):

- Dong, Roth, Su, "Gaussian differential privacy" (JRSS-B 2022), Thm 4.2: if M is f-DP under replace-one
  on samples of size m, M applied to m of n records drawn without replacement is C_q(f)-DP, q = m/n,
  C_q(f) = min{f_q, f_q^-1}** with f_q = q f + (1 - q) Id. Here f = G_{1/sigma}.
- The privacy profile of C_q(f) is max(delta_A(eps), delta_B(eps)) for every real eps (the convex
  conjugate of a biconjugate is the conjugate), where delta_A is the hockey-stick curve of
  A = ((1-q) N(0, s^2) + q N(1, s^2), N(0, s^2)) and delta_B that of its swap; both in closed form with Phi
  (`log_profile`). The profile is symmetric: delta(-e) = 1 - e^-e + e^-e delta(e).
- Doroshenko, Ghazi, Kamath, Kumar, Manurangsi, "Connect the dots" (PETS 2022), Alg. 1: the PMF built from
  the profile at eps = k h (dp_accounting's `create_pmf_pessimistic_connect_dots_fixed_gap`) dominates it;
  tail mass moved to +infinity (upper) or up to the lowest kept loss (lower) keeps it dominating.
- Dong, Roth, Su Thm 3.2: trade-off functions of adaptive releases compose (fresh sampling each
  iteration), and domination survives composition; dp_accounting composes PMFs by FFT, pessimistically.

Composing the two ordered pairs separately and taking the larger epsilon is NOT valid here (it is for
Poisson sampling under add/remove): the symmetrised profile is what composes. At q = 1 the construction
is the Gaussian mechanism's PLD.

Discretisation: one grid h = 2^-k per composition, at most 2^-10 and at most an eighth of the releases'
loss scale (scale = q sqrt(e^{1/sigma^2} - 1), at most 1/sigma: the spread of one release's privacy loss),
averaged with weights T scale over the composition (`grid`); coarsened only if a release's PMF would
exceed MAX_POINTS points. On every case of tests/privacy_wall/accounting/test_pld.py it charges
within 2% of the exact value (within 0.2% where that is known to this precision); coarser grids only
ever charge more, never less.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from functools import lru_cache
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray
from scipy.special import log_ndtr

from privacy_wall.accounting.convolution import convolution_power

if TYPE_CHECKING:
    from dp_accounting.pld import pld_pmf


def _dense(*args: Any, **kwargs: Any) -> pld_pmf.DensePLDPmf:
    """dp_accounting's DensePLDPmf, imported on first use (about a second: a sigma = 0 fit never needs it)."""
    from dp_accounting.pld import pld_pmf

    return pld_pmf.DensePLDPmf(*args, **kwargs)


#: A group of identical releases: (sigma, sample_size, population, count).
Group = tuple[float, int, int, int]

#: Mass cut from each tail of one release's PMF (the upper tail goes to +infinity, i.e. into delta).
RELEASE_TAIL = 1e-20
#: Mass cut from each tail after a composition (likewise pessimistic).
COMPOSITION_TAIL = 1e-18
#: The coarsest grid and the largest PMF of one release (then the grid is coarsened instead).
COARSEST_GRID = 2.0**-10
MAX_POINTS = 2**20
#: The largest composed PMF the grid plans for (the grid is coarsened beyond it: epsilons in the thousands).
MAX_COMPOSED = 2**22
#: Composed PMFs kept per process (bytes of their probability arrays; self-composed groups and single
#: releases a quarter of that each).
CACHE_BYTES = 128 * 2**20


def log_profile(sigma: float, q: float, eps: NDArray[np.float64]) -> NDArray[np.float64]:
    """log max(delta_A(eps), delta_B(eps)) for eps >= 0 (see the module docstring), computed in log space.

    A: x ~ P = (1-q) N(0, s^2) + q N(1, s^2) against Q = N(0, s^2); P/Q exceeds e^eps exactly above
    x* = s^2 log((e^eps - 1 + q) / q) + 1/2, so delta_A = q Phi_c((x*-1)/s) - (e^eps - 1 + q) Phi_c(x*/s).
    B: Q against P; Q/P exceeds e^eps below x** = s^2 log((e^-eps - 1 + q) / q) + 1/2 (when e^-eps > 1 - q),
    so delta_B = Phi(x**/s) - e^eps ((1-q) Phi(x**/s) + q Phi((x**-1)/s)).
    """
    eps = np.asarray(eps, dtype=np.float64)
    s2 = sigma * sigma
    with np.errstate(all="ignore"):
        # log(e^eps - (1 - q)) = eps + log(1 - (1 - q) e^-eps): finite at every eps >= 0 (e^eps overflows)
        log_gap = eps + np.log1p(-(1.0 - q) * np.exp(-eps))
        x = s2 * (log_gap - math.log(q)) + 0.5
        upper = math.log(q) + log_ndtr((1.0 - x) / sigma)
        lower = log_gap + log_ndtr(-x / sigma)
        log_a = np.where(lower < upper, upper + np.log(-np.expm1(lower - upper)), -np.inf)
        if q >= 1.0:
            return np.asarray(log_a)
        gap_b = np.exp(-eps) - (1.0 - q)
        reachable = gap_b > 0
        xb = s2 * (np.log(np.where(reachable, gap_b, 1.0)) - math.log(q)) + 0.5
        first = log_ndtr(xb / sigma)
        second = eps + np.logaddexp(math.log1p(-q) + first, math.log(q) + log_ndtr((xb - 1.0) / sigma))
        log_b = np.where(reachable & (second < first), first + np.log(-np.expm1(second - first)), -np.inf)
    return np.asarray(np.maximum(log_a, log_b))


def profile(sigma: float, q: float, eps: NDArray[np.float64]) -> NDArray[np.float64]:
    """delta(eps) of C_q(G_{1/sigma}) for every real eps (by symmetry on the negative side)."""
    eps = np.asarray(eps, dtype=np.float64)
    positive = np.exp(log_profile(sigma, q, np.abs(eps)))
    with np.errstate(over="ignore", invalid="ignore"):  # only where eps >= 0, which np.where discards
        negative = -np.expm1(eps) + np.exp(eps) * positive
    return np.asarray(np.clip(np.where(eps >= 0, positive, negative), 0.0, 1.0))


def loss_scale(sigma: float, q: float) -> float:
    """The spread of one release's privacy loss: q sqrt(e^{1/sigma^2} - 1), at most 1/sigma."""
    mu2 = 1.0 / (sigma * sigma)
    return min(q * math.sqrt(math.expm1(min(mu2, 700.0))), math.sqrt(mu2))


@lru_cache(maxsize=4096)
def _upper_loss(sigma: float, q: float) -> float:
    """An eps with delta(eps) <= RELEASE_TAIL for one release, within 1e-5 (relative) of the smallest: the
    first power of two past it, then two rounds of 256 evenly spaced points (the profile falls in eps).
    Any such eps is valid (the mass above it goes to +infinity); a tighter one only trims points."""
    log_tail = math.log(RELEASE_TAIL)
    powers = 1e-6 * 2.0 ** np.arange(64, dtype=np.float64)
    below = log_profile(sigma, q, powers) <= log_tail
    if not below.any():
        raise OverflowError("one release's privacy loss has no finite scale")
    hi = float(powers[np.argmax(below)])
    lo = hi / 2.0
    for _ in range(2):
        points = np.linspace(lo, hi, 257)
        first = int(np.argmax(log_profile(sigma, q, points) <= log_tail))  # points[-1] = hi always qualifies
        lo, hi = float(points[max(first - 1, 0)]), float(points[first])
    return hi


def grid(groups: tuple[Group, ...]) -> float:
    """The composition's discretisation interval h = 2^-k (module docstring): at most 2^-10 and at most
    sum_g T_g s_g^2 / (8 sum_g T_g s_g), s_g the loss scale of group g's releases (for one kind of release
    s/8). Discretising a release of scale s on a grid h > s adds about h s to its loss variance, so the
    relative error of the composition's spread stays small whatever a group of small weight needs alone;
    and a new job that adds little to a ledger leaves its grid (and its cached PMFs) as they are."""
    weights = [(count, loss_scale(sigma, size / population)) for sigma, size, population, count in groups]
    spread = sum(count * scale * scale for count, scale in weights)
    mass = sum(count * scale for count, scale in weights)
    if not math.isfinite(spread):
        raise OverflowError("the composition's privacy loss has no finite scale")
    h = COARSEST_GRID
    if mass > 0 and spread > 0:
        h = min(h, 2.0 ** math.floor(math.log2(spread / mass / 8.0)))
    widest = max(_upper_loss(sigma, size / population) for sigma, size, population, _ in groups)
    # The composed loss has mean about sum T s^2 / 2 (the releases' KL divergences) and spread
    # sqrt(sum T s^2); where that would not fit MAX_COMPOSED points (epsilons in the thousands), coarsen.
    reach = spread / 2.0 + 40.0 * math.sqrt(spread)
    while 2.0 * widest / h > MAX_POINTS or reach / h > MAX_COMPOSED:
        h *= 2.0
    return h


class _PmfCache:
    """PMFs keyed by (groups in order, h), least recently used evicted beyond `max_bytes`."""

    def __init__(self, max_bytes: int) -> None:
        self._max_bytes = max_bytes
        self._bytes = 0
        self._items: OrderedDict[tuple[tuple[Group, ...], float], pld_pmf.DensePLDPmf] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: tuple[tuple[Group, ...], float]) -> pld_pmf.DensePLDPmf | None:
        with self._lock:
            found = self._items.get(key)
            if found is not None:
                self._items.move_to_end(key)
            return found

    @property
    def bytes(self) -> int:
        return self._bytes

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._bytes = 0

    def put(self, key: tuple[tuple[Group, ...], float], pmf: pld_pmf.DensePLDPmf) -> None:
        size = 8 * pmf.size
        with self._lock:
            if key in self._items or size > self._max_bytes:
                return
            self._items[key] = pmf
            self._bytes += size
            while self._bytes > self._max_bytes:
                _, evicted = self._items.popitem(last=False)
                self._bytes -= 8 * evicted.size


_COMPOSED = _PmfCache(CACHE_BYTES)
_GROUPS = _PmfCache(CACHE_BYTES // 4)
_RELEASES = _PmfCache(CACHE_BYTES // 4)


def release_pmf(sigma: float, sample_size: int, population: int, h: float) -> pld_pmf.DensePLDPmf:
    """The pessimistic connect-the-dots PMF of one release on the grid h (cached)."""
    key = (((sigma, sample_size, population, 1),), h)
    found = _RELEASES.get(key)
    if found is not None:
        return found
    q = sample_size / population
    top = math.ceil(_upper_loss(sigma, q) / h)
    ks = np.arange(-top, top + 1, dtype=np.float64)
    pmf = _cut(connect_the_dots(h, -top, profile(sigma, q, ks * h)), RELEASE_TAIL)
    _RELEASES.put(key, pmf)
    return pmf


def connect_the_dots(h: float, lowest: int, deltas: NDArray[np.float64]) -> pld_pmf.DensePLDPmf:
    """The pessimistic connect-the-dots PMF on losses (lowest + i) h of the profile values `deltas` there
    (Doroshenko et al. 2022, Alg. 1): dp_accounting's `create_pmf_pessimistic_connect_dots_fixed_gap`
    (same formula, same output: tested) built as one array instead of through a dict of every point.
    Masses: p_1 = 1 - d_1 + (d_2 - d_1)/(e^h - 1); p_i = ((d_{i+1} - d_i) - e^h (d_i - d_{i-1}))/(e^h - 1);
    p_n = (d_n - d_{n-1})/(e^-h - 1); d_n at +infinity; deltas made non-increasing first, negatives cut."""
    deltas = np.minimum.accumulate(np.asarray(deltas, dtype=np.float64))
    if len(deltas) < 2 or deltas[0] > 1.0 or deltas[-1] < 0.0:
        raise ValueError("connect-the-dots needs at least two profile values in [0, 1]")
    steps = np.diff(deltas)
    probs = np.empty_like(deltas)
    probs[0] = 1.0 - deltas[0] + steps[0] / math.expm1(h)
    probs[1:-1] = (steps[1:] - steps[:-1] * math.exp(h)) / math.expm1(h)
    probs[-1] = steps[-1] / math.expm1(-h)
    return _dense(h, lowest, np.maximum(probs, 0.0), float(deltas[-1]), pessimistic_estimate=True)


def _cut(pmf: pld_pmf.DensePLDPmf, tail: float) -> pld_pmf.DensePLDPmf:
    """`pmf` with at most `tail` of mass cut from each end, pessimistically: the lower cut is added to the
    lowest kept loss, the upper cut to the mass at +infinity."""
    probs = np.maximum(np.asarray(pmf._probs, dtype=np.float64), 0.0)
    start = int(np.searchsorted(np.cumsum(probs), tail, side="right"))
    end = len(probs) - int(np.searchsorted(np.cumsum(probs[::-1]), tail, side="right"))
    end = max(end, start + 1)
    kept = probs[start:end].copy()
    kept[0] += probs[:start].sum()
    return _dense(
        pmf._discretization,
        pmf._lower_loss + start,
        kept,
        pmf._infinity_mass + float(probs[end:].sum()),
        pessimistic_estimate=True,
    )


def group_pmf(group: Group, h: float) -> pld_pmf.DensePLDPmf:
    """`count` adaptive releases of one kind, by FFT self-composition (cached)."""
    sigma, size, population, count = group
    if count == 1:
        return release_pmf(sigma, size, population, h)
    found = _GROUPS.get(((group,), h))
    if found is not None:
        return found
    pmf = _self_composed(release_pmf(sigma, size, population, h), count)
    _GROUPS.put(((group,), h), pmf)
    return pmf


def _self_composed(pmf: pld_pmf.DensePLDPmf, count: int) -> pld_pmf.DensePLDPmf:
    """`pmf` composed with itself `count` times (`_composed_powers`)."""
    return _composed_powers(((pmf, count),))


def _composed_pair(first: pld_pmf.DensePLDPmf, second: pld_pmf.DensePLDPmf) -> pld_pmf.DensePLDPmf:
    """Two PMFs on one grid composed (`_composed_powers`)."""
    return _composed_powers(((first, 1), (second, 1)))


def _composed_powers(parts: tuple[tuple[pld_pmf.DensePLDPmf, int], ...]) -> pld_pmf.DensePLDPmf:
    """The composition of each PMF `count` times: `convolution.convolution_power` (every mass an upper bound
    of the exact one, whatever the FFT's rounding; at most COMPOSITION_TAIL cut by Chernoff bounds and counted
    at +infinity, as dp_accounting's `self_compose` does), the masses at +infinity composed exactly."""
    lower, masses = convolution_power(
        [(np.asarray(pmf._probs, dtype=np.float64), count) for pmf, count in parts], COMPOSITION_TAIL
    )
    finite = sum(count * math.log1p(-pmf._infinity_mass) for pmf, count in parts)
    return _dense(
        parts[0][0]._discretization,
        sum(int(pmf._lower_loss) * count for pmf, count in parts) + lower,
        masses,
        COMPOSITION_TAIL - math.expm1(finite),
        pessimistic_estimate=True,
    )


def clear_caches() -> None:
    """Forget every cached PMF (benchmarks measure cold compositions with it)."""
    for cache in (_COMPOSED, _GROUPS, _RELEASES):
        cache.clear()


def cached_bytes() -> int:
    """Bytes the PMF caches hold now (at most 1.5 CACHE_BYTES)."""
    return _COMPOSED.bytes + _GROUPS.bytes + _RELEASES.bytes


def composed_pmf(groups: tuple[Group, ...], h: float) -> pld_pmf.DensePLDPmf:
    """The PMF of the groups composed in the given order, a function of (groups, h) alone: the groups are
    cut into blocks of 2^k consecutive groups by the binary digits of their number (13 = 8 + 4 + 1), each
    block the composition of its two halves, and the blocks are composed left to right. Every block and
    result is cached under its exact groups and grid, so extending a ledger by one job costs about
    log2(jobs) FFT compositions, and no price depends on what a process priced before (issue 50)."""
    found = _COMPOSED.get((groups, h))
    if found is not None:
        return found
    pmf: pld_pmf.DensePLDPmf | None = None
    start = 0
    for bit in reversed(range(len(groups).bit_length())):
        size = 1 << bit
        if len(groups) & size:
            part = _block(groups[start : start + size], h)
            pmf = part if pmf is None else _composed_pair(pmf, part)
            start += size
    assert pmf is not None
    _COMPOSED.put((groups, h), pmf)
    return pmf


def _block(groups: tuple[Group, ...], h: float) -> pld_pmf.DensePLDPmf:
    """The composition of 2^k consecutive groups: of its two halves (cached)."""
    if len(groups) == 1:
        return group_pmf(groups[0], h)
    found = _COMPOSED.get((groups, h))
    if found is None:
        half = len(groups) // 2
        found = _composed_pair(_block(groups[:half], h), _block(groups[half:], h))
        _COMPOSED.put((groups, h), found)
    return found


def epsilon(groups: tuple[Group, ...], delta: float) -> float:
    """Epsilon at delta of the adaptive composition of the groups (order does not matter but for rounding)."""
    if not groups:
        return 0.0
    return epsilon_for_delta(composed_pmf(groups, grid(groups)), delta)


def epsilon_for_delta(pmf: pld_pmf.DensePLDPmf, delta: float) -> float:
    """The smallest eps >= 0 with delta_pmf(eps) <= delta: dp_accounting's `get_epsilon_for_delta`, with its
    loop over losses done by suffix sums (delta(eps) = m_inf + sum_{l > eps} p_l (1 - e^{eps - l}))."""
    infinity = float(pmf._infinity_mass)
    if infinity > delta:
        return math.inf
    zero = max(0, -int(pmf._lower_loss))  # losses below 0 never enter delta(eps) for eps >= 0
    probs = np.asarray(pmf._probs, dtype=np.float64)[zero:]
    if not len(probs):
        return 0.0
    losses = (pmf._lower_loss + zero + np.arange(len(probs))) * pmf._discretization
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        upper = infinity + np.cumsum(probs[::-1])[::-1]  # mass at losses >= l_k, and at +infinity
        lower = np.cumsum((probs * np.exp(-losses))[::-1])[::-1]  # the same under the other distribution
        at_loss = upper - np.exp(losses) * lower  # delta(l_k)
        if not (np.isfinite(at_loss).all() and np.isfinite(lower).all()):
            return float(pmf.get_epsilon_for_delta(delta))
        above = np.nonzero(at_loss > delta)[0]
        if not len(above) and zero > 0:
            return 0.0  # delta(0) <= delta
        k = (
            min(int(above[-1]) + 1, len(probs) - 1) if len(above) else 0
        )  # delta(l_{k-1}) > delta >= delta(l_k)
        if lower[k] <= 0.0:
            return max(0.0, float(losses[k]))
        return max(0.0, math.log((upper[k] - delta) / lower[k]))
