"""Exact discrete Gaussian noise in integer arithmetic.

The discrete Gaussian N_Z(0, s) on the integers has Pr[X = x] = exp(-x^2 / (2 s)) / sum_y exp(-y^2 / (2 s)).
`sample_discrete_gaussian` draws it by Canonne, Kamath and Steinke, "The Discrete Gaussian for Differential
Privacy" (NeurIPS 2020), Algorithm 3, one draw after another in compiled code (privacy_wall/
_discrete_gaussian.pyx, Cython, built at install time); this module checks the parameters and calls it.

The algorithm, per draw (an attempt that rejects starts the draw over; nothing of it is kept):
  1. U uniform in [0, t), t = floor(sqrt(s)) + 1; reject unless Bernoulli(exp(-U/t))       (Alg. 2)
  2. V = the number of Bernoulli(exp(-1)) successes before the first failure, so Pr[V >= v] = exp(-v);
     reject if V reaches V_CAP; X = U + t V                                                (Alg. 2)
  3. a fair sign bit B; reject B = 1 with X = 0; Y = (1 - 2B) X                            (Alg. 2)
  4. accept Y with probability exp(-(X - s/t)^2 / (2 s)), else reject                     (Alg. 3)
Each Bernoulli(exp(-x)), x in [0, 1], is their Algorithm 1 (von Neumann): K = 1; while Bernoulli(x / K):
K += 1; return K odd, with Bernoulli(x / K) the AND, drawn in order and stopping at the first failure, of
Bernoulli(1 / K) and Bernoulli(x)'s factors. Step 1's x = U/t has one factor, Bernoulli(U/t). Step 4 writes
the exponent as a^2 c with a = |X - s/t| / t = |V + w / D| (w = U t q - p, D = q t^2, s = p/q) and
c = t^2 / (2 s) = D / (2 p) in (1/2, 2]; with a = I + F/D (integer I, 0 <= F < D) and n_c = ceil(c), it is
the AND of l = (I + 1)^2 n_c independent Bernoulli(exp(-x)), x = (a / (I + 1))^2 (c / n_c) <= 1 (CKS's rule
for an exponent above 1), each by Algorithm 1 with the factors Bernoulli(c / n_c) (skipped when it is 1),
Bernoulli(a / (I + 1)) and Bernoulli(a / (I + 1)) again; Bernoulli(a / (I + 1)) is "J < I, or else
Bernoulli(F/D)", J uniform below I + 1. (w >= 0: I = V, F = w; w < 0 < V: I = V - 1, F = D + w; w < 0 = V:
I = 0, F = -w.)

Everything is exact: every probability is a ratio of integers, and Bernoulli(a/b) is "a uniform integer below
b is below a". Uniform integers below b come from the bit generator's 64-bit words (its C interface's
next_uint64; in production `private_generator().bit_generator`, AES-128 in counter mode) by Lemire's
multiply-shift with exact rejection ("Fast random integer generation in an interval", 2019): b = 1 takes no
bits; b <= 2^8 a 16-bit piece, b <= 2^32 a 32-bit piece (pieces are cut from the low end of a word, a new word
taken when fewer bits than needed remain; each call starts with none, and the bits left at its end are
dropped, never reused), larger b a whole word x with the 128-bit product x b; the value is floor(x b / 2^S),
rejected while x b mod 2^S is below 2^S mod b. So no float is formed and the output is a fixed function of the
sequence of 64-bit words, the same on every platform: tests/privacy_wall/noise/test_discrete_gaussian.py
replays it in Python integers (which cannot overflow) and checks the compiled sampler against it word for
word.

Overflow argument for the compiled code (the limits SIGMA2_MAX = 2^48 and DENOMINATOR_MAX = 2^12 are
checked here, and p <= 2^60, q <= 2^12, V_CAP <= 2^30 again by the compiled entry point;
test_no_intermediate_overflows_int64_at_the_extremes recomputes these bounds in Python integers for the
extreme parameters). With s = p/q in lowest terms, 1 <= s <= 2^48 and q <= 2^12, all in int64 unless said:
  p = s q <= 2^60;  t = isqrt(p // q) + 1 <= 2^24 + 1 (computed in Python integers);  t q < 2^37;
  D = q t^2 <= 2^12 (2^24 + 1)^2 < 2^61;  p < D (t^2 > s) and D <= q (sqrt(s) + 1)^2, so
  c = D / (2 p) lies in (1/2, 1/2 + 1/sqrt(s) + 1/(2 s)] within (1/2, 2], n_c <= 2 and 2 p n_c <= 2^62;
  U < t, so U (t q) < D < 2^61 and w = U t q - p lies in [-p, D): |w| < 2^61, 0 <= F < D;
  V < V_CAP = 2^30, so X = U + t V < t 2^30 < 2^55 and -X fits; I <= V, so I + 1 <= 2^30 and the stage
  count (I + 1)^2 n_c <= 2^61 (the stage loop counts it down);  K, the counter of Algorithm 1, and every
  other loop's count stay below the round cap 2^40 (reaching it raises AssertionError; it takes 2^40 passes
  of a loop that ends at each pass with a probability bounded away from 0);
  uniforms (uint64): bounds b are t, D, 2 p n_c, K, I + 1 and 2, all in [1, 2^62]; a piece x < 2^S with
  S <= 32 and b <= 2^32 (S = 16 only for b <= 2^8) gives x b < 2^64; for b > 2^32 the 128-bit x b is
  formed from four 32 x 32-bit products, each < 2^64, and a middle sum < 3 2^32; 2^S mod b is computed as
  (2^S - b) mod b (for S = 64 in wrapping uint64: 2^64 - b); values are below b <= 2^62, so they fit int64.
Capping V rejects (does not clamp) a proposal with V >= 2^30, so the output is exactly N_Z(0, s) conditioned
on |X| < 2^30 t, whose excluded mass is below exp(-2^59).
"""

