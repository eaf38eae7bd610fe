"""Privacy accounting: the additive cost of a composition of events, and the accountants that price it.

A release is described by a frozen event (a Gaussian with noise multiplier sigma on S of N records).
Its cost is a vector that adds under composition: the Renyi-DP curve on one fixed grid of orders
(ORDERS), then the sum of 1/sigma^2 over releases on the whole dataset (S = N), then the number of
subsampled releases. An accountant turns a cost into (epsilon, delta):

- `pld` (the default): a composition of releases on the whole dataset is exactly one Gaussian mechanism
  with mu^2 = sum_t 1/sigma_t^2 (Dong, Roth, Su 2022, "Gaussian differential privacy", Cor. 3.3), priced
  exactly by the analytic Gaussian mechanism (Balle and Wang 2018, Thm 8). Subsampled releases are
  C_q(G_{1/sigma})-DP (ibid., Thm 4.2); their privacy loss distributions compose by FFT
  (privacy_wall.accounting.pld), and the least of that, `rdp` and the unamplified Gaussian is charged.
- `rdp`: the WOR subsampled Gaussian RDP curve (Wang, Balle, Kasiviswanathan 2019, Thm 27; see
  privacy_wall.accounting.wor_rdp) with the improved RDP-to-DP conversion (Balle et al. 2020, Thm 21; Canonne,
  Kamath, Steinke 2020), as dp_accounting's RdpAccountant computes it.
- `paper`: autodp's analytical moments accountant with the classic conversion, which reproduces the
  papers' epsilons (docs/design.md section 3); for comparisons only.

Conventions (docs/design.md section 2): replace-one neighbours; each iteration samples exactly S of N records
uniformly without replacement; one Gaussian mechanism with noise multiplier sigma per iteration.
This module, privacy_wall.accounting.calibration and privacy_wall.accounting.pld are the only ones of the
project that import autodp or dp_accounting, each where it prices (they take about a second to import,
which a sigma = 0 fit never needs). The events are privacy_wall.accounting.events; comparison-only
accountants (advanced composition) live in bench/strong_composition.py.
"""

from __future__ import annotations

import contextlib
import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
from numpy.typing import NDArray

from privacy_wall.accounting import filter as filter_rule
from privacy_wall.accounting import pld
from privacy_wall.accounting.events import Event, SelfComposedEvent
from privacy_wall.accounting.names import ACCOUNTANT_NAMES
from privacy_wall.accounting.names import DEFAULT_ACCOUNTANT as DEFAULT_ACCOUNTANT  # re-exported
from privacy_wall.accounting.pld import Group
from privacy_wall.accounting.profile_rdp import PROFILE_MAX_SIGMA, profile_rdp
from privacy_wall.accounting.wor_rdp import sampled_gaussian_rdp

#: The fixed grid of Renyi orders on which every curve is stored (fractional near 1 for large sigma,
#: dense where the optimum usually lies, sparse towards large orders for small epsilon targets).
ORDERS: NDArray[np.float64] = np.concatenate(
    [
        np.array([1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7, 1.8, 1.9]),
        np.arange(2.0, 12.0, 0.25),
        np.arange(12.0, 64.0, 1.0),
        np.arange(64.0, 128.0, 4.0),
        np.array([128.0, 160.0, 192.0, 256.0, 320.0, 384.0, 512.0, 768.0, 1024.0, 2048.0, 4096.0]),
    ]
)
_ORDER_TUPLE = tuple(float(a) for a in ORDERS)
#: A cost vector: the RDP curve on ORDERS, then sum 1/sigma^2 over releases with S = N, then the number
#: of subsampled releases.
COST_SIZE = len(ORDERS) + 2
_MU2, _SUBSAMPLED = len(ORDERS), len(ORDERS) + 1


