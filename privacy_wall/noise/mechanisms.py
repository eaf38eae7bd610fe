"""Noise and the arithmetic around it: clipping factors, block normalisation, Analyze Gauss, PSD projection.

Private releases draw from `privacy_wall.noise.csprng.private_generator()`, which no caller can seed.

Noise is exact and in fixed point (issue 25; docs/design.md, "Floating-point-safe noise"). Floating-point
Gaussian samples leak the noiseless value through their low-order bits (Mironov, CCS 2012; Jin et al.,
IEEE S&P 2022), so no release adds a float sample: `release_blocks` rounds the normalised blocks to a public
grid, adds integer noise from the exact discrete Gaussian (privacy_wall.noise.discrete_gaussian, integer
arithmetic over the generator's raw 64-bit words), sums in int64 and scales back. Every released number is
a deterministic function of that integer vector (post-processing), so nothing about the noiseless value
survives in its low-order bits beyond what the integer mechanism reveals. `fixed_point_grid` states the grid,
the rounding's charge and the accounting argument.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from math import ceil, isqrt
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import NDArray

from privacy_wall.noise.discrete_gaussian import DENOMINATOR_MAX, SIGMA2_MAX, sample_discrete_gaussian

if TYPE_CHECKING:
    from privacy_wall.noise.draw_ahead import NoiseAhead

Array = NDArray[np.float64]
Ints = NDArray[np.int64]

#: The grid step gamma (in normalised units: sensitivity 1, noise multiplier sigma) is the largest power of
#: two <= sigma * 2^-GRID_BITS, so the noise spans 2^22 to 2^23 grid steps before the rounding's inflation.
GRID_BITS = 22
#: Variance (grid steps^2) added to the discrete Gaussian's parameter on top of the inflated calibration:
#: the smoothing r of the accounting argument (`fixed_point_grid`), whose residual is
#: xi = 2 sum_{m >= 1} exp(-2 pi^2 r m^2) < 1e-548 per coordinate.
SMOOTHING = 64
#: Normalised coordinates are clamped to +-CLAMP_STEPS grid steps before rounding (a contraction: it cannot
#: raise the sensitivity). With the sampler's |noise| < 2^30 (2^24 + 1) < 2^55 grid steps, every int64 sum
#: stays below 2^62 + 2^55 < 2^63. No clipped block comes near it (|z| <= S per coordinate whenever
#: Delta_b >= C_b / S, against CLAMP_STEPS gamma >= 2^39 sigma), so it never acts in practice; clamping
#: instead of refusing keeps the release's control flow independent of the rows' values.
CLAMP_STEPS = 2**62
#: The smallest sigma whose grid step is a normal float64 far from underflow.
SIGMA_MIN = 2.0**-900


class GridError(ValueError):
    """The fixed-point release cannot be made for this sigma and dimension (public facts only)."""


@dataclass(frozen=True)
class Grid:
    """The fixed-point plan of one release: a function of sigma and the release's size d only (public).

    gamma: grid step in normalised units (a power of two); sigma2: the discrete Gaussian's parameter in
    grid steps^2 (a Fraction with denominator <= 4096); root_d: ceil(sqrt(d)).
    """

    gamma: float
    sigma2: Fraction
    dimension: int
    root_d: int

    @property
    def inflation(self) -> float:
        """1 + gamma ceil(sqrt(d)): the effective sensitivity of the rounded normalised vector."""
        return 1.0 + self.gamma * self.root_d

    @property
    def noise_scale(self) -> float:
        """The discrete Gaussian's parameter in normalised units, sqrt(sigma2) gamma (its std is below it)."""
        return math.sqrt(float(self.sigma2)) * self.gamma


