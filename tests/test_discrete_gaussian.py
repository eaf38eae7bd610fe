"""The exact discrete Gaussian sampler: its distribution, its refusals, its integer-only arithmetic."""

from __future__ import annotations

import ast
import hashlib
import inspect
import math
import textwrap
from fractions import Fraction
from math import isqrt

import numpy as np
import pytest
from numpy.typing import NDArray
from randomgen import AESCounter
from scipy import stats

from privacy_wall import discrete_gaussian as dg
from privacy_wall.discrete_gaussian import (
    DENOMINATOR_MAX,
    SIGMA2_MAX,
    V_CAP,
    rational_sigma2,
    sample_discrete_gaussian,
)

DRAWS = 1_000_000
EXTREME = Fraction(2**60 - 1, DENOMINATOR_MAX)  # sigma^2 just under 2^48 with the largest denominator


class SplitMix64:
    """An integer-only bit source (SplitMix64 over uint64 arrays): the same words on every platform."""

    def __init__(self, seed: int) -> None:
        self.counter = seed

    def random_raw(self, size: int) -> NDArray[np.uint64]:
        z = (np.arange(1, size + 1, dtype=np.uint64) + np.uint64(self.counter)) * np.uint64(
            0x9E3779B97F4A7C15
        )
        self.counter += size
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        words: NDArray[np.uint64] = z ^ (z >> np.uint64(31))
        return words


def aes(key: int) -> np.random.Generator:
    return np.random.Generator(AESCounter(key=key))


def pmf(sigma2: Fraction) -> tuple[NDArray[np.int64], NDArray[np.float64]]:
    """exp(-k^2 / (2 sigma2)) / normaliser on |k| <= 12 sigma + 3 (the rest weighs under e^-72)."""
    reach = int(12 * math.sqrt(sigma2)) + 3
    k = np.arange(-reach, reach + 1, dtype=np.int64)
    weights = np.exp(-(k.astype(np.float64) ** 2) / (2 * float(sigma2)))
    return k, weights / weights.sum()


def chi_square_p(samples: NDArray[np.int64], sigma2: Fraction) -> float:
    """Chi-square p-value of the samples against the exact pmf, on bins of width ~sigma/6 over
    [-4.5 sigma, 4.5 sigma] plus the two tails, neighbours merged until every bin expects >= 5."""
    sigma = math.sqrt(sigma2)
    width = max(1, int(sigma / 6))
    edges = np.arange(-int(4.5 * sigma) - 1, int(4.5 * sigma) + 2, width)
    k, p = pmf(sigma2)
    expected = np.bincount(np.digitize(k, edges), weights=p, minlength=edges.size + 1) * samples.size
    observed = np.bincount(np.digitize(samples, edges), minlength=edges.size + 1).astype(np.float64)
    merged_e: list[float] = []
    merged_o: list[float] = []
    acc_e = acc_o = 0.0
    for e, o in zip(expected, observed, strict=True):
        acc_e, acc_o = acc_e + e, acc_o + o
        if acc_e >= 5:
            merged_e.append(acc_e)
            merged_o.append(acc_o)
            acc_e = acc_o = 0.0
    merged_e[-1] += acc_e
    merged_o[-1] += acc_o
    e_arr, o_arr = np.array(merged_e), np.array(merged_o)
    assert o_arr.sum() == samples.size and len(merged_e) >= 8
    statistic = float(((o_arr - e_arr) ** 2 / e_arr).sum())
    return float(stats.chi2.sf(statistic, len(merged_e) - 1))


@pytest.mark.parametrize(
    "sigma2",
    [Fraction(1), Fraction(9, 4), rational_sigma2(3.7), Fraction(1_000_003, 7), Fraction(10**10 + 1, 3)],
    ids=["sigma=1", "sigma=1.5", "sigma~3.7", "sigma~378", "sigma~57735"],
)
def test_chi_square_against_the_exact_pmf(sigma2: Fraction) -> None:
    samples = sample_discrete_gaussian(sigma2, DRAWS, aes(key=2024))
    assert samples.dtype == np.int64 and samples.shape == (DRAWS,)
    assert chi_square_p(samples, sigma2) > 1e-3