@dataclass(frozen=True)
class PrivacyCost:
    """The additive cost of a composition of releases, priced by the accountant it names.

    `values` has COST_SIZE entries (see the module docstring); inf where no guarantee holds. `releases`
    (the `pld` accountant's only) lists the subsampled releases as (sigma, S, N, count) groups in order of
    first appearance; adding costs adds counts, so it is as additive as `values`.
    """

    values: tuple[float, ...]
    accountant: str
    releases: tuple[Group, ...] = ()

    def __post_init__(self) -> None:
        if len(self.values) != COST_SIZE:
            raise ValueError(f"a privacy cost has {COST_SIZE} values, got {len(self.values)}")

    @classmethod
    def zero(cls, accountant: str | None = None) -> PrivacyCost:
        """Nothing released, for the named accountant (default: the configured one)."""
        name = accountant if accountant is not None else configured_accountant().name
        return cls(tuple(0.0 for _ in range(COST_SIZE)), name)

    @classmethod
    def from_array(
        cls, values: NDArray[np.float64], accountant: str, releases: tuple[Group, ...] = ()
    ) -> PrivacyCost:
        return cls(tuple(np.asarray(values, dtype=np.float64).tolist()), accountant, releases)

    def as_array(self) -> NDArray[np.float64]:
        return np.asarray(self.values, dtype=np.float64)

    def to_json(self) -> dict[str, Any]:
        """The stored form: values (null for inf) and the release groups."""
        return {
            "values": [v if math.isfinite(v) else None for v in self.values],
            "releases": [list(group) for group in self.releases],
        }

    @classmethod
    def from_json(cls, payload: Any, accountant: str) -> PrivacyCost:
        """Inverse of to_json; a bare list is a cost stored before release groups existed."""
        values = payload if isinstance(payload, list) else payload["values"]
        groups = () if isinstance(payload, list) else payload.get("releases", ())
        releases = tuple((float(g[0]), int(g[1]), int(g[2]), int(g[3])) for g in groups)
        return cls(tuple(math.inf if v is None else float(v) for v in values), accountant, releases)

    @property
    def rdp(self) -> NDArray[np.float64]:
        return self.as_array()[: len(ORDERS)]

    @property
    def gaussian_mu_squared(self) -> float:
        """sum 1/sigma^2 over the releases on the whole dataset."""
        return self.values[_MU2]

    @property
    def subsampled_releases(self) -> float:
        return self.values[_SUBSAMPLED]

    def _same(self, other: PrivacyCost) -> None:
        if other.accountant != self.accountant:
            raise ValueError(f"cannot combine costs of accountants {self.accountant} and {other.accountant}")

    def __add__(self, other: PrivacyCost) -> PrivacyCost:
        self._same(other)
        counts = {group[:3]: group[3] for group in self.releases}
        for *kind, count in other.releases:
            key = (float(kind[0]), int(kind[1]), int(kind[2]))
            counts[key] = counts.get(key, 0) + count
        releases = tuple((*kind, count) for kind, count in counts.items())
        return PrivacyCost.from_array(self.as_array() + other.as_array(), self.accountant, releases)

    def scaled(self, factor: int) -> PrivacyCost:
        """The cost of `factor` repetitions (an integer >= 0)."""
        if isinstance(factor, bool) or int(factor) != factor or factor < 0:
            raise ValueError(f"a cost repeats a whole number of times, not {factor!r}")
        return _scaled(self, int(factor))

    def epsilon(self, delta: float) -> float:
        """(epsilon, delta)-DP of the composition, by its accountant; inf where nothing is guaranteed."""
        if not 0 < delta < 1:
            raise ValueError("delta must be in (0, 1)")
        if not any(self.values):
            return 0.0  # nothing released
        if np.isnan(self.as_array()).any():
            return math.inf  # an unevaluable bound is no guarantee
        return get_accountant(self.accountant).epsilon(self, delta)


@lru_cache(maxsize=1024)  # a ledger's jobs share a few schedules: each job's cost is one of them, scaled
def _scaled(cost: PrivacyCost, factor: int) -> PrivacyCost:
    with np.errstate(invalid="ignore"):
        values = cost.as_array() * factor
    releases = tuple((s, n, p, c * factor) for s, n, p, c in cost.releases) if factor else ()
    return PrivacyCost.from_array(np.where(np.isnan(values), 0.0, values), cost.accountant, releases)