def fixed_point_grid(sigma: float, dimension: int, *, bits: int = GRID_BITS) -> Grid:
    """The grid and noise parameter of a release with noise multiplier sigma on d normalised coordinates.

    Normalised units: z = (block_b / (J Delta_b))_b concatenated, L2 sensitivity <= 1 (the query's
    declaration), noise multiplier sigma. The release rounds z / gamma to integers k (after clamping to
    +-CLAMP_STEPS, a contraction), adds X ~ N_Z(0, sigma2)^d and returns (k + X) gamma J Delta_b per block.

    The grid: gamma = the largest power of two <= sigma 2^-bits (bits = 22): so far below the noise that the
    rounding's charge is small (below), a power of two so that z / gamma and (k + X) gamma are exact in
    float64, and coarse enough that sigma2 <= 2^48 (the sampler's int64 range) for d up to about
    (2^23 / sigma)^2 coordinates; larger d is refused (GridError).

    The rounding's charge: rounding each of d coordinates to the nearest grid point moves each coordinate by
    at most gamma / 2, so the rounded vectors of two neighbours differ by at most ||z - z'|| + gamma sqrt(d)
    <= 1 + gamma ceil(sqrt(d)) =: Delta_eff in L2, i.e. Delta_eff / gamma grid steps, an integer vector.
    sigma is scaled up instead of charging more: the continuous-Gaussian calibration in grid steps is
    sigma_c = sigma Delta_eff / gamma, and sigma2 = ceil((sigma_c^2 + SMOOTHING) 4096) / 4096, computed
    exactly in rationals from the float sigma. So sqrt(sigma2 - SMOOTHING) / (Delta_eff / gamma) >= sigma:
    the ledger's price (continuous Gaussian, multiplier sigma, sensitivity 1) stays valid, by this argument:

    Accounting (exact post-processing plus Poisson summation; docs/design.md). Let s = sigma2,
    r = SMOOTHING, s' = s - r >= sigma_c^2. Let K_r(z) be the discrete Gaussian on Z centred at z with
    parameter r (pmf exp(-(k - z)^2 / 2r) / theta(z), theta(z) = sum_j exp(-(j - z)^2 / 2r)); for an integer
    vector v, v + K_r(Z) has the law of K_r(v + Z), so v + K_r(Z'), Z' ~ N(0, s' I), is a post-processing of
    the continuous Gaussian mechanism v + Z' on the integer vector v. By Poisson summation
    theta(z) = sqrt(2 pi r) (1 + sum_{m != 0} exp(-2 pi^2 r m^2) cos(2 pi m z)), within a factor 1 +- xi of
    sqrt(2 pi r), xi = 2 sum_{m >= 1} exp(-2 pi^2 r m^2) < 1e-548 (r = 64); likewise the discrete
    Gaussian's normaliser theta(0; s). Hence the pmf of K_r(Z') on each coordinate is within a factor
    (1 + xi) / (1 - xi) = e^{eta_1} of N_Z(0, s)'s (the convolution of N(0, s') and N(0, r) is N(0, s)).
    A job's transcripts (batches and releases, adaptively) then have pmfs within e^{+-E},
    E = eta_1 sum_t d_t < 1e-500 (eta_1 < 1e-547, any job releasing fewer than 10^40 numbers), of those of
    the same job with continuous Gaussian noise of multiplier sqrt(s') gamma / Delta_eff >= sigma (a
    post-processing of multiplier sigma: add independent Gaussian noise); whatever (eps, delta) the
    ledger's accountant proves for the job at multiplier sigma, the released job satisfies
    (eps + 2E, e^E delta): a residual hundreds of orders of magnitude below float64's resolution.
    (Independently, CKS 2020's sub-Gaussianity of N_Z(0, s) gives the same Renyi curve alpha / (2 sigma^2)
    as the continuous Gaussian exactly, i.e. 1 / (2 sigma^2)-zCDP, for the unsampled release.) Checked at
    every release: s' >= sigma_c^2 (exactly, in rationals), r = SMOOTHING >= 64, s <= 2^48; anything else
    raises GridError.
    """
    if isinstance(dimension, bool) or not isinstance(dimension, int) or dimension < 1:
        raise GridError(f"a release needs at least one coordinate, got {dimension!r}")
    if not (math.isfinite(sigma) and sigma >= SIGMA_MIN):
        raise GridError(f"noise multiplier {sigma!r} is outside the fixed-point range [2^-900, inf)")
    if not 0 <= bits <= 30:
        raise GridError(f"grid bits must be in [0, 30], got {bits}")
    gamma = math.ldexp(1.0, math.frexp(sigma)[1] - 1 - bits)  # frexp: sigma = m 2^e, 1/2 <= m < 1
    root_d = isqrt(dimension - 1) + 1  # ceil(sqrt(d))
    step = Fraction(gamma)
    calibrated = Fraction(sigma) * (1 + step * root_d) / step  # sigma_c = sigma Delta_eff / gamma, exactly
    sigma2 = Fraction(ceil((calibrated * calibrated + SMOOTHING) * DENOMINATOR_MAX), DENOMINATOR_MAX)
    if sigma2 > SIGMA2_MAX:
        raise GridError(
            f"a release of {dimension} numbers at noise multiplier {sigma:.6g} needs more than 2^24 grid "
            "steps of noise (the sampler's int64 range): release fewer numbers per iteration"
        )
    # The accounting argument's conditions, checked exactly on the values the sampler will use.
    if not (sigma2 - SMOOTHING >= calibrated * calibrated and SMOOTHING >= 64):
        raise GridError("the fixed-point noise does not cover the calibrated Gaussian: release refused")
    return Grid(gamma, sigma2, dimension, root_d)


