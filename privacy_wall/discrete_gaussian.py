"""Exact discrete Gaussian noise in integer arithmetic.

The discrete Gaussian N_Z(0, s) on the integers has Pr[X = x] = exp(-x^2 / (2 s)) / sum_y exp(-y^2 / (2 s)).
`sample_discrete_gaussian` draws it by Canonne, Kamath and Steinke, "The Discrete Gaussian for Differential
Privacy" (NeurIPS 2020), Algorithm 3: propose Y from the discrete Laplace with scale t = floor(sqrt(s)) + 1
(their Algorithm 2), accept with probability exp(-(|Y| - s/t)^2 / (2 s)), else start over. Each
Bernoulli(exp(-x)) is their Algorithm 1 (von Neumann): for x in [0, 1], K = 1; while Bernoulli(x / K),
K += 1; return K odd. For x > 1 they take l >= x independent Bernoulli(exp(-x / l)) and return their AND.

Everything is exact: s = p/q is a rational, every probability is a ratio of integers, and a Bernoulli(a/b)
is "a uniform integer in [0, b) is below a". The uniform integers come from the raw 64-bit words of a
`BitSource` (in production `private_generator().bit_generator`, AES-128 in counter mode) by integer-only
rejection sampling (`_below`), so no float is formed and the output is a fixed function of the word stream,
the same on every platform.

Vectorisation: a lane is one attempt of Algorithm 3, and the lanes of a round run in lock-step over numpy
int64, each stage (uniform U, its Bernoulli(exp(-U/t)), the geometric part, the sign, the Gaussian test, and
each pass of Algorithm 1's loop) once per round on the lanes still undecided. A round runs about 2.1 lanes
per draw still needed and keeps the first successes in lane order; which lanes succeed is independent of the
values they carry, so the kept draws are i.i.d. N_Z(0, s). Lanes never share draws. Calls of up to
WIDE_BELOW lanes, where numpy's per-call overhead dominates, run wide: the geometric part draws
GEOMETRIC_WIDTH Bernoulli(exp(-1)) per lane at once, and the Gaussian test's l independent factors run as up
to STAGE_CHUNK sub-lanes per lane at once instead of one per round (the same distribution: independent
draws, their AND or their count of leading successes; only the use of the word stream differs).

Overflow argument (the limits SIGMA2_MAX = 2^48 and DENOMINATOR_MAX = 2^12 are checked on entry; the test
test_no_intermediate_overflows_int64_at_the_extremes recomputes these bounds in Python integers for the
extreme parameters). With s = p/q in lowest terms, 1 <= s <= 2^48 and q <= 2^12:
  p = s q <= 2^60;  t = isqrt(p // q) + 1 <= 2^24 + 1;  t q < 2^37;  D = q t^2 <= 2^12 (2^24 + 1)^2 < 2^61;
  the uniform bounds are t, D, 2 p n_c <= 2^62 (n_c <= 2), K and I + 1 (both capped, below);
  `_below` works in uint64: x b < 2^32 2^24 for Lemire's product, x mod b and 2^64 - 1 - (2^64 mod b)
  for the rest, and returns values below b <= 2^62, which fit int64;
  V is capped at V_CAP = 2^30, so |Y| = U + t V < (2^24 + 1)(2^30 + 1) < 2^55 and 2|Y| fits;
  w = U t q - p lies in [-p, D), so |w| < 2^61 and 0 < D + w < D;  I <= V, so I + 1 <= 2^30 + 1 and the
  stage count (I + 1)^2 n_c <= 2 (2^30 + 1)^2 < 2^62;  K, the counter of Algorithm 1, is at most the
  number of passes of its loop, capped at _ROUND_CAP = 2^40 (as is every other loop).
Capping V rejects (does not clamp) a proposal with V >= 2^30, so the output is exactly N_Z(0, s) conditioned
on |X| < 2^30 t, whose excluded mass is below exp(-2^59); reaching either cap takes 2^30 passes of a loop.
"""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction
from math import ceil, isqrt
from typing import Protocol

import numpy as np
from numpy.typing import NDArray

