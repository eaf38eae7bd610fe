"""The exact discrete Gaussian sampler: its distribution, its refusals, its integer-only arithmetic.

The compiled sampler (privacy_wall/noise/_discrete_gaussian.pyx) is checked against `Reference`, the same
algorithm written here in Python integers (which cannot overflow), consuming the same 64-bit words in the same
order:
bit-identical outputs on many parameters, extremes included, show the compiled code is exact there.
"""

from __future__ import annotations

import ast
import hashlib
import inspect
import io
import math
import re
import textwrap
import tokenize
from collections.abc import Callable
from fractions import Fraction
from math import isqrt
from pathlib import Path

import numpy as np
import pytest
from numpy.typing import NDArray
from randomgen import AESCounter
from scipy import stats

from privacy_wall.noise import _discrete_gaussian as core
from privacy_wall.noise import discrete_gaussian as dg
from privacy_wall.noise.discrete_gaussian import (
    DENOMINATOR_MAX,
    SIGMA2_MAX,
    V_CAP,
    rational_sigma2,
    sample_discrete_gaussian,
)

DRAWS = 1_000_000
EXTREME = Fraction(2**60 - 1, DENOMINATOR_MAX)  # sigma^2 just under 2^48 with the largest denominator
PYX = Path(dg.__file__).with_name("_discrete_gaussian.pyx")


