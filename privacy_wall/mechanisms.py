"""Noise and the arithmetic around it: clipping factors, block normalisation, Analyze Gauss, PSD projection.

There is one noise function, `gaussian_noise`. Private releases draw from `private_generator()`: a
cryptographically secure bit generator (randomgen's AESCounter, AES-128 in counter mode) keyed with 128
bits from the operating system's CSPRNG (secrets), built anew for each release so no caller can seed it.
Unlike a PCG or Mersenne Twister stream, its outputs do not reveal its state, so released noise cannot be
used to predict (and subtract) other noise or the minibatch drawn from the same stream. AESCounter was the
fastest of randomgen's cryptographic generators here (AES-NI; ChaCha20 and SPECK128 took 2-4 times as long
for the resampling uniforms of an LDA iteration) and costs about as much as PCG64DXSM: bench/README.md.
A seeded generator is accepted only where the gate has checked that the dataset is public.

Floating-point caveat (Mironov 2012): textbook floating-point Gaussian samples leak through their
low-order bits. We release float64 values produced by numpy's ziggurat sampler; the released statistics
are rounded by the M-step arithmetic immediately afterwards. This is the same exposure as Opacus and
diffprivlib's Gaussian mechanism; a discrete Gaussian would remove it.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray
from randomgen import AESCounter

Array = NDArray[np.float64]


def private_generator() -> np.random.Generator:
    """A fresh generator over AES-128 in counter mode, its key 128 bits from the OS's CSPRNG (set directly,
    not through a SeedSequence). Uses AES-NI where the CPU has it (`AESCounter.use_aesni`), a portable
    AES otherwise (slower, the same stream)."""
    return np.random.Generator(AESCounter(key=secrets.randbits(128)))


def gaussian_noise(shape: int | tuple[int, ...], std: float, rng: np.random.Generator) -> Array:
    """i.i.d. N(0, std^2) noise of the given shape; zeros when std == 0."""
    if std < 0:
        raise ValueError("noise std must be >= 0")
    if std == 0:
        return np.zeros(shape)
    return rng.normal(0.0, std, size=shape)


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
    """Noised blocks and the per-block noise std actually used (sigma * J * Delta_b)."""

    values: dict[str, Array]
    noise_std: dict[str, float]


def release_blocks(
    sums: dict[str, Array],
    sensitivities: dict[str, float],
    sigma: float,
    rng: np.random.Generator,
    *,
    joint_sensitivity: float | None = None,
) -> BlockRelease:
    """One Gaussian mechanism with multiplier sigma over B blocks with their own sensitivities.

    Each block b is divided by its sensitivity Delta_b (so it has sensitivity 1), the concatenation gets
    N(0, J^2 sigma^2) per coordinate, and each block is scaled back: block b receives
    N(0, (sigma J Delta_b)^2) per coordinate. J is the joint sensitivity of the concatenation: sqrt(B)
    (the default) always holds; a query whose blocks provably cannot all reach their bounds on one
    replacement declares a smaller J (0 < J <= sqrt(B), queries.base.joint_sensitivity). Dividing by J
    gives a sensitivity-1 vector with noise multiplier sigma, which is what is charged either way.
    """
    if set(sums) != set(sensitivities):
        raise ValueError("every block needs a declared sensitivity")
    ceiling = float(np.sqrt(len(sums)))
    joint = ceiling if joint_sensitivity is None else float(joint_sensitivity)
    if not 0 < joint <= ceiling:
        raise ValueError(f"joint sensitivity must be in (0, sqrt(B) = {ceiling}]")
    scale = sigma * joint
    values: dict[str, Array] = {}
    stds: dict[str, float] = {}
    for name, block in sums.items():
        std = float(scale * sensitivities[name])
        values[name] = block + gaussian_noise(block.shape, std, rng)
        stds[name] = std
    return BlockRelease(values, stds)
