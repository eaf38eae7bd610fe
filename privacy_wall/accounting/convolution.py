"""Convolution powers of probability mass functions by FFT, every kept mass an upper bound of the exact one.

`convolution_power(parts, tail)` returns the masses of the sum I = sum_a (I_a1 + ... + I_a{c_a}) of
independent indices, I_ak ~ p_a, on the window [lower, upper] that holds all but `tail` of I's mass (Chernoff
bounds; the caller counts `tail` at +infinity). The FFT gives each mass with an absolute rounding error of
order C u log L ||p||_2 (C = sum_a c_a; u = 2^-53; L the transform's length): at C = 10^5 that is ~1e-11 per
mass, which swamps a far tail of ~1e-15 per mass and under-counts delta there (negative masses, issue 34).

The fix is exponential tilting (Esscher): with p~_i = p_i e^(theta i) / M(theta), M(theta) =
sum_i p_i e^(theta i), the power of the tilted masses is the tilted power: (p^{*C})_j =
(p~^{*C})_j M(theta)^C e^(-theta j). A tilt whose mean sits near j computes the mass at j with the same
absolute error on the tilted scale, so with relative error ~ C u log L there. Each mass is taken from the
tilt (0 included) whose error bound is least, and that bound is added to it: every returned mass is >= the
exact mass (the pessimistic direction of a privacy loss distribution: more mass at any loss only raises
delta(eps), before and after composition).

The bound on a computed power on the tilted scale (Higham, "Accuracy and Stability of Numerical Algorithms",
2nd ed., Thm 24.2: an FFT's computed output has 2-norm error <= log2(L) eta / (1 - log2(L) eta) of the
output's 2-norm, eta ~ 6.7 u): E = 2 (C + 1) (8 log2 L + 8) u max_a ||p~_a||_2 per mass, with a margin of two
for the transform's radix and the complex power's own rounding. Masses that alias round the transform's
window are non-negative (they only add), so they enter the choice of tilt, not the bound."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

#: Unit roundoff of float64.
UNIT_ROUNDOFF = 2.0**-53
#: A composition whose float64 error bounds add more than RELATIVE_PADDING to the mass above some loss,
#: where that mass is at least SMALLEST_TAIL (the least delta priced is 1e-12), is transformed again in
#: the platform's long double (x86: unit roundoff 2^-64; where long double is float64 nothing changes): the
#: FFT's absolute error is what swamps small masses between the modes of a composition (issue 50: sigma
#: 0.68, q 1.2e-5, T 3,646 priced 0.2717 in float64, 0.1333 so, against 0.1333 without any bound).
#: Long-double powers are about 4 times slower, so only compositions that need them pay.
RELATIVE_PADDING = 1e-3
SMALLEST_TAIL = 1e-13
PRECISE_DTYPE = np.longdouble
#: Successive tilts move the tilted mean by about this many tilted standard deviations.
TILT_STEP = 3.0
#: At most this many tilts per convolution (beyond them masses keep the least bound found, still valid).
MAX_TILTS = 64
#: A tilt is needed from where the untilted bound exceeds this share of the mass it bounds.
RELATIVE_ENOUGH = 1e-6

#: A tilted transform is longer than the window by this many of the tilted sum's standard deviations.
ALIAS_ROOM = 40.0
#: Tilted weights below e^FLUSHED of the largest are set to 0 (subnormal arithmetic is ~100x slower); the
#: mass so dropped, under n e^FLUSHED a factor, enters the rounding bound as C n e^FLUSHED.
FLUSHED = -600.0

#: Moment generating functions are evaluated on blocks of at most this many terms (orders x masses).
MGF_BLOCK = 1 << 22

#: One factor of a convolution power: the masses of an index on 0, 1, ..., n - 1 and its multiplicity.
Part = tuple[NDArray[np.float64], int]


def convolution_power(parts: Sequence[Part], tail: float) -> tuple[int, NDArray[np.float64]]:
    """(lower, masses): upper bounds of P(I = lower + k) for k = 0..upper - lower (module docstring); all but
    `tail` of I's mass lies on [lower, upper]. In float64 transforms, or in long double ones where the
    float64 bounds add up to more than LOOSE_MASS (a function of the parts alone either way)."""
    factors = _Parts(parts)
    lower, estimate, error = _power(factors, tail, np.float64)
    if _padding_matters(estimate, error) and np.finfo(PRECISE_DTYPE).eps < np.finfo(np.float64).eps:
        lower, estimate, error = _power(factors, tail, PRECISE_DTYPE)
    return lower, np.maximum(estimate + error, 0.0)


def _padding_matters(estimate: NDArray[np.float64], error: NDArray[np.float64]) -> bool:
    """Whether the error bounds add more than RELATIVE_PADDING to the mass above some index where that
    mass is at least SMALLEST_TAIL (so to delta(eps) at some eps with delta in the range priced)."""
    above = np.cumsum(np.maximum(estimate, 0.0)[::-1])
    padding = np.cumsum(error[::-1])
    return bool(np.any((above >= SMALLEST_TAIL) & (padding > RELATIVE_PADDING * above)))


def _power(
    factors: _Parts, tail: float, dtype: type[np.floating[Any]]
) -> tuple[int, NDArray[np.float64], NDArray[np.float64]]:
    """(lower, estimates, error bounds) of the masses by transforms in `dtype`."""
    lower, upper = window(factors, tail)
    size = upper - lower + 1
    plain = _Tilt(factors, 0.0)
    estimate, log_bound, error = plain.masses(lower, size, factors.fast_length(size), dtype)
    needed = _first_loose(estimate, error, plain.mean - lower)
    if needed < size:
        tail_estimate, tail_error, tail_log_bound = estimate[needed:], error[needed:], log_bound[needed:]
        for tilt in _tilts(factors, lower + needed, upper):
            # Room above the window for the tilted mass: its mean is at most `upper`.
            fast = factors.fast_length(size + math.ceil(ALIAS_ROOM * math.sqrt(tilt.variance)))
            tilted, tilted_log_bound, tilted_error = tilt.masses(lower + needed, size - needed, fast, dtype)
            tilted_log_bound = np.logaddexp(tilted_log_bound, tilt.log_aliased(lower + fast))
            better = tilted_log_bound < tail_log_bound
            tail_estimate[better], tail_error[better] = tilted[better], tilted_error[better]
            tail_log_bound[better] = tilted_log_bound[better]
    return lower, estimate, error


def window(parts: _Parts, tail: float) -> tuple[int, int]:
    """[lower, upper] with P(I > upper) <= tail/2 and P(I < lower) <= tail/2. By Chernoff, P(I >= b) <=
    M(t) e^(-t b) for t > 0, so b = (sum_a c_a log M_a(t) + log(2/tail)) / t will do (likewise below for
    t < 0), least over some of dp_accounting's orders +-k/n (k = 1, 2, 5, 10, 20 of its 1..20, n the longest
    factor; its `compute_self_convolve_bounds`) and orders 2^k / sd (k = -3..12, sd that of I), within a
    factor 2 of the best t at any spread, which costs a few sds of window at most (dp_accounting's orders
    alone leave windows of hundreds of sds when the factors are long)."""
    n = max(len(probs) for probs in parts.probs)
    _, _, variance = parts.moments(0.0)
    orders = np.array([k / n for k in (1, 2, 5, 10, 20)])
    if variance > 0.0:
        orders = np.concatenate([orders, 2.0 ** np.arange(-3.0, 13.0) / math.sqrt(variance)])
    upper = sum((len(probs) - 1) * count for probs, count in zip(parts.probs, parts.counts, strict=True))
    lower = 0
    log_two_over_tail = math.log(2.0 / tail)
    slack = 1.0 + parts.total * 1e-12 / orders  # log M's own rounding, in indices
    with np.errstate(over="ignore", invalid="ignore"):
        above = (parts.log_mgfs(orders) + log_two_over_tail) / orders + slack
        below = (parts.log_mgfs(-orders) + log_two_over_tail) / -orders - slack
    if np.isfinite(above).any():
        upper = min(upper, math.ceil(float(above[np.isfinite(above)].min())))
    if np.isfinite(below).any():
        lower = max(lower, math.floor(float(below[np.isfinite(below)].max())))
    return lower, upper


class _Parts:
    """The factors of a convolution power: masses (negatives cut), their logs, indices and multiplicities."""

    def __init__(self, parts: Sequence[Part]) -> None:
        self.probs = [np.maximum(np.asarray(probs, dtype=np.float64), 0.0) for probs, _ in parts]
        self.counts = [int(count) for _, count in parts]
        self.total = sum(self.counts)
        self.index = [np.arange(len(probs), dtype=np.float64) for probs in self.probs]
        with np.errstate(divide="ignore"):
            self.logs = [np.log(probs) for probs in self.probs]

    def tilted(self, theta: float) -> list[tuple[NDArray[np.float64], float, float, float]]:
        """Per factor: (p~ = p e^(theta i) / M(theta), log M(theta), mean and variance of p~)."""
        found = []
        for probs, logs, index in zip(self.probs, self.logs, self.index, strict=True):
            if theta == 0.0:  # untilted: only normalised (one rounding per mass)
                total = float(probs.sum())
                weights, log_m = probs / total, math.log(total)
            else:
                terms = logs + theta * index
                top = float(terms.max())
                terms -= top
                terms[terms < FLUSHED] = -np.inf  # see FLUSHED
                weights = np.exp(terms)
                total = float(weights.sum())
                weights /= total
                log_m = top + math.log(total)
            mean = float((weights * index).sum())
            centred = index - mean
            found.append((weights, log_m, mean, float((weights * centred * centred).sum())))
        return found

    def log_mgfs(self, thetas: NDArray[np.float64]) -> NDArray[np.float64]:
        """sum_a c_a log M_a(theta) at each theta, from above (terms under e^FLUSHED of their largest counted
        as that), a block of thetas at a time."""
        thetas = np.asarray(thetas, dtype=np.float64)
        total = np.zeros(len(thetas))
        for logs, index, count in zip(self.logs, self.index, self.counts, strict=True):
            rows = max(1, MGF_BLOCK // max(len(logs), 1))
            for start in range(0, len(thetas), rows):
                block = thetas[start : start + rows, None]
                terms = logs[None, :] + block * index[None, :]
                top = terms.max(axis=1, keepdims=True)
                terms -= top
                terms[terms < FLUSHED] = -np.inf
                sums = np.exp(terms).sum(axis=1) + len(logs) * math.exp(FLUSHED)
                total[start : start + rows] += count * (top[:, 0] + np.log(sums))
        return total

    def moments(self, theta: float) -> tuple[float, float, float]:
        """(sum_a c_a log M_a(theta), mean, variance) of the tilted sum."""
        log_mgf = mean = variance = 0.0
        for (_, log_m, part_mean, part_variance), count in zip(self.tilted(theta), self.counts, strict=True):
            log_mgf += count * log_m
            mean += count * part_mean
            variance += count * part_variance
        return log_mgf, mean, variance

    def fast_length(self, size: int) -> int:
        from scipy import fft as scipy_fft

        return int(scipy_fft.next_fast_len(max([size, *(len(probs) for probs in self.probs)]), real=True))


class _Tilt:
    """The factors tilted by theta, and what a transform of their power computes and how far off it can be."""

    def __init__(self, parts: _Parts, theta: float) -> None:
        self.parts = parts
        self.theta = theta
        tilted = parts.tilted(theta)
        self.weights = [weights for weights, _, _, _ in tilted]
        self.log_mgf: float = sum(
            count * log_m for (_, log_m, _, _), count in zip(tilted, parts.counts, strict=True)
        )
        self.mean: float = sum(
            count * mean for (_, _, mean, _), count in zip(tilted, parts.counts, strict=True)
        )
        self.variance: float = sum(
            count * var for (_, _, _, var), count in zip(tilted, parts.counts, strict=True)
        )
        self.largest_norm = max(math.sqrt(float((weights * weights).sum())) for weights in self.weights)
        # Each tilted mass is exp of an argument |log p + theta i - log M| rounded thrice: relative error
        # <= 3u (|argument| + 1); a power of C such inputs (all >= 0) has relative error <= (1 + that)^C - 1.
        largest = 0.0
        if theta != 0.0:
            for logs, index, (_, log_m, _, _) in zip(parts.logs, parts.index, tilted, strict=True):
                support = np.isfinite(logs)
                largest = max(largest, float(np.abs(logs[support]).max() + theta * index[-1]) + abs(log_m))
        self.relative = 4.0 * UNIT_ROUNDOFF * (parts.total + 1) * (largest + 2.0)

    def masses(
        self, lower: int, size: int, fast: int, dtype: type[np.floating[Any]] = np.float64
    ) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]]:
        """(estimate, log of its error bound, error bound) of P(I = lower + k), k < size, from this tilt, by a
        transform of length `fast` in `dtype` (which holds index i at i mod fast, with what aliases onto
        it)."""
        from scipy import fft as scipy_fft  # ~40 ms to import: only when a composition is priced

        spectrum = np.ones(fast // 2 + 1, dtype=np.result_type(dtype, np.complex64))
        for weights, count in zip(self.weights, self.parts.counts, strict=True):
            spectrum *= scipy_fft.rfft(weights.astype(dtype), fast) ** count
        power = scipy_fft.irfft(spectrum, fast)
        # rounded to float64: one more relative rounding per mass (in `relative` below)
        kept = np.take(power, np.arange(lower, lower + size) % fast).astype(np.float64)
        transform_roundoff = float(np.finfo(dtype).eps) / 2.0
        rounding = 2.0 * (self.parts.total + 1) * (8.0 * math.log2(fast) + 8.0) * transform_roundoff
        rounding *= self.largest_norm
        rounding += self.parts.total * max(len(weights) for weights in self.weights) * math.exp(FLUSHED)
        log_scale = self.log_mgf - self.theta * (lower + np.arange(size, dtype=np.float64))
        relative = self.relative + 4.0 * UNIT_ROUNDOFF * (np.abs(log_scale) + 3.0)
        with np.errstate(over="ignore", invalid="ignore"):
            scale = np.exp(log_scale)
            estimate = kept * scale
            error = rounding * scale * (1.0 + relative) + relative * np.abs(estimate)
        usable = np.isfinite(estimate) & np.isfinite(error)  # a scale past float range: never chosen
        estimate, error = np.where(usable, estimate, 0.0), np.where(usable, error, np.inf)
        with np.errstate(divide="ignore"):
            return estimate, np.log(error), error

    def log_aliased(self, top: int) -> float:
        """log of a Chernoff bound on the tilted mass at `top` and above, which the transform folds into the
        window (only ever adding: it sways the choice of tilt, not the bound); orders 4^k / sd."""
        if self.variance <= 0.0:
            return -math.inf
        orders = 2.0 ** np.arange(-2.0, 7.0, 2.0) / math.sqrt(self.variance)
        with np.errstate(over="ignore", invalid="ignore"):
            bounds = self.parts.log_mgfs(self.theta + orders) - self.log_mgf - orders * top
        return float(np.nanmin(bounds))


def _first_loose(estimate: NDArray[np.float64], error: NDArray[np.float64], mode: float) -> int:
    """The first offset above `mode` from which the untilted bound is no longer small beside the mass."""
    start = max(0, math.ceil(mode))
    loose = np.nonzero(error[start:] > RELATIVE_ENOUGH * np.maximum(estimate[start:], 0.0))[0]
    return start + int(loose[0]) if len(loose) else len(estimate)


def _tilts(parts: _Parts, first: int, last: int) -> list[_Tilt]:
    """Tilts whose means step from `first` past `last` by TILT_STEP standard deviations of the tilt before
    (the mass at j is bounded best by the tilt whose mean is j; between two, about e^(step^2/8) worse)."""
    found: list[_Tilt] = []
    theta, (_, mean, variance) = 0.0, parts.moments(0.0)
    target = float(first)
    while len(found) < MAX_TILTS and variance > 0.0 and mean + TILT_STEP * math.sqrt(variance) <= last:
        solved = _theta_for_mean(parts, max(target, mean), theta)
        if solved is None:
            break
        found.append(_Tilt(parts, solved))
        theta, mean, variance = solved, found[-1].mean, found[-1].variance
        target = mean + TILT_STEP * math.sqrt(max(variance, 0.0))
    return found


def _theta_for_mean(parts: _Parts, target: float, start: float) -> float | None:
    """A tilt >= `start` whose tilted sum has mean within a quarter of its standard deviation of `target`
    (safeguarded Newton: the mean rises with theta at rate the variance), or None where no tilt reaches it."""
    low, high = start, math.inf
    theta = start
    for _ in range(100):
        _, mean, variance = parts.moments(theta)
        if variance <= 0.0:
            return None
        if abs(mean - target) <= 0.25 * math.sqrt(variance):
            return theta
        if mean < target:
            low = theta
        else:
            high = theta
        theta += (target - mean) / variance
        if not low < theta < high:  # Newton left the bracket: bisect (or double past an open top)
            theta = 0.5 * (low + high) if math.isfinite(high) else low + 2.0 * max(theta - low, 1e-9)
    return None