def sum_costs(costs: list[PrivacyCost], accountant: str) -> PrivacyCost:
    """The cost of the adaptive composition of the given releases (their sum: one array sum, the release
    groups counted in order of first appearance)."""
    total = PrivacyCost.zero(accountant)
    if not costs:
        return total
    for cost in costs:
        total._same(cost)
    counts: dict[tuple[float, int, int], int] = {}
    for cost in costs:
        for sigma, size, population, count in cost.releases:
            key = (float(sigma), int(size), int(population))
            counts[key] = counts.get(key, 0) + count
    values = np.sum([cost.values for cost in costs], axis=0)
    releases = tuple((*kind, count) for kind, count in counts.items())
    return PrivacyCost.from_array(values, accountant, releases)


def _fail_closed(values: NDArray[np.float64]) -> NDArray[np.float64]:
    """NaN would slip through every `>` of a budget check: read it as no guarantee."""
    return np.where(np.isnan(values), np.inf, values)


class Accountant(ABC):
    """Prices events as additive costs and compositions as (epsilon, delta).

    `version` (at most 64 characters, stored with every ledger row) names the accountant and its
    revision; a ledger priced by another version is re-priced from its events.
    """

    name: str
    version: str
    #: Whether costs list their subsampled releases (PrivacyCost.releases) for this accountant to price.
    lists_releases = False

    @abstractmethod
    def _subsampled_curve(self, sigma: float, sample_size: int, population: int) -> tuple[float, ...]:
        """Per-release RDP on ORDERS of the Gaussian on S < N records sampled without replacement."""

    @abstractmethod
    def epsilon(self, cost: PrivacyCost, delta: float) -> float:
        """Epsilon at delta of a non-zero, NaN-free cost of this accountant."""

    def cost(self, event: Event) -> PrivacyCost:
        """The additive cost of an event."""
        if isinstance(event, SelfComposedEvent):
            return self.cost(event.event).scaled(event.count)
        return self._release_cost(float(event.noise_multiplier), event.sample_size, event.population)

    @lru_cache(maxsize=4096)  # noqa: B019 (accountants are module-level singletons)
    def _release_cost(self, sigma: float, sample_size: int, population: int) -> PrivacyCost:
        values = np.zeros(COST_SIZE)
        if sample_size == 0:
            return PrivacyCost.from_array(values, self.name)
        if sigma * sigma == 0.0:  # no noise, or so little that sigma^2 underflows: no guarantee
            return PrivacyCost.from_array(np.full(COST_SIZE, math.inf), self.name)
        with np.errstate(over="ignore", divide="ignore"):  # sigma^2 near underflow: inf, no guarantee
            if sample_size == population:
                values[: len(ORDERS)] = ORDERS / (2.0 * sigma * sigma)
                values[_MU2] = 1.0 / (sigma * sigma)
            else:
                values[: len(ORDERS)] = self._subsampled_curve(sigma, sample_size, population)
                values[_SUBSAMPLED] = 1.0
        releases = (
            ((sigma, sample_size, population, 1),) if self.lists_releases and values[_SUBSAMPLED] else ()
        )
        return PrivacyCost.from_array(_fail_closed(values), self.name, releases)

    def zero(self) -> PrivacyCost:
        return PrivacyCost.zero(self.name)


class PaperAccountant(Accountant):
    """autodp's analytical moments accountant (WBK 2019, Thm 27) with the classic conversion."""

    name = "paper"
    version = "paper/autodp-0.2.3.1/wbk19-thm27/classic/grid-v1"

    def _subsampled_curve(self, sigma: float, sample_size: int, population: int) -> tuple[float, ...]:
        """We use the paper's Theorem 27 bound (autodp's improved_bound_flag), which holds for mechanisms
        with a pair of neighbouring datasets that is worst for every order and a tight RDP bound, as the
        Gaussian mechanism has."""
        try:
            with np.errstate(all="ignore"):
                return _autodp_subsampled_gaussian_rdp(sigma, sample_size, population)
        except (ZeroDivisionError, OverflowError, FloatingPointError, ValueError):
            return tuple(math.inf for _ in ORDERS)

    def epsilon(self, cost: PrivacyCost, delta: float) -> float:
        """min over orders of rdp(a) + log(1/delta)/(a-1) (Mironov 2017, Prop. 3)."""
        return float(np.min(cost.rdp + math.log(1.0 / delta) / (ORDERS - 1.0)))