class Reference:
    """The sampler of privacy_wall.noise.discrete_gaussian's docstring in Python integers, over a list of
    words."""

    def __init__(self, words: list[int]) -> None:
        self.words = words
        self.used = 0  # words taken
        self.pool = 0  # the unused high bits of the last word cut into pieces
        self.pool_bits = 0

    def word(self) -> int:
        self.used += 1
        return self.words[self.used - 1]

    def piece(self, size: int) -> int:
        if self.pool_bits < size:
            self.pool, self.pool_bits = self.word(), 64
        x: int = self.pool % 2**size
        self.pool, self.pool_bits = self.pool >> size, self.pool_bits - size
        return x

    def below(self, bound: int) -> int:
        """Lemire's multiply-shift with exact rejection on 16-bit, 32-bit pieces or whole words."""
        assert 1 <= bound <= 2**62
        if bound == 1:
            return 0
        size = 16 if bound <= 2**8 else 32 if bound <= 2**32 else 64
        while True:
            m = (self.piece(size) if size < 64 else self.word()) * bound
            if m % 2**size >= 2**size % bound:
                return m >> size

    def bernoulli_exp(self, factors: list[Callable[[], bool]]) -> bool:
        """CKS Algorithm 1: K = 1; while Bernoulli(1/K) and the factors (in order, lazily): K += 1; K odd."""
        k = 1
        while self.below(k) == 0 and all(factor() for factor in factors):
            k += 1
        return k % 2 == 1

    def sample(self, sigma2: Fraction, size: int, v_cap: int = V_CAP) -> list[int]:
        p, q = sigma2.numerator, sigma2.denominator
        t = isqrt(p // q) + 1
        d = q * t * t
        n_c = -(-d // (2 * p))
        out: list[int] = []
        while len(out) < size:
            u = self.below(t)
            if not self.bernoulli_exp([lambda: self.below(t) < u]):  # noqa: B023 (called at once)
                continue
            v = 0
            while v < v_cap and self.bernoulli_exp([]):
                v += 1
            if v >= v_cap:
                continue
            sign = self.below(2)
            if sign == 1 and u == 0 and v == 0:
                continue
            x = u + t * v
            w = u * t * q - p
            i, f = (v, w) if w >= 0 else (v - 1, d + w) if v > 0 else (0, -w)

            def a(i: int = i, f: int = f) -> bool:  # Bernoulli((I + F/D) / (I + 1))
                return self.below(i + 1) < i or self.below(d) < f

            c = [lambda: self.below(2 * p * n_c) < d] if 2 * p * n_c > d else []
            if all(self.bernoulli_exp([*c, a, a]) for _ in range((i + 1) ** 2 * n_c)):
                out.append(-x if sign else x)
        return out


def aes(key: int) -> np.random.Generator:
    return np.random.Generator(AESCounter(key=key))


def normal_bins(edges: NDArray[np.int64], sigma2: Fraction) -> NDArray[np.float64]:
    """Probabilities of the bins (-inf, e_0), [e_0, e_1), ..., [e_last, inf) under N_Z(0, sigma2)."""
    sigma = math.sqrt(sigma2)
    if sigma < 1_000:
        reach = int(12 * sigma) + 3  # the rest weighs under e^-72
        k = np.arange(-reach, reach + 1, dtype=np.int64)
        weights = np.exp(-(k.astype(np.float64) ** 2) / (2 * float(sigma2)))
        mass = np.bincount(np.digitize(k, edges), weights=weights / weights.sum(), minlength=edges.size + 1)
        return mass.astype(np.float64)
    # Sum of exp(-k^2 / 2s) over a <= k < b vs the normal mass of [a - 1/2, b - 1/2]: the midpoint rule's
    # relative error is O(1/s) per bin (below 1e-6 here), far under what 10^6 draws resolve.
    cdf = stats.norm.cdf((edges.astype(np.float64) - 0.5) / sigma)
    return np.diff(np.concatenate([[0.0], cdf, [1.0]]))


def chi_square_p(samples: NDArray[np.int64], sigma2: Fraction) -> float:
    """Chi-square p-value of the samples against the exact pmf, on bins of width ~sigma/6 over
    [-4.5 sigma, 4.5 sigma] plus the two tails, neighbours merged until every bin expects >= 5."""
    sigma = math.sqrt(sigma2)
    width = max(1, int(sigma / 6))
    edges = np.arange(-int(4.5 * sigma) - 1, int(4.5 * sigma) + 2, width)
    expected = normal_bins(edges, sigma2) * samples.size
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
    [
        Fraction(1),
        Fraction(DENOMINATOR_MAX + 1, DENOMINATOR_MAX),
        Fraction(9, 4),
        rational_sigma2(3.7),
        Fraction(1_000_003, 7),
        Fraction(10**10 + 1, 3),
        Fraction(2**40 + 5, 3),
        EXTREME,
    ],
    ids=["sigma=1", "sigma~1", "sigma=1.5", "sigma~3.7", "sigma~378", "sigma~57735", "sigma~2^20", "extreme"],
)
def test_chi_square_against_the_exact_pmf(sigma2: Fraction) -> None:
    samples = sample_discrete_gaussian(sigma2, DRAWS, aes(key=2024))
    assert samples.dtype == np.int64 and samples.shape == (DRAWS,)
    assert chi_square_p(samples, sigma2) > 1e-3


@pytest.mark.parametrize(
    "sigma2",
    [Fraction(1), Fraction(9, 4), Fraction(2**40), Fraction(2**40 + 1, 3), EXTREME],
)
def test_mean_and_variance(sigma2: Fraction) -> None:
    n = 200_000
    samples = sample_discrete_gaussian(sigma2, n, aes(key=7))
    if sigma2 < 100:
        k = np.arange(-200, 201, dtype=np.float64)  # 12 sigma and more
        p = np.exp(-(k**2) / (2 * float(sigma2)))
        variance = float((k**2 * p).sum() / p.sum())
    else:  # Poisson summation: the discrete variance is sigma2 (1 - O(exp(-2 pi^2 sigma2)))
        variance = float(sigma2)
    values = samples.astype(np.float64)
    assert abs(values.mean()) < 5 * math.sqrt(variance / n)
    # Var of the sample variance ~ 2 variance^2 / n for a near-Gaussian
    assert abs(values.var() - variance) < 5 * variance * math.sqrt(2 / n)


@pytest.mark.parametrize(
    ("sigma2", "size"),
    [(Fraction(9, 4), 3), (rational_sigma2(3.7), 253), (Fraction(2**44 + 1, 3), 253)],
    ids=["sigma=1.5", "sigma~3.7", "release-grid"],
)
def test_many_small_calls_follow_the_pmf_too(sigma2: Fraction, size: int) -> None:
    """Each call starts with an empty pool of bits (the last word's unused bits are dropped): calls of a
    few draws, as small releases make, follow the pmf as well (2 10^5 draws)."""
    rng = aes(key=99)
    calls = 200_000 // size
    samples = np.concatenate([sample_discrete_gaussian(sigma2, size, rng) for _ in range(calls)])
    assert samples.size == calls * size
    assert chi_square_p(samples, sigma2) > 1e-3


# Parameters that exercise every path of the arithmetic: sigma2 = 1 and just above it (n_c = 2), 2 and 9/2
# (2 p n_c = D: Bernoulli(c / n_c) certain, skipped), t crossing 2^8 (16- and 32-bit pieces), D = q t^2 at
# 2^32 (32-bit pieces) and just above it (whole words), the release grid's scale and the extremes.
REPLAYED = [
    Fraction(1),
    Fraction(DENOMINATOR_MAX + 1, DENOMINATOR_MAX),
    Fraction(9, 4),
    Fraction(2),
    Fraction(9, 2),
    rational_sigma2(3.7),
    rational_sigma2(math.pi, 7),
    Fraction(255**2),
    Fraction(256**2 - 1),
    Fraction(1_000_003, 7),
    Fraction(2**32 - 1),
    Fraction(2**32),
    Fraction(10**10 + 1, 3),
    Fraction(2**40 + 1, 3),
    Fraction(2**44 + 1, 3),
    Fraction(SIGMA2_MAX - 1),
    Fraction(SIGMA2_MAX),
    Fraction(SIGMA2_MAX * DENOMINATOR_MAX - 1, DENOMINATOR_MAX),
    EXTREME,
]


@pytest.mark.parametrize("sigma2", REPLAYED, ids=str)
@pytest.mark.parametrize("make", [np.random.PCG64, np.random.SFC64], ids=["PCG64", "SFC64"])
def test_the_compiled_sampler_replays_the_python_integer_reference(
    sigma2: Fraction, make: Callable[[int], np.random.BitGenerator]
) -> None:
    """Same words, same order, same outputs: the compiled int64 code equals the reference in unbounded
    Python integers, and it took exactly as many words."""
    size = 300
    seed = sigma2.numerator % 1_000_003
    words = make(seed).random_raw(40 * size).tolist()
    reference = Reference(words)
    expected = reference.sample(sigma2, size)
    bits = make(seed)
    got = sample_discrete_gaussian(sigma2, size, bits)
    assert got.tolist() == expected
    assert int(bits.random_raw()) == words[reference.used]  # the next word is the first one not used


def test_the_replay_holds_for_the_production_stream_and_the_capped_proposal() -> None:
    """AESCounter (what private_generator builds) hands the sampler the words of its random_raw; with V
    capped at 1 (the rejection branch of the cap) the replay still holds."""
    for sigma2 in (Fraction(9, 4), Fraction(2**44 + 1, 3), EXTREME):
        words = AESCounter(key=77).random_raw(20_000).tolist()
        reference = Reference(words)
        assert sample_discrete_gaussian(sigma2, 500, aes(key=77)).tolist() == reference.sample(sigma2, 500)
        reference = Reference(words)
        capped = core.sample(AESCounter(key=77), sigma2.numerator, sigma2.denominator, 500, 1)
        assert capped.tolist() == reference.sample(sigma2, 500, v_cap=1)


@pytest.mark.parametrize(
    "bound", [2, 3, 255, 256, 257, 2**24 + 1, 2**32 - 1, 2**32, 2**32 + 1, 2**40 + 3, 2**62]
)
def test_uniform_integers_replay_the_reference_and_are_uniform(bound: int) -> None:
    words = np.random.PCG64(bound % 997).random_raw(300_000).tolist()
    reference = Reference(words)
    expected = [reference.below(bound) for _ in range(2_000)]
    assert core.uniform_below(np.random.PCG64(bound % 997), bound, 2_000).tolist() == expected
    values = core.uniform_below(aes(key=bound % 1000).bit_generator, bound, 200_000)
    assert values.dtype == np.int64 and values.min() >= 0 and values.max() < bound
    width = -(-bound // 64)  # bins [j w, (j + 1) w); the last one may be shorter
    bins = -(-bound // width)
    counts = np.bincount(values // width, minlength=bins)
    sizes = np.array([min(bound, (j + 1) * width) - j * width for j in range(bins)], dtype=np.float64)
    assert stats.chisquare(counts, sizes / sizes.sum() * values.size).pvalue > 1e-3


def test_the_output_is_a_fixed_function_of_the_word_stream() -> None:
    first = sample_discrete_gaussian(Fraction(9, 4), 5_000, np.random.PCG64(1))
    assert np.array_equal(first, sample_discrete_gaussian(Fraction(9, 4), 5_000, np.random.PCG64(1)))
    assert not np.array_equal(first, sample_discrete_gaussian(Fraction(9, 4), 5_000, np.random.PCG64(2)))
    # Pinned digests of 5,000 draws from PCG64(3) (its words are the same on every platform): a float
    # anywhere in the path (or a platform-dependent step) would move them.
    digests = {
        str(sigma2): hashlib.sha256(
            sample_discrete_gaussian(sigma2, 5_000, np.random.PCG64(3)).astype("<i8").tobytes()
        ).hexdigest()[:16]
        for sigma2 in (Fraction(9, 4), Fraction(2**40 + 1, 3), EXTREME)
    }
    assert digests == GOLDEN, digests


# sha256 prefixes of 5,000 draws from PCG64(3); they change only if the algorithm's use of the words does
# (last: issue 25 item 5, the compiled sequential sampler)
GOLDEN = {
    "9/4": "4611737b992e922a",
    "1099511627777/3": "20227d6e26d39d34",
    "1152921504606846975/4096": "908bc377067c744a",
}


class FloatFreeGenerator(np.random.Generator):
    """A Generator whose float samplers refuse to run: the sampler may only read its bit generator."""

    def _refuse(self, *_: object, **__: object) -> None:
        raise AssertionError("the discrete Gaussian sampler must not call a float sampler")

    random = normal = standard_normal = uniform = exponential = standard_exponential = integers = _refuse  # type: ignore[assignment]


def test_a_generator_whose_float_methods_raise_gives_the_raw_bit_streams_samples() -> None:
    """The sampler reads only the bit generator's words (the source test below is the check that no float
    operation is in its code)."""
    for sigma2 in (Fraction(1), Fraction(9, 4), Fraction(2**40 + 1, 3), EXTREME):
        through_generator = sample_discrete_gaussian(sigma2, 20_000, FloatFreeGenerator(AESCounter(key=11)))
        through_bits = sample_discrete_gaussian(sigma2, 20_000, aes(key=11).bit_generator)
        assert np.array_equal(through_generator, through_bits)
        assert through_generator.dtype == np.int64


def pyx_code() -> str:
    """The .pyx source without its comments and string literals (docstrings, messages)."""
    kept = []
    for token in tokenize.generate_tokens(io.StringIO(PYX.read_text()).readline):
        if token.type not in (tokenize.COMMENT, tokenize.STRING):  # on Python 3.11 an f-string is one STRING
            kept.append(token.string)
    return " ".join(kept)


def test_the_compiled_sampling_code_has_no_float() -> None:
    """No float or double type, float literal, true division or float function in the .pyx: the sampler's
    arithmetic is int64/uint64 (`//` appears only on Python integers, `%` on unsigned ones)."""
    code = pyx_code()
    assert "discrete_gaussian" in code and "next_uint64" in code  # the tokenizer kept the code
    for pattern in (
        r"\b(float|double|long double|float32|float64|complex)\b",
        r"\b(exp|log|sqrt|pow|ldexp|frexp|next_double|next_uint32)\b",
        r"\b(normal|standard_normal|random_standard_normal|gauss|scipy)\b",  # float normal samplers
        r"libc\.math",
        r"(?<![\w.])(\d+\.\d*|\.\d+|\d+[eE][-+]?\d+)(?![\w])",  # float literals
        r"(?<!/)/(?![/])",  # true division
    ):
        assert not re.search(pattern, code), (pattern, re.findall(pattern, code)[:5])


# np.random.Generator is named (to unwrap its bit generator); its float methods are refused above
FLOAT_NAMES = {"float", "float32", "float64", "exp", "log", "sqrt", "normal", "standard_normal", "uniform"}


def test_the_python_entry_point_has_no_float_operation() -> None:
    """No true division, float literal or float function in sample_discrete_gaussian (the error messages of
    _check format sigma2 for people, outside the sampling path)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(dg.sample_discrete_gaussian)))
    for node in ast.walk(tree):
        assert not (isinstance(node, ast.BinOp | ast.AugAssign) and isinstance(node.op, ast.Div))
        assert not (isinstance(node, ast.Constant) and isinstance(node.value, float))
        name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
        assert name not in FLOAT_NAMES, name


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


def test_non_rational_sigma2_bad_sizes_and_bad_sources_are_refused() -> None:
    with pytest.raises(ValueError, match="Fraction"):
        sample_discrete_gaussian(2.25, 10, aes(key=1))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="size"):
        sample_discrete_gaussian(Fraction(4), -1, aes(key=1))
    with pytest.raises(TypeError):
        sample_discrete_gaussian(Fraction(4), 2.0, aes(key=1))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="BitGenerator"):
        sample_discrete_gaussian(Fraction(4), 3, np.random.RandomState(1))  # type: ignore[arg-type]
    assert sample_discrete_gaussian(Fraction(4), 0, aes(key=1)).shape == (0,)
    assert sample_discrete_gaussian(4, 3, aes(key=1)).dtype == np.int64  # type: ignore[arg-type]


def test_the_compiled_entry_point_refuses_parameters_outside_its_bounds() -> None:
    """The core re-checks what the overflow argument assumes, whoever calls it."""
    bits = np.random.PCG64(0)
    for p, q, v_cap, size in [
        (2**60 + 1, 1, V_CAP, 1),  # sigma2 > 2^60
        (2**12 + 1, 2**12 + 1, V_CAP, 1),  # q > 2^12
        (1, 2, V_CAP, 1),  # sigma2 < 1
        (4, 1, V_CAP + 1, 1),
        (4, 1, 0, 1),
        (4, 1, V_CAP, -1),
    ]:
        with pytest.raises(ValueError, match="out of range"):
            core.sample(bits, p, q, size, v_cap)
    for bound in (0, 2**62 + 1):
        with pytest.raises(ValueError, match="bound"):
            core.uniform_below(bits, bound, 1)


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
    """Recompute, in Python integers, the bound of every intermediate named in the module docstring for the
    extreme parameters allowed (int64 unless said), and run the sampler there (the replay test above checks
    its outputs against the unbounded reference at the same parameters)."""
    int64, uint64 = 2**63 - 1, 2**64 - 1
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
        t, d, n_c = core.parameters(p, q)
        assert t == isqrt(p // q) + 1 and d == q * t * t and n_c == -(-d // (2 * p))
        assert t <= 2**24 + 1 and t * q < 2**37 and d < 2**61 and p < d and n_c <= 2
        uniform_bounds = [t, d, 2 * p * n_c, V_CAP, 2]  # V_CAP bounds I + 1; K stays below 2^40
        assert max(uniform_bounds) <= 2**62
        assert (t - 1) * (t * q) < d  # U (t q)
        largest_w = max(-((t - 1) * t * q - p), p, d)  # w = U t q - p in [-p, D), F < D
        largest_x = (t - 1) + t * (V_CAP - 1)  # U < t, V < V_CAP
        largest_stages = V_CAP**2 * n_c  # (I + 1)^2 n_c with I + 1 <= V_CAP
        assert largest_w < 2**61 and largest_x < 2**55 and largest_stages <= 2**61
        assert max(largest_w, 2 * largest_x, largest_stages, 2**40) <= int64
        # uint64: a 32-bit piece times a bound <= 2^32, the four 32 x 32-bit products, the middle sum and
        # 2^64 - b (the remainder's wrap-around)
        assert max((2**32 - 1) * 2**32, (2**32 - 1) ** 2, 3 * (2**32 - 1), 2**64 - 2) <= uint64
        sample_discrete_gaussian(sigma2, 1_000, aes(key=5))


def test_capping_the_geometric_part_truncates_the_support(monkeypatch: pytest.MonkeyPatch) -> None:
    """With V capped at 1 the proposal never leaves [-t, t]: the cap rejects, it does not clamp."""
    monkeypatch.setattr(dg, "V_CAP", 1)
    samples = sample_discrete_gaussian(Fraction(100), 50_000, aes(key=3))
    assert np.abs(samples).max() < 11  # t = 11
    assert np.abs(samples).max() >= 9