def discrete_gaussian_noise(sigma2: Fraction, size: int, rng: np.random.Generator | NoiseAhead) -> Ints:
    """`size` i.i.d. draws of N_Z(0, sigma2) from the generator's raw 64-bit words (no float is formed), or
    from a job's `NoiseAhead` (drawn the same way, on a background thread)."""
    if isinstance(rng, np.random.Generator):
        return sample_discrete_gaussian(sigma2, size, rng.bit_generator)
    return rng.draw(sigma2, size)


def clip_factors(norms: Array, bound: float) -> Array:
    """Per-record factors min(1, C / ||v||) that scale each contribution to L2 norm <= C; a norm that
    overflowed to NaN (0 * inf) counts as infinite: that record contributes nothing."""
    safe = np.maximum(np.where(np.isnan(norms), np.inf, norms), np.finfo(np.float64).tiny)
    return np.minimum(1.0, bound / safe)


def upper_triangle(matrix: Array) -> Array:
    """Pack the upper triangle (with the diagonal) of a symmetric matrix, row-major."""
    rows, cols = np.triu_indices(matrix.shape[0])
    return matrix[rows, cols]


def symmetric_from_upper(packed: Array, dim: int) -> Array:
    """Inverse of upper_triangle: mirror the packed upper triangle into a symmetric matrix."""
    out = np.zeros((dim, dim))
    rows, cols = np.triu_indices(dim)
    out[rows, cols] = packed
    out[cols, rows] = packed
    return out


def project_psd(matrix: Array, floor: float = 0.0) -> Array:
    """Nearest symmetric matrix (Frobenius) with eigenvalues >= floor."""
    sym = (matrix + matrix.T) / 2
    eigenvalues, vectors = np.linalg.eigh(sym)
    clipped = np.maximum(eigenvalues, floor)
    projected: Array = (vectors * clipped) @ vectors.T
    return projected


@dataclass(frozen=True)
class BlockRelease:
    """Noised blocks, the per-block noise scale actually used, and the grid each block lies on.

    noise_std[b] = sqrt(sigma2) gamma J Delta_b: the discrete Gaussian's parameter scaled to block b, i.e.
    sigma J Delta_b times the grid's inflation (1 + gamma ceil(sqrt(d))) and the smoothing (a relative
    2^-39 at most); the noise's true std is a little below it. unit[b] = gamma J Delta_b: every value of
    block b is float64(k) * unit[b] for an integer k (the int64 sum of the rounded block and the noise),
    so values[b] / unit[b] rounds back to k and k * unit[b] reproduces the value exactly. Without noise
    (sigma = 0, public data only) values are the blocks themselves and unit is 0.
    """

    values: dict[str, Array]
    noise_std: dict[str, float]
    unit: dict[str, float]
    grid: Grid | None = None