class RdpAccountant(Accountant):
    """The WOR subsampled Gaussian RDP curve with the improved conversion (dp_accounting's)."""

    name = "rdp"
    version = "rdp/wbk19-thm27-v2/balle20/dp_accounting-0.6.0/grid-v1"

    def _subsampled_curve(self, sigma: float, sample_size: int, population: int) -> tuple[float, ...]:
        """WBK 2019 Thm 27 (privacy_wall.accounting.wor_rdp). Subsampling never costs more than releasing on
        the whole batch (each pair of neighbouring datasets yields subsamples that are neighbours or equal,
        and
        Renyi divergence is jointly quasi-convex), so the unamplified Gaussian curve bounds it too."""
        with np.errstate(all="ignore"):
            curve = sampled_gaussian_rdp(sample_size / population, sigma, ORDERS)
        return tuple(float(v) for v in np.minimum(curve, ORDERS / (2.0 * sigma * sigma)))

    def epsilon(self, cost: PrivacyCost, delta: float) -> float:
        """eps = min_a rdp(a) + log((a-1)/a) - (log delta + log a)/(a-1) (Balle et al. 2020, Thm 21)."""
        from dp_accounting.rdp import rdp_privacy_accountant  # ~1 s to import: on first pricing only

        eps, _ = rdp_privacy_accountant.compute_epsilon(ORDERS, cost.rdp, delta)
        return float(eps)


class PldAccountant(RdpAccountant):
    """The tight accountant: every composition priced by its privacy loss distribution.

    Releases on the whole dataset (S = N) are Gaussian mechanisms of sensitivity 1; T adaptive ones compose
    exactly to mu-GDP with mu^2 = sum 1/sigma_t^2 (Dong, Roth, Su 2022, Cor. 3.3), priced exactly by the
    analytic Gaussian mechanism (Balle and Wang 2018, Thm 8): with no subsampled release that is the answer.

    Subsampled releases (S < N, exactly S of N without replacement, replace-one) are C_q(G_{1/sigma})-DP
    (Dong, Roth, Su 2022, Thm 4.2: C_q(f) = min{f_q, f_q^-1}**, f_q = q f + (1 - q) Id, q = S/N). The
    privacy profile of C_q(f) is the larger of the hockey-stick curves of ((1-q) N(0, s^2) + q N(1, s^2),
    N(0, s^2)) and of its swap at every real eps; a pessimistic connect-the-dots PMF of that symmetrised
    profile (Doroshenko et al. 2022) dominates it; adaptive releases compose (Dong, Roth, Su, Thm 3.2) by FFT
    convolution with the Gaussian part (privacy_wall.accounting.pld, which states the argument in full).
    Composing the two ordered pairs separately and taking the larger epsilon would NOT be valid here.

    Two other valid bounds of the same composition may be smaller, and the smaller of valid epsilons is
    valid: the RDP curve (`rdp`), and the Gaussian one gets by reading every subsampled release as one on
    the whole dataset (subsampling never costs more). The answer is the least of the three.
    """

    name = "pld"
    version = "pld/gdp-full-batch/drs22-cq-connect-dots-v1/min-rdp-v2/grid-v1"
    lists_releases = True

    @lru_cache(maxsize=256)  # noqa: B019 (a module-level singleton; costs are values: one ledger state each)
    def epsilon(self, cost: PrivacyCost, delta: float) -> float:
        mu2 = cost.gaussian_mu_squared
        if not (math.isfinite(mu2) and math.isfinite(cost.subsampled_releases)):
            return math.inf
        if not cost.releases:
            if cost.subsampled_releases:
                raise ValueError("a pld cost with subsampled releases must list them")
            return _gaussian_epsilon(mu2, delta)
        if sum(group[3] for group in cost.releases) != cost.subsampled_releases:
            raise ValueError("a pld cost's release groups do not match its subsampled releases")
        as_full_batch = mu2 + sum(count / (sigma * sigma) for sigma, _, _, count in cost.releases)
        groups = cost.releases + (((1.0 / math.sqrt(mu2), 1, 1, 1),) if mu2 > 0 else ())
        bounds = [super().epsilon(cost, delta)]
        with contextlib.suppress(OverflowError):  # noise so small no loss scale is finite: the others stand
            bounds.append(pld.epsilon(groups, delta))
        if _gaussian_delta(as_full_batch, min(bounds)) <= delta:  # else its epsilon is larger: skip solving
            bounds.append(_gaussian_epsilon(as_full_batch, delta))
        return min(bounds)


