"""Privacy accounting: typed events over autodp's analytical moments accountant.

This is the only module of the project that imports autodp. A release is described by a frozen
event object; an event's cost is its Renyi-DP curve on one fixed grid of orders (ORDERS), so curves of
different jobs add coordinate-wise and a dataset's spend is the sum of its ledger's curves.

Conventions (DESIGN section 2): neighbouring datasets differ by replacing one record; each iteration
samples exactly S of N records uniformly without replacement (Wang, Balle, Kasiviswanathan 2019);
one Gaussian mechanism with noise multiplier sigma per iteration.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
from autodp import dp_bank, rdp_acct, rdp_bank
from numpy.typing import NDArray
from scipy.optimize import brentq

ACCOUNTANT_VERSION = "autodp-0.2.3.1/anaRDPacct-wbk19-thm27/grid-v1"

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


class Neighbouring(enum.Enum):
    """Which datasets count as neighbours."""

    REPLACE_ONE = "replace_one"


class Sampling(enum.Enum):
    """How a minibatch is drawn."""

    WITHOUT_REPLACEMENT = "without_replacement"


@dataclass(frozen=True)
class SubsampledGaussianEvent:
    """One Gaussian release (noise multiplier sigma on a sensitivity-1 query) on S of N records."""

    noise_multiplier: float
    sample_size: int
    population: int
    sampling: Sampling = Sampling.WITHOUT_REPLACEMENT
    neighbouring: Neighbouring = Neighbouring.REPLACE_ONE

    def __post_init__(self) -> None:
        if not (self.noise_multiplier >= 0 and math.isfinite(self.noise_multiplier)):
            raise ValueError("noise_multiplier must be a finite number >= 0")
        if self.population < 1:
            raise ValueError("population must be >= 1")
        if not 0 <= self.sample_size <= self.population:
            raise ValueError("sample_size must be between 0 and population")

    @property
    def sampling_rate(self) -> float:
        return self.sample_size / self.population


@dataclass(frozen=True)
class SelfComposedEvent:
    """The same event repeated `count` times (adaptive composition)."""

    event: SubsampledGaussianEvent
    count: int

    def __post_init__(self) -> None:
        if self.count < 0:
            raise ValueError("count must be >= 0")


Event = SubsampledGaussianEvent | SelfComposedEvent


def event_to_dict(event: Event) -> dict[str, Any]:
    """A JSON-ready description of an event (stored with each ledger entry)."""
    if isinstance(event, SelfComposedEvent):
        return {"type": "self_composed", "count": event.count, "event": event_to_dict(event.event)}
    return {
        "type": "subsampled_gaussian",
        "noise_multiplier": event.noise_multiplier,
        "sample_size": event.sample_size,
        "population": event.population,
        "sampling": event.sampling.value,
        "neighbouring": event.neighbouring.value,
    }


def event_from_dict(payload: dict[str, Any]) -> Event:
    """Inverse of event_to_dict through a closed set of event types."""
    kind = payload.get("type")
    if kind == "self_composed":
        inner = event_from_dict(payload["event"])
        if not isinstance(inner, SubsampledGaussianEvent):
            raise ValueError("nested self-composition is not supported")
        return SelfComposedEvent(inner, int(payload["count"]))
    if kind == "subsampled_gaussian":
        return SubsampledGaussianEvent(
            noise_multiplier=float(payload["noise_multiplier"]),
            sample_size=int(payload["sample_size"]),
            population=int(payload["population"]),
            sampling=Sampling(payload["sampling"]),
            neighbouring=Neighbouring(payload["neighbouring"]),
        )
    raise ValueError(f"unknown event type {kind!r}")


@dataclass(frozen=True)
class RdpCurve:
    """Renyi-DP epsilon at each order of ORDERS (inf where the event gives no guarantee)."""

    values: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.values) != len(ORDERS):
            raise ValueError(f"an RDP curve has {len(ORDERS)} values, got {len(self.values)}")

    @classmethod
    def zero(cls) -> RdpCurve:
        return cls(tuple(0.0 for _ in ORDERS))

    @classmethod
    def from_array(cls, values: NDArray[np.float64]) -> RdpCurve:
        return cls(tuple(float(v) for v in values))

    def as_array(self) -> NDArray[np.float64]:
        return np.asarray(self.values, dtype=np.float64)

    def __add__(self, other: RdpCurve) -> RdpCurve:
        return RdpCurve.from_array(self.as_array() + other.as_array())

    def __sub__(self, other: RdpCurve) -> RdpCurve:
        return RdpCurve.from_array(np.maximum(self.as_array() - other.as_array(), 0.0))

    def scaled(self, factor: float) -> RdpCurve:
        return RdpCurve.from_array(self.as_array() * factor)

    def epsilon(self, delta: float) -> float:
        """(epsilon, delta)-DP from RDP: min over orders of rdp(a) + log(1/delta)/(a-1) (Mironov 2017)."""
        if not 0 < delta < 1:
            raise ValueError("delta must be in (0, 1)")
        if not any(self.values):
            return 0.0  # nothing released
        eps = self.as_array() + math.log(1.0 / delta) / (ORDERS - 1.0)
        if np.isnan(eps).any():
            return math.inf  # an unevaluable bound is no guarantee
        return float(np.min(eps))


def sum_curves(curves: list[RdpCurve]) -> RdpCurve:
    """The RDP curve of the adaptive composition of the given releases."""
    total = np.zeros(len(ORDERS))
    for curve in curves:
        total += curve.as_array()
    return RdpCurve.from_array(total)


def _exact_orders(sigma: float, sampling_rate: float) -> int:
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


@lru_cache(maxsize=4096)
def _subsampled_gaussian_rdp(sigma: float, sample_size: int, population: int) -> tuple[float, ...]:
    """Per-release RDP on ORDERS of the subsampled Gaussian (autodp; Wang, Balle, Kasiviswanathan 2019).

    We use the paper's Theorem 27 bound (autodp's improved_bound_flag), which holds for mechanisms with
    a pair of neighbouring datasets that is worst for every order and a tight RDP bound, as the Gaussian
    mechanism has; it equals the general Theorem 9 bound at small orders and is much tighter at large
    orders, i.e. for large sigma (Adult, sigma = 12: epsilon 0.039 instead of 0.094).
    """
    if sample_size == 0:
        return tuple(0.0 for _ in ORDERS)
    if sigma * sigma == 0.0:  # no noise, or so little that sigma^2 underflows: no guarantee
        return tuple(math.inf for _ in ORDERS)
    try:
        with np.errstate(all="ignore"):
            values = _autodp_subsampled_gaussian_rdp(sigma, sample_size, population)
    except (ZeroDivisionError, OverflowError, FloatingPointError, ValueError):
        return tuple(math.inf for _ in ORDERS)
    # Fail closed: NaN would slip through every `>` of a budget check.
    return tuple(math.inf if math.isnan(v) else v for v in values)


def _autodp_subsampled_gaussian_rdp(sigma: float, sample_size: int, population: int) -> tuple[float, ...]:

    def gaussian(alpha: float) -> float:
        return float(rdp_bank.RDP_gaussian({"sigma": sigma}, alpha))

    if sample_size == population:
        return tuple(gaussian(float(a)) for a in ORDERS)
    exact_orders = _exact_orders(sigma, sample_size / population)
    acct = rdp_acct.anaRDPacct(m=exact_orders, m_max=exact_orders)
    acct.compose_subsampled_mechanism(gaussian, sample_size / population, improved_bound_flag=True)
    # Subsampling never costs more than releasing on the whole batch (each pair of neighbouring datasets
    # yields subsamples that are neighbours or equal, and Renyi divergence is jointly quasi-convex), so
    # the unamplified Gaussian RDP is an upper bound too; autodp's improved bound omits that minimum.
    full = np.array([gaussian(float(a)) for a in ORDERS])
    return tuple(float(v) for v in np.minimum(acct.get_rdp(ORDERS), full))


def rdp_curve(event: Event) -> RdpCurve:
    """The RDP curve of an event on the fixed grid ORDERS."""
    if isinstance(event, SelfComposedEvent):
        return rdp_curve(event.event).scaled(event.count)
    return RdpCurve(
        _subsampled_gaussian_rdp(float(event.noise_multiplier), event.sample_size, event.population)
    )


def vips_job_event(sigma: float, sample_size: int, population: int, iterations: int) -> SelfComposedEvent:
    """The event of a T-iteration job: T subsampled Gaussian releases with multiplier sigma."""
    return SelfComposedEvent(SubsampledGaussianEvent(sigma, sample_size, population), iterations)


def epsilon(sigma: float, sample_size: int, population: int, iterations: int, delta: float) -> float:
    """Epsilon spent by a job, on its own."""
    return rdp_curve(vips_job_event(sigma, sample_size, population, iterations)).epsilon(delta)


class CalibrationError(ValueError):
    """No noise multiplier can meet the target."""


_SIGMA_MIN = 1e-3
_SIGMA_MAX = 1e4


def calibrate_sigma(
    target_epsilon: float,
    sample_size: int,
    population: int,
    iterations: int,
    delta: float,
    spent: RdpCurve | None = None,
    rel_tol: float = 1e-3,
) -> float:
    """Smallest sigma with epsilon(spent + job curve) <= target_epsilon, to relative tolerance rel_tol.

    The returned sigma is always on the safe side: its epsilon is <= target (bisection keeps the upper end).
    """
    base = spent if spent is not None else RdpCurve.zero()
    if not target_epsilon > 0:
        raise CalibrationError("target epsilon must be > 0")
    if base.epsilon(delta) >= target_epsilon:
        raise CalibrationError("the budget already spent leaves nothing for this job")

    def total(sigma: float) -> float:
        return (base + rdp_curve(vips_job_event(sigma, sample_size, population, iterations))).epsilon(delta)

    # Bracket: the full-batch sigma (closed form, cheap) always suffices, since subsampling only lowers
    # the cost; the amplified answer lies above roughly q times it. Large-sigma evaluations are the
    # expensive ones, so the bracket starts narrow.
    if sample_size == population:
        hi = _SIGMA_MAX
    else:
        hi = calibrate_sigma(target_epsilon, population, population, iterations, delta, spent, rel_tol)
    if total(hi) > target_epsilon:
        raise CalibrationError(f"target epsilon is unreachable even with sigma = {hi:g}")
    lo = max(hi * sample_size / population, _SIGMA_MIN)
    while lo > _SIGMA_MIN and total(lo) <= target_epsilon:
        lo, hi = max(lo / 8, _SIGMA_MIN), lo
    if total(lo) <= target_epsilon:
        return lo
    # Bisection on log sigma; epsilon is non-increasing in sigma.
    while hi / lo > 1 + rel_tol:
        mid = math.sqrt(lo * hi)
        if total(mid) <= target_epsilon:
            hi = mid
        else:
            lo = mid
    return hi


def strong_composition_epsilon(
    sigma: float, sample_size: int, population: int, iterations: int, delta: float
) -> float:
    """Epsilon by advanced composition (Dwork and Roth Thm 3.20) of T amplified Gaussian releases.

    Half of delta is the composition slack delta''; the other half is split over the T releases, each of
    which is amplified by sampling without replacement (Balle, Barthe, Gaboardi 2018, substitution):
    eps' = log(1 + q (e^eps0 - 1)), delta' = q delta0, where eps0 is the analytic Gaussian mechanism's
    epsilon at delta0 (Balle and Wang 2018; valid for every eps0, unlike the classic 1.25/delta bound).
    Only for comparison experiments; the ledger is always RDP.
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

    lo, hi = math.log(_SIGMA_MIN), math.log(_SIGMA_MAX)
    if gap(hi) > 0:
        raise CalibrationError("target epsilon is unreachable by strong composition")
    if gap(lo) <= 0:
        return _SIGMA_MIN
    return math.exp(brentq(gap, lo, hi, xtol=1e-8)) * (1 + 1e-9)


def autodp_reference_epsilon(
    sigma: float, sample_size: int, population: int, iterations: int, delta: float
) -> float:
    """autodp's own anaRDPacct answer, with its continuous order search (used to audit our grid).

    Same bound and the same number of exact orders as rdp_curve, so the two differ only by our grid.
    """
    exact_orders = _exact_orders(sigma, sample_size / population)
    acct = rdp_acct.anaRDPacct(m=exact_orders, m_max=exact_orders)

    def gaussian(alpha: float) -> float:
        return float(rdp_bank.RDP_gaussian({"sigma": sigma}, alpha))

    acct.compose_subsampled_mechanism(
        gaussian, sample_size / population, coeff=iterations, improved_bound_flag=True
    )
    return float(acct.get_eps(delta))