def release_blocks(
    sums: dict[str, Array],
    sensitivities: dict[str, float],
    sigma: float,
    rng: np.random.Generator | NoiseAhead,
    *,
    joint_sensitivity: float | None = None,
) -> BlockRelease:
    """One Gaussian mechanism with multiplier sigma over B blocks with their own sensitivities, fixed point.

    Each block b is divided by J Delta_b (so the concatenation has sensitivity 1; J is the joint
    sensitivity of the blocks each divided by Delta_b: sqrt(B) by default, which always holds, or a smaller
    bound the query proves, 0 < J <= sqrt(B), queries.base.joint_sensitivity). The d normalised coordinates
    are rounded to the grid gamma of `fixed_point_grid(sigma, d)` (integers k, int64), one call of the exact
    discrete Gaussian sampler adds integer noise X ~ N_Z(0, sigma2)^d to all of them, and block b is
    returned as (k + X) gamma J Delta_b. Rounding is charged in the sensitivity: the rounded vector has L2
    sensitivity 1 + gamma ceil(sqrt(d)), and sigma2 is calibrated for sigma times that (plus the smoothing
    of the accounting argument), so the release is priced as one continuous Gaussian mechanism with
    multiplier sigma and sensitivity 1 (`fixed_point_grid` gives the argument).
    """
    if set(sums) != set(sensitivities):
        raise ValueError("every block needs a declared sensitivity")
    ceiling = float(np.sqrt(len(sums)))
    joint = ceiling if joint_sensitivity is None else float(joint_sensitivity)
    if not 0 < joint <= ceiling:
        raise ValueError(f"joint sensitivity must be in (0, sqrt(B) = {ceiling}]")
    if not sigma >= 0 or not math.isfinite(sigma):
        raise ValueError("sigma must be a finite number >= 0")
    names = list(sums)
    scales = {name: joint * float(sensitivities[name]) for name in names}
    if sigma == 0:
        return BlockRelease(
            {name: np.asarray(sums[name], dtype=np.float64) for name in names},
            dict.fromkeys(names, 0.0),
            dict.fromkeys(names, 0.0),
        )
    blocks = [np.asarray(sums[name], dtype=np.float64) for name in names]
    dimension = sum(block.size for block in blocks)
    grid = fixed_point_grid(float(sigma), dimension)
    # Rounded normalised coordinates in grid steps: z_b / gamma = block_b / (J Delta_b gamma), clamped
    # (a contraction) so that the int64 sum with the noise cannot overflow. Non-finite values are refused.
    steps = np.empty(dimension, dtype=np.float64)
    start = 0
    for name, block in zip(names, blocks, strict=True):
        steps[start : start + block.size] = block.reshape(-1) / (scales[name] * grid.gamma)
        start += block.size
    if not np.isfinite(steps).all():
        raise ValueError("a normalised block is not finite: nothing is released")
    np.clip(steps, -CLAMP_STEPS, CLAMP_STEPS, out=steps)
    total: Ints = np.rint(steps).astype(np.int64)
    total += discrete_gaussian_noise(grid.sigma2, dimension, rng)
    values: dict[str, Array] = {}
    stds: dict[str, float] = {}
    units: dict[str, float] = {}
    start = 0
    for name, block in zip(names, blocks, strict=True):
        unit = grid.gamma * scales[name]
        values[name] = (total[start : start + block.size].astype(np.float64) * unit).reshape(block.shape)
        stds[name] = grid.noise_scale * scales[name]
        units[name] = unit
        start += block.size
    return BlockRelease(values, stds, units, grid)
