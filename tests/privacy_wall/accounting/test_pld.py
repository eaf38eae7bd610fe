"""The tight `pld` accountant (privacy_wall.accounting.pld): its profile, its accuracy, monotonicity,
sub-additivity and calibration at every sampling rate (issue 20)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from unittest import mock

import numpy as np
import pytest
from dp_accounting.pld import pld_pmf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy import integrate
from scipy.optimize import brentq
from scipy.stats import norm

import privacy_wall.accounting.accountants as accountants
from privacy_wall.accounting import pld
from privacy_wall.accounting.accountants import privacy_cost
from privacy_wall.accounting.calibration import calibrate_sigma, epsilon
from privacy_wall.accounting.events import SelfComposedEvent, SubsampledGaussianEvent


@pytest.fixture(autouse=True, scope="module")
def pld_is_configured() -> Iterator[None]:
    """Every test here prices by `pld` where it names no accountant (the budget's default is the filter:
    tests/privacy_wall/accounting/test_filter.py)."""
    with mock.patch.object(accountants, "configured_accountant", lambda: accountants.get_accountant("pld")):
        yield


# --------------------------------------------------------------------------------------------------------
# An independent implementation of the privacy profile of C_q(G_{1/sigma}): the hockey-stick divergences of
# the pair A = ((1-q) N(0, s^2) + q N(1, s^2), N(0, s^2)) and of its swap, integrated numerically.


def hockey_stick(sigma: float, q: float, eps: float) -> float:
    """max over the two ordered pairs of integral (p - e^eps r)_+ dx, by adaptive quadrature."""

    def mixture(x: float) -> float:
        return float((1 - q) * norm.pdf(x, 0, sigma) + q * norm.pdf(x, 1, sigma))

    def base(x: float) -> float:
        return float(norm.pdf(x, 0, sigma))

    span = (-12 * sigma - 1, 12 * sigma + 2)

    def integral(p: Callable[[float], float], r: Callable[[float], float]) -> float:
        excess = lambda x: max(p(x) - math.exp(eps) * r(x), 0.0)  # noqa: E731
        return float(
            integrate.quad(excess, *span, points=[0.0, 0.5, 1.0], limit=400, epsabs=1e-14, epsrel=1e-10)[0]
        )

    return max(integral(mixture, base), integral(base, mixture))


@pytest.mark.slow
@pytest.mark.parametrize("sigma", [0.5, 1.0, 2.765, 10.0])
@pytest.mark.parametrize("q", [1e-3, 0.05, 0.5, 0.97, 1.0])
def test_profile_is_the_closed_form_of_both_pairs(sigma: float, q: float) -> None:
    """The closed form in log space equals the integrals to 1e-8 relative (or 1e-13 absolute), for positive
    and negative eps (the negative side from the symmetry delta(-e) = 1 - e^-e + e^-e delta(e))."""
    for eps in (-0.7, -0.05, 0.0, 0.01, 0.1, 0.5, 1.5, 4.0):
        expected = hockey_stick(sigma, q, eps)
        actual = float(pld.profile(sigma, q, np.array([eps]))[0])
        assert actual == pytest.approx(expected, rel=1e-8, abs=1e-13), (sigma, q, eps)


# --------------------------------------------------------------------------------------------------------
# Accuracy: the charged epsilon lies between an optimistic discretisation of the same trade-off (a lower
# bound of the exact value, built here independently of privacy_wall.accounting.pld's grid and rounding) and
# 2% above it.


def optimistic_epsilon(sigma: float, size: int, population: int, iterations: int, delta: float) -> float:
    """A lower bound on the exact epsilon: every privacy loss rounded down to a grid h, then composed.

    P(L > e) = delta(e) - delta'(e) for the loss L of a PLD (differentiate delta(e) = E[(1 - e^{e-L})_+]);
    the mass of [kh, (k+1)h) is put at kh, which only lowers every loss (an optimistic PLD); truncated tails
    are dropped or moved down (dp_accounting's optimistic estimate)."""
    q = size / population
    h = min(1e-4, pld.loss_scale(sigma, q) / 256)
    # Losses above `top` are dropped, which is optimistic too: delta(top) <= 1e-15 * delta.
    floor = math.log(1e-15 * delta)
    top = brentq(lambda e: max(float(pld.log_profile(sigma, q, np.array([e]))[0]), -1e3) - floor, 0, 1e3)
    ks = np.arange(-math.ceil(top / h), math.ceil(top / h) + 2)
    eps = ks * h
    step = h * 1e-3
    deltas = pld.profile(sigma, q, eps)
    right = pld.profile(sigma, q, eps + step)
    survival = np.clip(deltas - (right - deltas) / step, 0.0, 1.0)  # P(L > kh), right-continuous
    survival = np.minimum.accumulate(survival)
    probs = np.maximum(survival[:-1] - survival[1:], 0.0)
    pmf = pld_pmf.DensePLDPmf(h, int(ks[0]), probs, 0.0, pessimistic_estimate=False)
    composed = pmf.self_compose(iterations, tail_mass_truncation=1e-15) if iterations > 1 else pmf
    return float(composed.get_epsilon_for_delta(delta))


ACCURACY_CASES = [
    (1.24, 20_000, 400_000, 20, 1e-4),  # the LDA paper's setting
    (1.0, 130, 32_561, 100, 1e-3),  # Adult q = 0.004
    (2.765, 2_000, 2_786, 20, 1e-4),  # the README's LDA command
    (2.765, 2_785, 2_786, 20, 1e-4),  # q near 1
    (1.5, 10, 100_000, 20, 1e-5),  # q near 0
    (1.5, 30, 100_000, 50, 1e-8),
    (1.5, 400, 60_000, 150, 1e-12),  # delta 1e-12
    (5.0, 50, 398, 1, 1e-12),  # T = 1
]


@pytest.mark.parametrize("case", ACCURACY_CASES, ids=lambda c: "-".join(map(str, c)))
def test_charged_epsilon_is_within_two_percent_of_exact(case: tuple[float, int, int, int, float]) -> None:
    lower = optimistic_epsilon(*case)
    charged = epsilon(*case, accountant="pld")
    assert lower <= charged <= 1.02 * lower + 1e-6, (lower, charged)


@pytest.mark.parametrize(
    ("case", "tolerance"),
    [((3.0, 100, 32_561, 10_000, 1e-5), 0.002), ((1.5, 10, 100_000, 1_000, 1e-5), 0.002)],
    ids=["T=10^4", "q=1e-4,T=1000"],
)
@pytest.mark.slow
def test_many_releases_are_priced_as_on_a_grid_sixteen_times_finer(
    case: tuple[float, int, int, int, float], tolerance: float
) -> None:
    """Many releases: rounding every loss down biases the optimistic bound by up to T h / 2 (2.4% at
    q = 1e-4, T = 1,000), so there the exact value is approached from above instead: the charged epsilon
    stays above the optimistic bound and within `tolerance` of the same construction on a grid 16 times
    finer (measured: 0.08% and 0.01%; 64 times finer moves the second by 1e-6 more)."""
    sigma, size, population, iterations, delta = case
    charged = epsilon(*case, accountant="pld")
    groups = ((sigma, size, population, iterations),)
    finer = pld.epsilon_for_delta(pld.composed_pmf(groups, pld.grid(groups) / 16), delta)
    assert optimistic_epsilon(*case) <= finer <= charged <= (1 + tolerance) * finer


@pytest.mark.parametrize(
    ("size", "tight"), [(500, 1.092), (1_000, 2.307), (2_000, 4.813), (2_700, 6.589), (2_786, 6.808)]
)
def test_prices_rise_to_the_gaussian_at_full_batch(size: int, tight: float) -> None:
    """sigma 2.765, T 20, N 2,786, delta 1e-4: the issue's tight values, within 2% and never below."""
    charged = epsilon(2.765, size, 2_786, 20, 1e-4, "pld")
    assert tight - 5e-4 <= charged <= 1.02 * tight


def test_prices_never_fall_as_the_batch_grows() -> None:
    prices = [
        epsilon(2.765, size, 2_786, 20, 1e-4, "pld") for size in (500, 1_000, 2_000, 2_700, 2_785, 2_786)
    ]
    assert prices == sorted(prices)


def test_a_near_free_subsampled_release_barely_moves_a_full_batch_ledger() -> None:
    """One release at sigma 50 on S = 1 lifted a 0.800 full-batch ledger to 0.875 under the RDP fallback."""
    sigma = calibrate_sigma(0.8, 1_000, 1_000, 10, 1e-5)
    ledger = privacy_cost(SelfComposedEvent(SubsampledGaussianEvent(sigma, 1_000, 1_000), 10))
    both = ledger + privacy_cost(SubsampledGaussianEvent(50.0, 1, 1_000))
    assert ledger.epsilon(1e-5) <= 0.8
    assert both.epsilon(1e-5) <= ledger.epsilon(1e-5) + 1e-3


# --------------------------------------------------------------------------------------------------------
# Properties: monotone in S, T and 1/sigma; a ledger costs at most the sum of its jobs' own epsilons.

DELTAS = st.sampled_from([1e-3, 1e-5, 1e-8, 1e-12])
PROPERTY = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTY
@given(
    sigma=st.floats(0.6, 30.0),
    population=st.integers(2, 100_000),
    fractions=st.tuples(st.floats(0.0, 1.0), st.floats(0.0, 1.0)),
    iterations=st.integers(1, 300),
    delta=DELTAS,
)
@pytest.mark.slow
def test_price_is_monotone_in_the_batch(
    sigma: float, population: int, fractions: tuple[float, float], iterations: int, delta: float
) -> None:
    small, large = sorted(max(1, round(f * population)) for f in fractions)
    assert epsilon(sigma, small, population, iterations, delta, "pld") <= epsilon(
        sigma, large, population, iterations, delta, "pld"
    )


@PROPERTY
@given(
    sigmas=st.tuples(st.floats(0.6, 30.0), st.floats(0.6, 30.0)),
    size=st.integers(1, 5_000),
    population=st.integers(5_000, 100_000),
    counts=st.tuples(st.integers(1, 300), st.integers(1, 300)),
    delta=DELTAS,
)
def test_price_is_monotone_in_iterations_and_noise(
    sigmas: tuple[float, float], size: int, population: int, counts: tuple[int, int], delta: float
) -> None:
    quiet, loud = sorted(sigmas, reverse=True)
    few, many = sorted(counts)
    assert epsilon(quiet, size, population, few, delta, "pld") <= epsilon(
        loud, size, population, few, delta, "pld"
    )
    assert epsilon(loud, size, population, few, delta, "pld") <= epsilon(
        loud, size, population, many, delta, "pld"
    )


@PROPERTY
@given(
    jobs=st.lists(
        st.tuples(st.floats(0.6, 20.0), st.floats(0.001, 1.0), st.integers(1, 200)), min_size=2, max_size=4
    ),
    delta=DELTAS,
)
@pytest.mark.slow
def test_a_ledger_costs_at_most_the_sum_of_its_jobs(
    jobs: list[tuple[float, float, int]], delta: float
) -> None:
    """Sub-additivity at the ledger's delta is not a theorem for (epsilon, delta) in general (two jobs each
    of epsilon 0 at delta may compose to more than delta); it holds for jobs that each spend a meaningful
    epsilon, which is what this checks."""
    population = 10_000
    costs = [
        privacy_cost(
            SelfComposedEvent(SubsampledGaussianEvent(s, max(1, round(f * population)), population), t)
        )
        for s, f, t in jobs
    ]
    own = [cost.epsilon(delta) for cost in costs]
    if min(own) < 0.05:
        return
    total = costs[0]
    for cost in costs[1:]:
        total = total + cost
    assert max(own) <= total.epsilon(delta) <= sum(own)


def test_a_ledger_is_priced_alike_in_any_order() -> None:
    costs = [
        privacy_cost(SelfComposedEvent(SubsampledGaussianEvent(s, n, 20_000), t))
        for s, n, t in [(1.1, 200, 50), (2.0, 20_000, 5), (0.9, 50, 300), (4.0, 5_000, 20)]
    ]
    forward, backward = costs[0] + costs[1] + costs[2] + costs[3], costs[3] + costs[2] + costs[1] + costs[0]
    assert sorted(forward.releases) == sorted(backward.releases)
    # the same releases in another order: the same price up to the FFT's rounding bounds, which depend on
    # which blocks are composed together (~1e-9 here)
    assert forward.epsilon(1e-6) == pytest.approx(backward.epsilon(1e-6), rel=1e-7)


@pytest.mark.slow
def test_a_ledgers_price_is_a_function_of_its_releases_alone() -> None:
    """The same ledger costs the same priced fresh, after each of its prefixes, or after other ledgers on
    other grids (issue 50: a cache once moved prefixes across grids, and a ledger cost 0.2621 after its
    prefixes but 0.2553 fresh)."""
    groups = tuple((0.9 + 0.2 * k, 20 + 30 * k, 20_000, 20 + 40 * k) for k in range(5))
    delta = 1e-9
    pld.clear_caches()
    fresh = [pld.epsilon(groups[:end], delta) for end in range(len(groups), 0, -1)]
    pld.clear_caches()
    for end in range(1, len(groups) + 1):  # each prefix first, then a finer grid's version of it
        pld.composed_pmf(groups[:end], pld.grid(groups[:end]) / 4)
        pld.epsilon(groups[:end], delta)
    after = [pld.epsilon(groups[:end], delta) for end in range(len(groups), 0, -1)]
    assert after == fresh


# --------------------------------------------------------------------------------------------------------
# Calibration at every sampling rate.


@pytest.mark.slow
@pytest.mark.parametrize("size", [1, 20, 500, 2_000, 2_700, 2_785, 2_786])
@pytest.mark.parametrize("target", [0.1, 2.4])
def test_calibration_finds_its_bracket_at_every_rate(size: int, target: float) -> None:
    sigma = calibrate_sigma(target, size, 2_786, 20, 1e-4)
    charged = epsilon(sigma, size, 2_786, 20, 1e-4)
    assert charged <= target
    assert epsilon(sigma / 1.002, size, 2_786, 20, 1e-4) > target * 0.99  # the smallest, to the tolerance


def test_the_readme_lda_command_is_priced_just_under_its_target() -> None:
    """`vips privacy sigma --epsilon 2.4 --batch-size 2000 --population 2786 --iterations 20 --delta 1e-4`."""
    sigma = calibrate_sigma(2.4, 2_000, 2_786, 20, 1e-4)
    assert 2.3 <= epsilon(sigma, 2_000, 2_786, 20, 1e-4) <= 2.4


def test_optimistic_reference_is_below_the_known_tight_value() -> None:
    """The lower bound of the accuracy test is itself checked against a value the issue verified."""
    value = optimistic_epsilon(1.24, 20_000, 400_000, 20, 1e-4)
    assert 0.97 <= value <= 0.984


@pytest.mark.slow
def test_brentq_solution_of_one_release_matches_the_closed_form() -> None:
    """T = 1: the exact epsilon solves profile(eps) = delta; the accountant is within 2% above it."""
    sigma, q, delta = 1.3, 0.1, 1e-5
    exact = brentq(lambda e: hockey_stick(sigma, q, e) - delta, 0.0, 20.0, xtol=1e-10)
    charged = epsilon(sigma, 100, 1_000, 1, delta, "pld")
    assert exact - 1e-9 <= charged <= 1.02 * exact


@pytest.mark.parametrize(
    "groups",
    [
        ((1.24, 20_000, 400_000, 20),),
        ((0.5, 1, 2_786, 20),),
        ((2.765, 2_785, 2_786, 20), (3.0, 1, 1, 1)),
        ((0.3, 10, 20, 3),),
    ],
)
def test_epsilon_for_delta_is_dp_accountings(groups: tuple[pld.Group, ...]) -> None:
    """The vectorised search returns dp_accounting's `get_epsilon_for_delta` on the same PMF (to rounding)."""
    pmf = pld.composed_pmf(groups, pld.grid(groups))
    for delta in (0.5, 1e-3, 1e-5, 1e-12):
        assert pld.epsilon_for_delta(pmf, delta) == pytest.approx(
            pmf.get_epsilon_for_delta(delta), rel=1e-12, abs=1e-15
        )


@pytest.mark.parametrize(
    ("sigma", "q"), [(0.6, 200 / 60_000), (1.24, 0.05), (2.765, 2_000 / 2_786), (5.0, 1.0)]
)
def test_connect_the_dots_is_dp_accountings(sigma: float, q: float) -> None:
    """The array-built connect-the-dots PMF has dp_accounting's masses, offset and mass at +infinity."""
    h = 2.0**-12
    top = math.ceil(pld._upper_loss(sigma, q) / h)
    deltas = pld.profile(sigma, q, np.arange(-top, top + 1) * h)
    ours = pld.connect_the_dots(h, -top, deltas)
    theirs = pld_pmf.create_pmf_pessimistic_connect_dots_fixed_gap(h, -top, top, deltas).to_dense_pmf()
    assert ours._lower_loss == theirs._lower_loss
    assert ours._infinity_mass == theirs._infinity_mass
    np.testing.assert_array_equal(ours._probs, np.asarray(theirs._probs))


@pytest.mark.parametrize(
    ("group", "h"), [((1.5, 200, 60_000, 100), 2.0**-14), ((0.8, 20_000, 400_000, 20), 2.0**-12)]
)
def test_self_composition_keeps_dp_accountings_masses_on_a_narrower_window(
    group: pld.Group, h: float
) -> None:
    """The group's power has dp_accounting's mass at +infinity and its masses on a window inside
    dp_accounting's Chernoff window (finer orders: narrower; theirs holds only rounding noise outside it); the
    masses are dp_accounting's plus at most the FFT's rounding bound (~1e-12 here), never below them but
    for dp_accounting's own rounding (~1e-17)."""
    sigma, size, population, count = group
    release = pld.release_pmf(sigma, size, population, h)
    ours = pld._self_composed(release, count)
    theirs = release.self_compose(count, tail_mass_truncation=pld.COMPOSITION_TAIL)
    assert ours._infinity_mass == theirs._infinity_mass
    start = ours._lower_loss - theirs._lower_loss
    assert start >= 0 and start + len(ours._probs) <= len(theirs._probs)
    overlap = np.asarray(theirs._probs)[start : start + len(ours._probs)]
    outside = np.concatenate([theirs._probs[:start], theirs._probs[start + len(ours._probs) :]])
    assert np.abs(outside).max() <= 1e-16  # what theirs holds outside is FFT noise, no mass
    excess = np.asarray(ours._probs) - overlap
    assert excess.min() >= -1e-16
    assert excess.max() <= 1e-11


# --------------------------------------------------------------------------------------------------------
# Compositions whose far tail the FFT's rounding would swamp (issue 34): every mass an upper bound.


def direct_power(probs: np.ndarray, count: int) -> np.ndarray:
    """probs^{*count} by direct convolution (binary powering): every output is a sum of products of
    non-negative numbers, so each has relative error <= ~(log2(count) + 1) len u, however small it is."""
    result, square = np.ones(1), probs.copy()
    while count:
        if count & 1:
            result = np.convolve(result, square)
        count >>= 1
        if count:
            square = np.convolve(square, square)
    return result


def test_every_composed_mass_bounds_the_exact_one_from_above() -> None:
    """A spread PMF (masses from 1e-30 to 0.3) to the 400th power: against direct convolution (relative
    error ~1e-12), every mass of the window is >= the exact one, and within 1e-3 of it wherever it is above
    1e-250 from the mode up (where delta is decided: the far upper tail's exact masses are ~1e-200, where an
    untilted FFT is off by ~1e-16 absolute, checked here, so the test fails without the tilts). Below the
    mode masses may carry the untilted bound (~1e-12): losses there decide no delta."""
    from privacy_wall.accounting.convolution import convolution_power

    offsets = np.arange(-12, 13, dtype=np.float64)
    probs = np.exp(-0.5 * offsets**2 / 2.0 - 0.2 * np.maximum(offsets, 0) ** 1.5)
    probs /= probs.sum()
    count = 400
    exact = direct_power(probs, count)
    lower, masses = convolution_power([(probs, count)], 1e-18)
    window = exact[lower : lower + len(masses)]
    assert (masses >= window * (1.0 - 1e-9)).all()
    meaningful = (window > 1e-250) & (np.arange(len(window)) >= np.argmax(window))
    assert np.abs(masses[meaningful] / window[meaningful] - 1.0).max() < 1e-3
    plain = np.fft.irfft(np.fft.rfft(probs, len(exact)) ** count, len(exact))[lower : lower + len(masses)]
    assert np.abs(plain[meaningful] / window[meaningful] - 1.0).max() > 1.0  # what this test guards against


def test_a_rarely_large_loss_is_not_padded_past_its_mass(monkeypatch: pytest.MonkeyPatch) -> None:
    """sigma 0.68 on 1 of 83,333 records (a loss that is almost always ~0 and rarely large), 20 releases at
    delta 7.3e-11: the composition's masses between its modes are below a float64 transform's absolute
    error, whose bound once charged 0.2717 for 0.1333 (issue 50, T 3,646). Long-double transforms, used
    where the bounds would add more than 1e-3 to the mass above some loss, charge within 1e-4 of
    dp_accounting's unpadded composition of the same PMF (0.034552 against 0.034551), never below it;
    float64 alone charged 2.4% more (0.035373: what the test guards against)."""
    from privacy_wall.accounting import convolution

    release = pld.release_pmf(0.68, 1, 83_333, 2.0**-14)
    delta = 7.3e-11
    unpadded = pld.epsilon_for_delta(
        release.self_compose(20, tail_mass_truncation=pld.COMPOSITION_TAIL), delta
    )
    charged = pld.epsilon_for_delta(pld._self_composed(release, 20), delta)
    assert unpadded <= charged <= unpadded * (1 + 1e-4)
    monkeypatch.setattr(convolution, "PRECISE_DTYPE", np.float64)
    assert pld.epsilon_for_delta(pld._self_composed(release, 20), delta) > unpadded * 1.01


def test_a_product_of_powers_bounds_the_exact_one_from_above() -> None:
    """Two different PMFs, powers 150 and 1 (a ledger of a group and one more release), against direct
    convolution: every mass is >= the exact one and within 1e-3 of it above 1e-250 from the mode up."""
    from privacy_wall.accounting.convolution import convolution_power

    rng = np.random.default_rng(7)
    first = np.exp(-(np.linspace(0, 40, 31) ** 1.3)) * rng.uniform(0.5, 1.0, 31)
    second = np.exp(-np.linspace(0, 20, 12)) * rng.uniform(0.5, 1.0, 12)
    first, second = first / first.sum(), second / second.sum()
    exact = np.convolve(direct_power(first, 150), second)
    lower, masses = convolution_power([(first, 150), (second, 1)], 1e-18)
    window = exact[lower : lower + len(masses)]
    assert (masses >= window * (1.0 - 1e-9)).all()
    meaningful = (window > 1e-250) & (np.arange(len(window)) >= np.argmax(window))
    assert np.abs(masses[meaningful] / window[meaningful] - 1.0).max() < 1e-3


def tilted_delta(pmf: pld_pmf.DensePLDPmf, count: int, eps: float) -> float:
    """delta(eps) of `pmf` composed `count` times, by one exponential tilt at the Chernoff point of eps (an
    independent evaluation of the same composition: the tilted power's masses near eps carry relative,
    not absolute, rounding error), summed over losses above eps; mass at +infinity composed exactly."""
    probs = np.maximum(np.asarray(pmf._probs, dtype=np.float64), 0.0)
    h = pmf._discretization
    index = np.arange(len(probs), dtype=np.float64)
    target = eps / h - pmf._lower_loss * count  # eps as an index of the sum

    def tilted(theta: float) -> tuple[np.ndarray, float, float]:
        logs = np.log(np.where(probs > 0, probs, 1.0)) + theta * index
        logs[probs == 0] = -np.inf
        top = logs.max()
        weights = np.exp(logs - top)
        total = weights.sum()
        weights /= total
        return weights, float(top + np.log(total)), float(np.dot(weights, index)) * count

    theta = brentq(lambda t: tilted(t)[2] - target, 0.0, 1.0)
    weights, log_m, mean = tilted(theta)
    spread = math.sqrt(count * float(np.dot(weights, (index - mean / count) ** 2)))
    start = int(mean - 60 * spread)  # the tilted sum's mass beyond 60 of its sds is negligible
    length = 1 << math.ceil(math.log2(120 * spread + len(probs)))
    power = np.fft.irfft(np.fft.rfft(weights, length) ** count, length)
    j = np.arange(start, start + length, dtype=np.float64)
    losses = (pmf._lower_loss * count + j) * h
    above = losses > eps
    masses = np.take(power, np.arange(start, start + length) % length)[above]
    masses = masses * np.exp(count * log_m - theta * j[above])
    finite = (1.0 - pmf._infinity_mass) ** count
    return float(1.0 - finite + np.sum(masses * -np.expm1(eps - losses[above])))


def test_a_long_schedule_at_tiny_delta_is_charged_at_least_its_tilted_value() -> None:
    """Issue 34's audit: sigma 1, S 100 of 10^5, T 10^5 at delta 1e-10 was charged 3.3576 where a tilted
    composition of the ledger's own PMF gives 3.3660 (3.3653 on a grid twice as fine). Now charged >=
    3.3653, and at the charged epsilon an independently tilted composition finds delta <= 1e-10."""
    group = (1.0, 100, 100_000, 100_000)
    charged = epsilon(1.0, 100, 100_000, 100_000, 1e-10, accountant="pld")
    assert charged >= 3.3653
    release = pld.release_pmf(1.0, 100, 100_000, pld.grid((group,)))
    assert tilted_delta(release, 100_000, charged) <= 1e-10
    assert tilted_delta(release, 100_000, 0.999 * charged) > 1e-10  # and not far above it
