# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False, cdivision=True
"""The compiled core of privacy_wall.noise.discrete_gaussian: CKS 2020 Algorithm 3, one draw after another, in
int64 and uint64 arithmetic over the 64-bit words of a numpy bit generator (its C interface, bitgen_t).

privacy_wall/noise/discrete_gaussian.py states the algorithm, the order in which words are used and the bound of
every intermediate; `sample` re-checks the parameters those bounds assume, so it cannot be called outside
them. No floating-point type, literal or operation appears here (tests/test_discrete_gaussian.py checks it):
integers only, and integer division only through the unsigned `%` (C semantics, cdivision).
"""

from cpython.pycapsule cimport PyCapsule_GetPointer, PyCapsule_IsValid
from libc.stdint cimport int64_t, uint64_t
from numpy.random cimport bitgen_t

import math

import numpy as np

cdef uint64_t TWO_32 = 4294967296  # 2^32
cdef uint64_t LOW_32 = 4294967295  # 2^32 - 1
cdef int64_t ROUND_CAP = 1099511627776  # 2^40: passes of any loop; unreachable, checked rather than assumed

P_MAX = 2**60  # sigma2 <= 2^48 with denominator <= 2^12
SIGMA2_MAX = 2**48
Q_MAX = 2**12
V_CAP_MAX = 2**30


cdef struct Uniform:
    # a bound fixed for the call, with its piece size and rejection threshold precomputed (see `draw_below`)
    uint64_t bound
    uint64_t rest  # 2^size mod bound
    int size  # 16, 32 or 64 bits per try


cdef struct State:
    bitgen_t *rng
    uint64_t pool  # the unused high bits of the last word cut into pieces
    int pool_bits  # how many (0 to 64)
    int64_t p  # sigma2 = p / q
    int64_t tq  # t q
    int64_t t
    int64_t d  # D = q t^2
    int64_t v_cap
    int64_t n_c  # ceil(D / (2 p))
    int need_c  # 2 p n_c > D: Bernoulli(c / n_c) is not certain
    Uniform below_t
    Uniform below_d
    Uniform below_c  # bound 2 p n_c
    int failed  # a round cap was reached (never, in practice)


cdef inline int piece_size(uint64_t bound) noexcept nogil:
    if bound <= 256:
        return 16
    if bound <= TWO_32:
        return 32
    return 64


cdef inline uint64_t remainder(uint64_t bound, int size) noexcept nogil:
    """2^size mod bound, for size 16, 32 or 64 (then as (2^64 - bound) mod bound in wrapping uint64)."""
    if size < 64:
        return ((<uint64_t>1 << size) - bound) % bound
    return (0 - bound) % bound


cdef Uniform uniform(uint64_t bound) noexcept nogil:
    cdef Uniform u
    u.bound = bound
    u.size = piece_size(bound)
    u.rest = remainder(bound, u.size)
    return u


cdef inline uint64_t piece(State *s, int size) noexcept nogil:
    """The next `size` (16 or 32) bits: the low bits of the pool, refilled with a whole new word when it
    holds fewer than `size` (its remaining bits are dropped)."""
    cdef uint64_t x
    if s.pool_bits < size:
        s.pool = s.rng.next_uint64(s.rng.state)
        s.pool_bits = 64
    x = s.pool & ((<uint64_t>1 << size) - 1)
    s.pool >>= size
    s.pool_bits -= size
    return x


cdef inline uint64_t multiply(uint64_t x, uint64_t y, uint64_t *low) noexcept nogil:
    """The 128-bit product x y as its high word (returned) and low word (*low), from four 32 x 32-bit
    products (each < 2^64); middle < 3 2^32 collects the carries into bit 64."""
    cdef uint64_t x0 = x & LOW_32, x1 = x >> 32, y0 = y & LOW_32, y1 = y >> 32
    cdef uint64_t p00 = x0 * y0, p01 = x0 * y1, p10 = x1 * y0
    cdef uint64_t middle = (p00 >> 32) + (p01 & LOW_32) + (p10 & LOW_32)
    low[0] = (middle << 32) | (p00 & LOW_32)
    return x1 * y1 + (p01 >> 32) + (p10 >> 32) + (middle >> 32)


cdef uint64_t draw_below(State *s, uint64_t bound, uint64_t rest, int size) noexcept nogil:
    """A uniform integer in [0, bound), 2 <= bound <= 2^62, by Lemire's multiply-shift with exact rejection
    ("Fast random integer generation in an interval", 2019): no modulo bias, no division per try.

    An S-bit x (S = size: a 16-bit piece for bound <= 2^8, a 32-bit piece for bound <= 2^32, both cut from
    words by `piece`, else a whole new word, the pool untouched) and m = x bound (below 2^64 for S <= 32,
    as bound <= 2^32; the 128-bit product from `multiply` for S = 64): the value is floor(m / 2^S), rejected
    while m mod 2^S is below rest = 2^S mod bound, which leaves exactly floor(2^S / bound) of the x to each
    value. A try is rejected with probability rest / 2^S < 1/2 (rest < bound, and rest = 2^S - bound < 2^S / 2
    when bound > 2^S / 2). On
    reaching the round cap, s.failed is set and bound - 1 returned, which fails every Bernoulli of the
    caller (ending its loops).
    """
    cdef uint64_t m, high, low
    cdef uint64_t mask = (<uint64_t>1 << size) - 1 if size < 64 else 0
    cdef int64_t tries
    for tries in range(ROUND_CAP):
        if size < 64:
            m = piece(s, size) * bound  # < 2^(32 + 32)
            if (m & mask) >= rest:
                return m >> size
        else:
            high = multiply(s.rng.next_uint64(s.rng.state), bound, &low)
            if low >= rest:
                return high
    s.failed = 1
    return bound - 1