class FilterAccountant(RdpAccountant):
    """The budget's admission rule (the default): a privacy filter valid under fully adaptive composition.

    The least eps at which the union of two filters admits the composition (privacy_wall.accounting.filter,
    which states the theorems and proves the union): the Gaussian part reads every release as the
    Gaussian it post-processes (sum 1/sigma^2 over all releases, Smith and Thakurta 2022; exact for
    full-batch ones) at GAUSSIAN_SHARE of delta, the Renyi part mixes the releases' RDP curves over
    ORDERS (Feldman and Zrnic 2021 with the improved conversion) at the rest. A deterministic function
    of the additive cost (each release's curve on its own fixed grid, one root): no FFT or per-process
    cache changes a price. The `pld` price of one job alone (its schedule fixed in advance) is valid for
    that job and shown beside it; it is not a filter.
    """

    name = "filter"
    lists_releases = True

    def __init__(self, gaussian_share: float = filter_rule.GAUSSIAN_SHARE) -> None:
        #: The Gaussian part's share of delta (the Renyi part has the rest); the version names it.
        self.gaussian_share = gaussian_share
        self.version = f"filter/gdp-st22-{gaussian_share:g}/rdp-mix-fz21-balle20/profile2-wbk19/gridv1"

    def _subsampled_curve(self, sigma: float, sample_size: int, population: int) -> tuple[float, ...]:
        """Order by order the least of three valid RDP bounds: WBK 2019 Thm 27 and the unamplified Gaussian
        (`rdp`'s curve), and the RDP of the pair every C_q(G_{1/sigma})-DP release post-processes, from its
        privacy profile (privacy_wall.accounting.profile_rdp; about a third of Thm 27's at q <= 0.05)."""
        wbk = super()._subsampled_curve(sigma, sample_size, population)
        if sigma > PROFILE_MAX_SIGMA:  # beyond where the profile's rounding allowance was measured
            return wbk
        try:
            with np.errstate(all="ignore"):
                profile = profile_rdp(sigma, sample_size, population, _ORDER_TUPLE)
        except (OverflowError, ValueError, FloatingPointError):  # noise so small no bound is finite
            return wbk
        return tuple(min(a, b) for a, b in zip(wbk, profile, strict=True))

    @lru_cache(maxsize=1024)  # noqa: B019 (module-level instances; a page lists jobs of the same schedules)
    def epsilon(self, cost: PrivacyCost, delta: float) -> float:
        if not all(math.isfinite(v) for v in cost.values):
            return math.inf
        if sum(group[3] for group in cost.releases) != cost.subsampled_releases:
            raise ValueError("a filter cost's release groups do not match its subsampled releases")
        mu2 = cost.gaussian_mu_squared + sum(count / (sigma * sigma) for sigma, _, _, count in cost.releases)
        share = self.gaussian_share * delta
        gaussian = _gaussian_epsilon(mu2, share) if share > 0.0 else math.inf
        renyi = filter_rule.renyi_epsilon(ORDERS, cost.rdp, (1.0 - self.gaussian_share) * delta)
        return min(gaussian, renyi)


def _gaussian_delta(mu2: float, eps: float) -> float:
    """delta at eps of mu-GDP: the profile of privacy_wall.accounting.pld at q = 1 (0 at eps = inf, 1 at
    mu = inf)."""
    if eps == math.inf or mu2 <= 0.0:
        return 0.0
    if not math.isfinite(mu2):
        return 1.0
    return float(pld.profile(1.0 / math.sqrt(mu2), 1.0, np.array([eps]))[0])