SIGMA2_MAX = 2**48  # sigma <= 2^24 grid steps
DENOMINATOR_MAX = 2**12
V_CAP = 2**30
_ROUND_CAP = 2**40  # rounds of any loop; unreachable (years of compute), asserted rather than assumed
GEOMETRIC_WIDTH = 4  # Bernoulli(exp(-1)) draws per row and round of the geometric part
STAGE_CHUNK = 256  # stages of the Gaussian test evaluated at once per proposal
#: Up to this many rows, loops run wide (GEOMETRIC_WIDTH, STAGE_CHUNK): fewer numpy rounds, more draws,
#: which pays where per-call overhead dominates; above it, one Bernoulli per row and round (fewest draws).
WIDE_BELOW = 2**13

Ints = NDArray[np.int64]
Bools = NDArray[np.bool_]
U64 = NDArray[np.uint64]


class BitSource(Protocol):
    """Anything that hands out independent uniform 64-bit words, as numpy bit generators do."""

    def random_raw(self, size: int) -> NDArray[np.uint64]: ...


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


def _below(bits: BitSource, bound: int | Ints, n: int) -> Ints:
    """n independent uniform integers in [0, bound), for a scalar bound or one per lane, all in [1, 2^62].

    Bounds up to 2^24 use Lemire's multiply-shift ("Fast random integer generation in an interval", 2019)
    on S-bit pieces x of the words (S = 16, or 32 above 2^8): the value is floor(x b / 2^S), rejected when the
    low S bits of x b are below 2^S mod b, which leaves exactly floor(2^S / b) values of x per result; x b
    < 2^(2S) fits the doubled width. Larger bounds take x mod b of a 64-bit word x, rejected when
    x >= 2^64 - (2^64 mod b). A lane is rejected with probability below b / 2^S and draws again.
    """
    out = np.zeros(n, dtype=np.int64)
    top = bound if isinstance(bound, int) else int(bound.max(initial=1))
    if top == 1 or n == 0:
        return out
    size, narrow = (
        (16, np.dtype("<u2"))
        if top <= 2**8
        else (32, np.dtype("<u4"))
        if top <= 2**24
        else (64, np.dtype("<u8"))
    )
    limit: U64 = np.asarray(bound, dtype=np.uint64)
    if size < 64:
        floor_rest: U64 = np.uint64(1 << size) % limit  # 2^S mod b
    else:
        largest = np.uint64(2**64 - 1)
        accept_max: U64 = largest - (largest % limit + np.uint64(1)) % limit  # 2^64 - 1 - (2^64 mod b)
    todo: Ints | None = None
    for _ in range(_ROUND_CAP):
        m = n if todo is None else todo.size
        if m == 0:
            return out
        b = limit if limit.ndim == 0 or todo is None else limit[todo]
        x: U64 = (
            bits.random_raw(-(-m * size // 64))
            .astype("<u8", copy=False)
            .view(narrow)[:m]
            .astype(np.uint64, copy=False)
        )
        if size < 64:
            product = x * b
            value = (product >> np.uint64(size)).astype(np.int64)
            rest = floor_rest if floor_rest.ndim == 0 or todo is None else floor_rest[todo]
            bad = (product & np.uint64((1 << size) - 1)) < rest
        else:
            value = (x % b).view(np.int64)  # below b <= 2^62
            bad = x > (accept_max if accept_max.ndim == 0 or todo is None else accept_max[todo])
        if todo is None:
            out[:] = value
            todo = bad.nonzero()[0]
        else:
            out[todo] = value
            todo = todo[bad]
    raise AssertionError("unreachable: uniform rejection exceeded its round cap")


Factor = Callable[[Ints | None], Bools]  # Bernoulli draws for the given rows (None: every row)


def _bernoulli_exp(bits: BitSource, n: int, factors: list[Factor]) -> Bools:
    """CKS Algorithm 1 for n rows: Bernoulli(exp(-x)) with x (in [0, 1]) the product of the factors'
    probabilities. K = 1; while Bernoulli(x / K): K += 1; return K odd. Bernoulli(x / K) is Bernoulli(1 / K)
    (a uniform below K is 0) and'ed with the factors, each drawn only on rows all earlier ones accepted.
    """
    result = np.zeros(n, dtype=np.bool_)
    running: Ints | None = None
    for k in range(1, _ROUND_CAP):
        rows = running
        if rows is not None:
            rows = rows[_below(bits, k, rows.size) == 0]
        for factor in factors:
            if rows is not None and rows.size == 0:
                break
            more = factor(rows)
            rows = more.nonzero()[0] if rows is None else rows[more]
        if rows is None:
            rows = np.arange(n, dtype=np.int64)
        if k % 2 == 1:  # rows that stopped now have K = k odd
            result[slice(None) if running is None else running] = True
            result[rows] = False
        running = rows
        if running.size == 0:
            return result
    raise AssertionError("unreachable: Bernoulli(exp(-x)) exceeded its round cap")


def _geometric(bits: BitSource, n: int) -> Ints:
    """V with Pr[V >= v] = exp(-v) (the geometric part of CKS Algorithm 2), or -1 where V reaches V_CAP.

    V counts the Bernoulli(exp(-1)) successes before the first failure. They are drawn GEOMETRIC_WIDTH at a
    time per undecided row (one _bernoulli_exp call over rows x width), and V grows by the number of leading
    successes; a row whose whole width succeeded draws again (probability exp(-width)). Each draw is used
    in order and stops at the first failure, so V is exactly the sequential count.
    """
    v = np.zeros(n, dtype=np.int64)
    rows = np.arange(n, dtype=np.int64)
    width = GEOMETRIC_WIDTH if n <= WIDE_BELOW else 1
    while rows.size:
        hits = _bernoulli_exp(bits, rows.size * width, []).reshape(rows.size, width)
        all_hit = hits.all(axis=1)
        lead = np.where(all_hit, width, np.argmin(hits, axis=1))  # leading successes
        v[rows] += lead
        capped = v[rows] >= V_CAP
        v[rows[capped]] = -1
        rows = rows[all_hit & ~capped]
    return v


def sample_discrete_gaussian(sigma2: Fraction, size: int, bits: BitSource | np.random.Generator) -> Ints:
    """`size` independent draws from N_Z(0, sigma2), exactly (CKS 2020, Algorithm 3 with Algorithms 1-2).

    sigma2 is a Fraction p/q in [1, 2^48] with q <= 2^12 (`rational_sigma2` rounds a float sigma up to one);
    anything else is refused with ValueError. bits supplies uniform 64-bit words (pass the bit generator of
    `private_generator()`, or that generator); nothing else is random and nothing is a float.

    Each lane runs Algorithm 3 once (a rejection inside Algorithm 2 ends the lane's attempt, which is the
    same as restarting Algorithm 2, since nothing was accepted yet); a round runs about 2.1 lanes per
    draw still needed and keeps the first successes in lane order. A lane's attempt:
      1. U uniform in [0, t); reject unless Bernoulli(exp(-U/t))           (Alg. 2, the uniform part)
      2. V with Pr[V >= v] = exp(-v), counting Bernoulli(exp(-1)) successes; X = U + t V   (Alg. 2)
      3. a fair sign bit B; reject B = 1 with X = 0; Y = (1 - 2B) X              (Alg. 2, the sign)
      4. accept with probability exp(-(X - s/t)^2 / (2 s)), else reject     (Alg. 3, the Gaussian test)
    Step 4 writes the exponent as a^2 c with a = |X - s/t| / t = |V + w / D| (w = U t q - p, D = q t^2)
    and c = t^2 / (2 s) = D / (2 p) in (1/2, 2]. With |a| = I + F/D (integer I, 0 <= F < D) and
    n_c = ceil(c), it is the AND of l = (I + 1)^2 n_c independent Bernoulli(exp(-x)) with
    x = (a / (I + 1))^2 (c / n_c) <= 1 (CKS's rule for an exponent above 1: any integer l >= it), each by
    Algorithm 1, where Bernoulli(x / K) is the AND of Bernoulli(1/K), Bernoulli(a / (I + 1)) twice and
    Bernoulli(c / n_c), and Bernoulli(a / (I + 1)) is "J < I, or else Bernoulli(F/D)", J uniform below I + 1.
    """
    if isinstance(sigma2, bool) or not isinstance(sigma2, Fraction | int):
        raise ValueError(f"sigma2 must be a Fraction (use rational_sigma2), got {type(sigma2).__name__}")
    sigma2 = Fraction(sigma2)
    _check(sigma2)
    if size < 0:
        raise ValueError("size must be >= 0")
    source: BitSource = bits.bit_generator if isinstance(bits, np.random.Generator) else bits
    p, q = sigma2.numerator, sigma2.denominator
    t = isqrt(p // q) + 1  # floor(sqrt(p/q)) = floor(sqrt(floor(p/q)))
    d = q * t * t
    n_c = -(-d // (2 * p))
    bound_c = 2 * p * n_c  # Bernoulli(c / n_c) = Bernoulli(D / (2 p n_c))
    assert max(t, d, bound_c) <= 2**62 and p <= 2**60  # the module docstring's bounds

    def pick(column: Ints, rows: Ints | None) -> Ints:
        return column if rows is None else column[rows]

    def bernoulli_a(whole: Ints, frac: Ints) -> Factor:  # Bernoulli((I + F/D) / (I + 1))
        def draw(rows: Ints | None) -> Bools:
            i, f = pick(whole, rows), pick(frac, rows)
            big = (i > 0).nonzero()[0]
            if big.size == 0:
                return _below(source, d, f.size) < f
            hit = np.zeros(i.size, dtype=np.bool_)
            hit[big] = _below(source, i[big] + 1, big.size) < i[big]
            rest = (~hit).nonzero()[0]
            hit[rest] = _below(source, d, rest.size) < f[rest]
            return hit

        return draw

    def bernoulli_c(n: int) -> Factor:  # Bernoulli(c / n_c)
        def draw(rows: Ints | None) -> Bools:
            return _below(source, bound_c, n if rows is None else rows.size) < d

        return draw

    def bernoulli_u(u: Ints) -> Factor:  # Bernoulli(U / t)
        def draw(rows: Ints | None) -> Bools:
            numerator = pick(u, rows)
            return _below(source, t, numerator.size) < numerator

        return draw

    parts: list[Ints] = []
    need = size
    for _ in range(_ROUND_CAP):
        if need == 0:
            return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
        # Each lane is an independent run of Algorithm 3 that succeeds about half the time; its outcome is
        # kept in lane order, so taking the first `need` successes keeps the draws i.i.d.
        lanes = need * 17 // 8 + 32
        accepted = np.zeros(lanes, dtype=np.bool_)
        values = np.zeros(lanes, dtype=np.int64)
        u = _below(source, t, lanes)
        kept = _bernoulli_exp(source, lanes, [bernoulli_u(u)])
        lane, u = kept.nonzero()[0], u[kept]
        v = _geometric(source, u.size)
        sign = _below(source, 2, u.size)
        x = u + t * np.maximum(v, 0)
        proposed = (v >= 0) & ((sign == 0) | (x != 0))
        lane, u, v, sign, x = lane[proposed], u[proposed], v[proposed], sign[proposed], x[proposed]

        w = u * (t * q) - p
        negative = w < 0
        whole = np.where(negative & (v > 0), v - 1, v)
        frac = np.where(negative, np.where(v > 0, d + w, -w), w)
        y = (1 - 2 * sign) * x
        stages = (whole + 1) ** 2 * n_c
        while lane.size:
            # Up to STAGE_CHUNK of each proposal's l = stages independent Bernoulli(exp(-x)) run at once,
            # one sub-lane each (their AND depends neither on the order nor on stopping at the first
            # failure): one call of Algorithm 1 instead of l sequential ones; memory stays bounded by
            # STAGE_CHUNK sub-lanes per proposal, and the rare proposal with more stages loops.
            chunk = np.minimum(stages, STAGE_CHUNK if lane.size <= WIDE_BELOW else 1)
            owner = np.repeat(np.arange(lane.size, dtype=np.int64), chunk)
            factors = [bernoulli_a(whole[owner], frac[owner])] * 2
            if bound_c > d:  # else c / n_c = 1 and the draw is certain
                factors.insert(0, bernoulli_c(owner.size))  # first: cheap, and fails about half the time
            passed = _bernoulli_exp(source, owner.size, factors)
            survived = np.bincount(owner[~passed], minlength=lane.size) == 0
            stages = stages - chunk
            done = survived & (stages == 0)
            values[lane[done]] = y[done]
            accepted[lane[done]] = True
            again = survived & (stages > 0)
            lane, y, whole, frac, stages = lane[again], y[again], whole[again], frac[again], stages[again]
        parts.append(values[accepted][:need])
        need -= parts[-1].size
    raise AssertionError("unreachable: discrete Gaussian exceeded its round cap")