cdef inline uint64_t below(State *s, uint64_t bound) noexcept nogil:
    """`draw_below` for a bound that varies (K, I + 1, 2); bound 1 gives 0 and uses no bits. The threshold
    (a division) is computed only when a first small try's low part is below the bound (Lemire's shortcut:
    rest < bound, so a larger low part is kept either way)."""
    cdef uint64_t m, mask, rest
    cdef int size
    if bound == 1:
        return 0
    size = piece_size(bound)
    if size < 64:
        mask = (<uint64_t>1 << size) - 1
        m = piece(s, size) * bound
        if (m & mask) >= bound:
            return m >> size
        rest = remainder(bound, size)
        if (m & mask) >= rest:
            return m >> size
        return draw_below(s, bound, rest, size)
    return draw_below(s, bound, remainder(bound, 64), 64)


cdef inline uint64_t below_fixed(State *s, Uniform *u) noexcept nogil:
    """`draw_below` for a bound fixed for the call, its first try inlined."""
    cdef uint64_t m, high, low
    if u.bound == 1:
        return 0
    if u.size < 64:
        m = piece(s, u.size) * u.bound
        if (m & ((<uint64_t>1 << u.size) - 1)) >= u.rest:
            return m >> u.size
    else:
        high = multiply(s.rng.next_uint64(s.rng.state), u.bound, &low)
        if low >= u.rest:
            return high
    return draw_below(s, u.bound, u.rest, u.size)


cdef inline int bernoulli_exp_u(State *s, int64_t u) noexcept nogil:
    """Bernoulli(exp(-u / t)), CKS Algorithm 1: K = 1; while Bernoulli(1 / K) and Bernoulli(u / t): K += 1;
    return K odd. Bernoulli(1 / K) is a uniform below K being 0 (no word for K = 1), Bernoulli(u / t) a
    uniform below t being below u; the second is drawn only if the first succeeded."""
    cdef int64_t k
    for k in range(1, ROUND_CAP):
        if below(s, <uint64_t>k) != 0 or <int64_t>below_fixed(s, &s.below_t) >= u:
            return <int>(k & 1)
    s.failed = 1
    return 0


cdef inline int bernoulli_exp_one(State *s) noexcept nogil:
    """Bernoulli(exp(-1)), CKS Algorithm 1 with x = 1: K = 1; while Bernoulli(1 / K): K += 1; K odd."""
    cdef int64_t k
    for k in range(1, ROUND_CAP):
        if below(s, <uint64_t>k) != 0:
            return <int>(k & 1)
    s.failed = 1
    return 0


cdef inline int bernoulli_a(State *s, int64_t i, int64_t f) noexcept nogil:
    """Bernoulli(a / (I + 1)) for a = I + F / D: J uniform below I + 1; J < I, or else (J = I) Bernoulli(F / D)
    as a uniform below D being below F."""
    if <int64_t>below(s, <uint64_t>(i + 1)) < i:
        return 1
    return <int64_t>below_fixed(s, &s.below_d) < f


cdef inline int bernoulli_exp_stage(State *s, int64_t i, int64_t f) noexcept nogil:
    """One of the Gaussian test's l factors, Bernoulli(exp(-x)) with x = (a / (I + 1))^2 (c / n_c), by CKS
    Algorithm 1: K = 1; while Bernoulli(x / K): K += 1; return K odd. Bernoulli(x / K) is the AND, drawn in
    this order and stopping at the first failure, of Bernoulli(1 / K), Bernoulli(c / n_c) (a uniform below
    2 p n_c being below D; skipped when 2 p n_c = D, where it is certain) and Bernoulli(a / (I + 1)) twice."""
    cdef int64_t k
    for k in range(1, ROUND_CAP):
        if below(s, <uint64_t>k) != 0:
            return <int>(k & 1)
        if s.need_c and <int64_t>below_fixed(s, &s.below_c) >= s.d:
            return <int>(k & 1)
        if not bernoulli_a(s, i, f) or not bernoulli_a(s, i, f):
            return <int>(k & 1)
    s.failed = 1
    return 0