@lru_cache(maxsize=4096)
def _gaussian_epsilon(mu2: float, delta: float) -> float:
    """Exact epsilon at delta of mu-GDP (the analytic Gaussian mechanism with sigma = 1/mu)."""
    if not math.isfinite(mu2):
        return math.inf
    # dp_accounting solves delta(eps) = delta to 1e-12 with brentq; the tolerance is added back so
    # the answer is never below the exact epsilon.
    from dp_accounting import gaussian_mechanism  # ~1 s to import: on first pricing only

    with np.errstate(divide="ignore"):
        return float(gaussian_mechanism.get_epsilon_gaussian(1.0 / math.sqrt(mu2), delta)) + 1e-12


def clear_caches() -> None:
    """Forget every cached price and PMF (benchmarks measure cold pricing with it)."""
    PldAccountant.epsilon.cache_clear()
    FilterAccountant.epsilon.cache_clear()
    _scaled.cache_clear()
    _gaussian_epsilon.cache_clear()
    pld.clear_caches()


ACCOUNTANTS: dict[str, Accountant] = {
    a.name: a for a in (FilterAccountant(), PldAccountant(), RdpAccountant(), PaperAccountant())
}
assert tuple(ACCOUNTANTS) == ACCOUNTANT_NAMES

#: Earlier revisions of the filter by their stored version, to record what a ledger cost before it is
#: re-priced: the Gaussian part had 0.9 of delta until migration 0014.
FORMER_FILTERS: dict[str, FilterAccountant] = {
    "filter/gdp-st22-0.9/rdp-mix-fz21-balle20/profile2-wbk19/grid-v1": FilterAccountant(0.9),
}


def get_accountant(name: str) -> Accountant:
    """The accountant of that name (pld, rdp or paper), or ValueError naming the choices."""
    try:
        return ACCOUNTANTS[name]
    except KeyError:
        raise ValueError(f"unknown accountant {name!r}: choose one of {', '.join(ACCOUNTANTS)}") from None


@lru_cache
def configured_accountant() -> Accountant:
    """The deployment's accountant (VIPS_ACCOUNTANT), read once per process."""
    from privacy_wall.accounting.settings import AccountingSettings  # pydantic-settings: only here

    return get_accountant(AccountingSettings().accountant)


def resolve_accountant(accountant: Accountant | str | None) -> Accountant:
    if accountant is None:
        return configured_accountant()
    return get_accountant(accountant) if isinstance(accountant, str) else accountant


def privacy_cost(event: Event, accountant: Accountant | str | None = None) -> PrivacyCost:
    """The additive cost of an event under an accountant (default: the configured one)."""
    return resolve_accountant(accountant).cost(event)


def exact_orders(sigma: float, sampling_rate: float) -> int:
    """How many integer orders autodp evaluates with its exact O(m^2) bound (above them: a looser one).

    Optimal orders grow with sigma and shrink with the sampling rate: for the subsampled Gaussian,
    RDP ~ 2 q^2 a / sigma^2 puts the optimum near sigma / q * sqrt(log(1/delta) / (2T)), which is below
    3.4 sigma / q for any delta >= 1e-10 and T >= 1; large sigma with weak amplification is also covered
    by sigma alone. Every choice is a valid upper bound; m never decreases as sigma grows, so epsilon
    stays non-increasing in sigma (calibration relies on it).
    """
    reach = 3.4 * sigma / sampling_rate
    if sigma < 2.5 or reach < 100:
        return 100
    if sigma < 6.0 or reach < 256:
        return 256
    return 512


def _autodp_subsampled_gaussian_rdp(sigma: float, sample_size: int, population: int) -> tuple[float, ...]:
    from autodp import rdp_acct, rdp_bank  # autodp (~0.3 s to import) only where the `paper` prices

    def gaussian(alpha: float) -> float:
        return float(rdp_bank.RDP_gaussian({"sigma": sigma}, alpha))

    orders = exact_orders(sigma, sample_size / population)
    acct = rdp_acct.anaRDPacct(m=orders, m_max=orders)
    acct.compose_subsampled_mechanism(gaussian, sample_size / population, improved_bound_flag=True)
    # autodp's improved bound omits the minimum with the unamplified Gaussian (see RdpAccountant).
    full = np.array([gaussian(float(a)) for a in ORDERS])
    return tuple(float(v) for v in np.minimum(acct.get_rdp(ORDERS), full))