@pytest.mark.parametrize(
    "sigma2",
    [
        Fraction(1),
        Fraction(9, 4),
        Fraction(2**40),
        Fraction(2**40 + 1, 3),
        EXTREME,
    ],
)
def test_mean_and_variance(sigma2: Fraction) -> None:
    n = 200_000
    samples = sample_discrete_gaussian(sigma2, n, aes(key=7))
    if sigma2 < 100:
        k, p = pmf(sigma2)
        variance = float((k.astype(np.float64) ** 2 * p).sum())
    else:  # Poisson summation: the discrete variance is sigma2 (1 - O(exp(-2 pi^2 sigma2)))
        variance = float(sigma2)
    values = samples.astype(np.float64)
    assert abs(values.mean()) < 5 * math.sqrt(variance / n)
    # Var of the sample variance ~ 2 variance^2 / n for a near-Gaussian
    assert abs(values.var() - variance) < 5 * variance * math.sqrt(2 / n)


@pytest.mark.parametrize(
    "sigma2",
    [Fraction(9, 4), rational_sigma2(3.7), Fraction(1_000_003, 7), Fraction(10**10 + 1, 3)],
    ids=["sigma=1.5", "sigma~3.7", "sigma~378", "sigma~57735"],
)
def test_wide_calls_follow_the_pmf(sigma2: Fraction) -> None:
    """Calls of up to WIDE_BELOW draws run the wide loops (geometric part and Gaussian test drawn several
    at a time): 10^6 draws in calls of 3,000 against the exact pmf, as the single large call above."""
    size = 3_000
    assert size * 17 // 8 + 32 <= dg.WIDE_BELOW  # the lanes of a first round are in the wide mode
    rng = aes(key=2025)
    samples = np.concatenate([sample_discrete_gaussian(sigma2, size, rng) for _ in range(DRAWS // size)])
    assert chi_square_p(samples, sigma2) > 1e-3


@pytest.mark.parametrize("sigma2", [Fraction(2**44 + 1, 3), EXTREME], ids=["release-grid", "extreme"])
def test_wide_calls_mean_and_variance_at_the_release_scale(sigma2: Fraction) -> None:
    """At the scale fixed-point releases use (2^22 to 2^24 grid steps) in wide calls: mean and variance."""
    rng = aes(key=2026)
    n = 200_000
    values = np.concatenate([sample_discrete_gaussian(sigma2, 2_000, rng) for _ in range(n // 2_000)])
    values_f = values.astype(np.float64)
    variance = float(sigma2)  # Poisson summation: exact to a relative exp(-2 pi^2 sigma2)
    assert abs(values_f.mean()) < 5 * math.sqrt(variance / n)
    assert abs(values_f.var() - variance) < 5 * variance * math.sqrt(2 / n)


def test_many_small_calls_follow_the_pmf_too() -> None:
    """Small calls finish in one or two rounds of oversampled lanes; their draws must still be exact."""
    rng = aes(key=99)
    samples = np.concatenate(
        [sample_discrete_gaussian(Fraction(9, 4), size, rng) for size in [1, 2, 5] * 700]
    )
    assert samples.size == 5_600
    assert chi_square_p(samples, Fraction(9, 4)) > 1e-3


def test_integer_only_source_gives_the_same_bits_every_time() -> None:
    first = sample_discrete_gaussian(Fraction(9, 4), 5_000, SplitMix64(1))
    second = sample_discrete_gaussian(Fraction(9, 4), 5_000, SplitMix64(1))
    assert np.array_equal(first, second)
    assert not np.array_equal(first, sample_discrete_gaussian(Fraction(9, 4), 5_000, SplitMix64(2)))
    # Pinned digests: a float anywhere in the path (or a platform-dependent step) would move them.
    digests = {
        str(sigma2): hashlib.sha256(
            sample_discrete_gaussian(sigma2, 5_000, SplitMix64(3)).astype("<i8").tobytes()
        ).hexdigest()[:16]
        for sigma2 in (Fraction(9, 4), Fraction(2**40 + 1, 3), EXTREME)
    }
    assert digests == GOLDEN, digests


# sha256 prefixes of 5,000 draws from SplitMix64(3); they change only if the algorithm's use of the words does
# (last: issue 25's wide mode for calls of up to WIDE_BELOW lanes, which 5,000 draws use)
GOLDEN = {
    "9/4": "ce02bd6461cb0f80",
    "1099511627777/3": "72f2954c63877f9e",
    "1152921504606846975/4096": "5b28dae258ace0b4",
}


class FloatFreeGenerator(np.random.Generator):
    """A Generator whose float samplers refuse to run: the sampler may only read its bit generator."""

    def _refuse(self, *_: object, **__: object) -> None:
        raise AssertionError("the discrete Gaussian sampler must not call a float sampler")

    random = normal = standard_normal = uniform = exponential = standard_exponential = integers = _refuse  # type: ignore[assignment]


def test_a_generator_whose_float_methods_raise_gives_the_raw_bit_streams_samples() -> None:
    """The sampler reads only the bit generator's raw words (the syntax-tree test below is the check that
    no float operation is in its code)."""
    with np.errstate(all="raise"):
        for sigma2 in (
            Fraction(1),
            Fraction(9, 4),
            Fraction(2**40 + 1, 3),
            EXTREME,
        ):
            through_generator = sample_discrete_gaussian(
                sigma2, 20_000, FloatFreeGenerator(AESCounter(key=11))
            )
            through_bits = sample_discrete_gaussian(sigma2, 20_000, aes(key=11).bit_generator)
            assert np.array_equal(through_generator, through_bits)
            assert through_generator.dtype == np.int64


# np.random.Generator is named (to unwrap its bit generator); its float methods are refused below
FLOAT_NAMES = {"float", "float32", "float64", "exp", "log", "sqrt", "normal", "standard_normal", "uniform"}


def test_sampling_code_has_no_float_operation() -> None:
    """No true division, float literal or float function in the sampling path (math.isqrt is integer)."""
    for function in (dg._below, dg._bernoulli_exp, dg._geometric, dg.sample_discrete_gaussian):
        tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
        for node in ast.walk(tree):
            assert not (isinstance(node, ast.BinOp | ast.AugAssign) and isinstance(node.op, ast.Div)), (
                function
            )
            assert not (isinstance(node, ast.Constant) and isinstance(node.value, float)), function
            name = (
                node.id
                if isinstance(node, ast.Name)
                else node.attr
                if isinstance(node, ast.Attribute)
                else ""
            )
            assert name not in FLOAT_NAMES, (function, name)


@pytest.mark.parametrize(
    "sigma2",
    [
        Fraction(0),
        Fraction(1, 2),
        Fraction(4095, 4096),
        Fraction(SIGMA2_MAX + 1),
        Fraction(SIGMA2_MAX * DENOMINATOR_MAX + 1, DENOMINATOR_MAX),
        Fraction(3, DENOMINATOR_MAX + 1) + 1,
        Fraction(-4),
    ],
)
def test_out_of_range_parameters_are_refused(sigma2: Fraction) -> None:
    with pytest.raises(ValueError, match="sigma\\^2"):
        sample_discrete_gaussian(sigma2, 10, aes(key=1))


def test_non_rational_sigma2_and_bad_sizes_are_refused() -> None:
    with pytest.raises(ValueError, match="Fraction"):
        sample_discrete_gaussian(2.25, 10, aes(key=1))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="size"):
        sample_discrete_gaussian(Fraction(4), -1, aes(key=1))
    assert sample_discrete_gaussian(Fraction(4), 0, aes(key=1)).shape == (0,)
    assert sample_discrete_gaussian(4, 3, aes(key=1)).dtype == np.int64  # type: ignore[arg-type]


@pytest.mark.parametrize("sigma", [1.0, 1.0000001, 1.5, math.pi, 1000.3, 2.0**20 * 1.37, 2.0**24])
@pytest.mark.parametrize("denominator", [1, 7, DENOMINATOR_MAX])
def test_rational_sigma2_rounds_up_within_one_step(sigma: float, denominator: int) -> None:
    sigma2 = rational_sigma2(sigma, denominator)
    exact = Fraction(sigma) ** 2
    assert exact <= sigma2 < exact + Fraction(1, denominator)
    assert sigma2.denominator <= denominator


@pytest.mark.parametrize(
    ("sigma", "denominator"),
    [(0.999, 1), (0.0, 4), (-2.0, 4), (math.nan, 4), (math.inf, 4), (2.0**24 + 1, 4), (2.0, 0), (2.0, 4097)],
)
def test_rational_sigma2_refuses_out_of_range(sigma: float, denominator: int) -> None:
    with pytest.raises(ValueError):
        rational_sigma2(sigma, denominator)


def test_no_intermediate_overflows_int64_at_the_extremes() -> None:
    """Recompute, in Python integers, the bound of every int64 intermediate named in the module docstring,
    for the extreme parameters allowed, and check that anything just past them is refused."""
    limit = 2**63 - 1
    extremes = [
        Fraction(1),
        Fraction(DENOMINATOR_MAX + 1, DENOMINATOR_MAX),
        Fraction(SIGMA2_MAX),
        Fraction(SIGMA2_MAX * DENOMINATOR_MAX - 1, DENOMINATOR_MAX),
        EXTREME,
    ]
    for sigma2 in extremes:
        p, q = sigma2.numerator, sigma2.denominator
        assert 1 <= sigma2 <= SIGMA2_MAX and q <= DENOMINATOR_MAX and p <= 2**60
        t = isqrt(p // q) + 1
        d = q * t * t
        n_c = -(-d // (2 * p))
        assert t * t > sigma2 and n_c <= 2  # so |w| / D < 1 and c <= 2
        uniform_bounds = [t, d, 2 * p * n_c, V_CAP + 1]  # V_CAP + 1 bounds I + 1
        assert max(uniform_bounds) <= 2**62
        largest_x = (t - 1) + t * (V_CAP - 1)  # U < t, V < V_CAP
        largest_w = max((t - 1) * t * q - p, p)  # w = U t q - p in [-p, D)
        largest_stages = (V_CAP + 1) ** 2 * n_c
        # (t q) and 2 (|y|) are the largest factors an int64 is multiplied by
        assert max(largest_x * 2, (t - 1) * t * q, largest_w, d + largest_w, largest_stages) <= limit
        assert largest_x < 2**55 and largest_w < 2**61
        sample_discrete_gaussian(sigma2, 1_000, aes(key=5))


def test_capping_the_geometric_part_truncates_the_support(monkeypatch: pytest.MonkeyPatch) -> None:
    """With V capped at 1 the proposal never leaves [-t, t]: the cap rejects, it does not clamp."""
    monkeypatch.setattr(dg, "V_CAP", 1)
    samples = sample_discrete_gaussian(Fraction(100), 50_000, aes(key=3))
    assert np.abs(samples).max() < 11  # t = 11
    assert np.abs(samples).max() >= 9


@pytest.mark.parametrize("bound", [2, 3, 255, 256, 257, 2**20 + 1, 2**24 + 1, 2**40 + 3, 2**62])
def test_uniform_integers_below_a_bound(bound: int) -> None:
    values = dg._below(aes(key=bound % 1000).bit_generator, bound, 200_000)
    assert values.dtype == np.int64 and values.min() >= 0 and values.max() < bound
    width = -(-bound // 64)  # bins [j w, (j + 1) w); the last one may be shorter
    bins = -(-bound // width)
    counts = np.bincount(values // width, minlength=bins)
    sizes = np.array([min(bound, (j + 1) * width) - j * width for j in range(bins)], dtype=np.float64)
    assert stats.chisquare(counts, sizes / sizes.sum() * values.size).pvalue > 1e-3


def test_uniform_integers_below_per_lane_bounds() -> None:
    bounds = np.array([1, 2, 3, 5, 1000, 2**30 + 1] * 20_000, dtype=np.int64)
    values = dg._below(aes(key=9).bit_generator, bounds, bounds.size)
    assert np.all((values >= 0) & (values < bounds))
    threes = values[bounds == 3]
    assert stats.chisquare(np.bincount(threes, minlength=3)).pvalue > 1e-3