cdef int64_t discrete_gaussian(State *s) noexcept nogil:
    """One draw of N_Z(0, p / q): CKS Algorithm 3 with Algorithm 2 as its proposal (the module docstring of
    privacy_wall.noise.discrete_gaussian gives the steps and the bounds)."""
    cdef int64_t attempt, u, v, sign, x, w, i, f, stages
    for attempt in range(ROUND_CAP):
        if s.failed:
            return 0
        # Algorithm 2: U uniform below t, kept with probability exp(-U / t)
        u = <int64_t>below_fixed(s, &s.below_t)
        if not bernoulli_exp_u(s, u):
            continue
        # V: Bernoulli(exp(-1)) successes before the first failure; reaching V_CAP rejects the attempt
        v = 0
        while v < s.v_cap and bernoulli_exp_one(s):
            v += 1
        if v >= s.v_cap:
            continue
        # the sign, rejecting -0
        sign = <int64_t>below(s, 2)
        if sign == 1 and u == 0 and v == 0:
            continue
        x = u + s.t * v
        # Algorithm 3's test exp(-(x - s/t)^2 / (2 s)) = exp(-a^2 c), a = |V + w / D| = I + F / D
        w = u * s.tq - s.p
        if w >= 0:
            i = v
            f = w
        elif v > 0:
            i = v - 1
            f = s.d + w
        else:
            i = 0
            f = -w
        stages = (i + 1) * (i + 1) * s.n_c
        while stages > 0 and bernoulli_exp_stage(s, i, f):
            stages -= 1
        if stages == 0:
            return -x if sign else x
    s.failed = 1
    return 0


def parameters(p: int, q: int) -> tuple[int, int, int]:
    """(t, D, n_c) for sigma2 = p / q: t = floor(sqrt(p / q)) + 1, D = q t^2, n_c = ceil(D / (2 p))."""
    t = math.isqrt(p // q) + 1  # floor(sqrt(p / q)) = floor(sqrt(floor(p / q)))
    d = q * t * t
    return t, d, -(-d // (2 * p))


def sample(object bit_generator, p: int, q: int, size: int, v_cap: int) -> np.ndarray:
    """`size` draws of N_Z(0, p / q) from bit_generator's 64-bit words (next_uint64), as an int64 array.

    Refuses (ValueError) anything outside the bounds the overflow argument assumes: 1 <= q <= 2^12,
    q <= p <= 2^48 q (so sigma^2 = p / q <= 2^48 and p <= 2^60), 1 <= v_cap <= 2^30, size >= 0. Holds the
    bit generator's lock and runs without the GIL.
    """
    cdef State s
    cdef int64_t[::1] view
    cdef Py_ssize_t j, n
    if not (
        1 <= q <= Q_MAX and q <= p <= P_MAX and p <= SIGMA2_MAX * q and 1 <= v_cap <= V_CAP_MAX and size >= 0
    ):
        raise ValueError(f"discrete Gaussian parameters out of range: p={p}, q={q}, v_cap={v_cap}, size={size}")
    t, d, n_c = parameters(p, q)
    if not (t <= 2**24 + 1 and d < 2**61 and n_c <= 2 and t * t * q > p):  # the module docstring's bounds
        raise ValueError(f"discrete Gaussian parameters out of range: p={p}, q={q}")
    capsule = bit_generator.capsule
    if not PyCapsule_IsValid(capsule, "BitGenerator"):
        raise ValueError("bits must be a numpy BitGenerator (or a Generator over one)")
    s.rng = <bitgen_t *>PyCapsule_GetPointer(capsule, "BitGenerator")
    s.p = p
    s.tq = t * q
    s.t = t
    s.d = d
    s.v_cap = v_cap
    s.n_c = n_c
    s.need_c = 2 * p * n_c > d
    s.below_t = uniform(<uint64_t>t)
    s.below_d = uniform(<uint64_t>d)
    s.below_c = uniform(<uint64_t>(2 * p * n_c))
    s.failed = 0
    s.pool = 0
    s.pool_bits = 0
    out = np.empty(size, dtype=np.int64)
    view = out
    n = size
    with bit_generator.lock, nogil:
        for j in range(n):
            view[j] = discrete_gaussian(&s)
            if s.failed:
                break
    if s.failed:
        raise AssertionError("unreachable: the discrete Gaussian sampler exceeded a round cap")
    return out


def uniform_below(object bit_generator, bound: int, size: int) -> np.ndarray:
    """`size` uniform integers in [0, bound), 1 <= bound <= 2^62, by the sampler's own rule (for tests)."""
    cdef State s
    cdef int64_t[::1] view
    cdef Py_ssize_t j, n
    cdef uint64_t b
    if not (1 <= bound <= 2**62 and size >= 0):
        raise ValueError(f"bound must be in [1, 2^62] and size >= 0, got {bound}, {size}")
    capsule = bit_generator.capsule
    if not PyCapsule_IsValid(capsule, "BitGenerator"):
        raise ValueError("bits must be a numpy BitGenerator")
    s.rng = <bitgen_t *>PyCapsule_GetPointer(capsule, "BitGenerator")
    s.failed = 0
    s.pool = 0
    s.pool_bits = 0
    b = bound
    out = np.empty(size, dtype=np.int64)
    view = out
    n = size
    with bit_generator.lock, nogil:
        for j in range(n):
            view[j] = <int64_t>below(&s, b)
    if s.failed:
        raise AssertionError("unreachable: uniform rejection exceeded its round cap")
    return out