from __future__ import annotations

from fractions import Fraction
from math import ceil
from operator import index

import numpy as np
from numpy.typing import NDArray

from privacy_wall.noise import _discrete_gaussian

SIGMA2_MAX = 2**48  # sigma <= 2^24 grid steps
DENOMINATOR_MAX = 2**12
V_CAP = 2**30

Ints = NDArray[np.int64]


def rational_sigma2(sigma: float, max_denominator: int = DENOMINATOR_MAX) -> Fraction:
    """The rational ceil(sigma^2 q) / q with q = max_denominator (reduced): the smallest multiple of 1/q at or
    above sigma^2, computed exactly from the float sigma, so sampling with it never adds less noise."""
    if not 1 <= max_denominator <= DENOMINATOR_MAX:
        raise ValueError(f"max_denominator must be in [1, {DENOMINATOR_MAX}], got {max_denominator}")
    if not np.isfinite(sigma) or sigma < 1:
        raise ValueError(f"discrete Gaussian sigma must be finite and at least 1 grid step, got {sigma}")
    exact = Fraction(sigma) ** 2
    rounded = Fraction(ceil(exact * max_denominator), max_denominator)
    _check(rounded)
    return rounded


def _check(sigma2: Fraction) -> None:
    if sigma2 < 1:
        raise ValueError(
            f"discrete Gaussian sigma^2 = {sigma2} is below 1 grid step squared: use a finer grid"
        )
    if sigma2 > SIGMA2_MAX:
        raise ValueError(
            f"discrete Gaussian sigma^2 = {float(sigma2):.6g} exceeds 2^48 grid steps squared "
            "(int64 overflow bound): use a coarser grid"
        )
    if sigma2.denominator > DENOMINATOR_MAX:
        raise ValueError(
            f"discrete Gaussian sigma^2 denominator {sigma2.denominator} exceeds {DENOMINATOR_MAX}: "
            "round it up with rational_sigma2"
        )


def sample_discrete_gaussian(
    sigma2: Fraction, size: int, bits: np.random.BitGenerator | np.random.Generator
) -> Ints:
    """`size` independent draws from N_Z(0, sigma2), exactly (CKS 2020, Algorithm 3; the module docstring).

    sigma2 is a Fraction p/q in [1, 2^48] with q <= 2^12 (`rational_sigma2` rounds a float sigma up to one);
    anything else is refused with ValueError. bits is a numpy bit generator (or a Generator, whose bit
    generator is used) supplying uniform 64-bit words: pass `private_generator()` or its bit generator.
    Nothing else is random and nothing is a float. The call holds the bit generator's lock and releases the
    GIL while it samples.
    """
    if isinstance(sigma2, bool) or not isinstance(sigma2, Fraction | int):
        raise ValueError(f"sigma2 must be a Fraction (use rational_sigma2), got {type(sigma2).__name__}")
    sigma2 = Fraction(sigma2)
    _check(sigma2)
    size = index(size)
    if size < 0:
        raise ValueError("size must be >= 0")
    source = bits.bit_generator if isinstance(bits, np.random.Generator) else bits
    if not isinstance(source, np.random.BitGenerator):
        raise ValueError(f"bits must be a numpy BitGenerator or Generator, got {type(bits).__name__}")
    return _discrete_gaussian.sample(source, sigma2.numerator, sigma2.denominator, size, V_CAP)
