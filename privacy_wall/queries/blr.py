"""Bayesian logistic regression's E-step (VIPS paper Alg. 5) with Polya-Gamma augmentation.

Given the public expected second moment M = E[w w^T] of the weights, for each record
c_n = sqrt(x_n^T M x_n) and E[xi_n] = tanh(c_n / 2) / (2 c_n) (1/4 at c_n = 0). Blocks:
  s1 = sum_n (y_n - 1/2) x_n            per-record bound C = 1/2 (||x|| <= 1), general: Delta = 1/S
  s2 = sum_n E[xi_n] x_n x_n^T           per-record bound C = 1/4 (Frobenius), PSD: Delta = sqrt(2)/(4S)
s2 is released as its packed upper triangle (whose L2 norm is at most the Frobenius norm), mirrored and
projected to PSD afterwards (Analyze Gauss).
"""

from __future__ import annotations

import numpy as np

from privacy_wall.mechanisms import clip_factors, project_psd, symmetric_from_upper, upper_triangle
from privacy_wall.queries.base import Array, Block
from privacy_wall.store import Batch

S1_BOUND = 0.5
S2_BOUND = 0.25


def polya_gamma_mean(c: Array) -> Array:
    """E[xi] for xi ~ PG(1, c): tanh(c/2) / (2c), continuous at 0 with value 1/4."""
    c = np.abs(c)
    small = c < 1e-6
    safe = np.where(small, 1.0, c)
    return np.where(small, 0.25 - c * c / 48.0, np.tanh(safe / 2.0) / (2.0 * safe))


class LogisticRegressionQuery:
    """The wall's half of VIPS-BLR."""

    name = "blr"

    def blocks(self, dimension: int) -> tuple[Block, ...]:
        return (Block("s1", S1_BOUND), Block("s2", S2_BOUND, nonnegative_or_psd=True))

    def validate_params(self, params: dict[str, Array], dimension: int) -> None:
        if set(params) != {"second_moment"}:
            raise ValueError("blr takes exactly one public parameter: second_moment")
        moment = params["second_moment"]
        if moment.shape != (dimension, dimension) or not np.isfinite(moment).all():
            raise ValueError(f"second_moment must be a finite {dimension}x{dimension} matrix")

    def clipped_sums(
        self, batch: Batch, params: dict[str, Array], rng: np.random.Generator
    ) -> dict[str, Array]:
        x, y = batch.features, batch.labels
        if y is None:
            raise ValueError("blr needs labelled rows")
        # A record with a non-finite value (the stores never hold one) contributes nothing: inf * 0 in the
        # sums below would otherwise make the whole release NaN. Each record is judged on its own values.
        finite = np.isfinite(x).all(axis=1) & np.isfinite(y)
        if not finite.all():
            x = np.where(finite[:, None], x, 0.0)
            y = np.where(finite, y, 0.5)
        # Overflow is handled below; a floating-point warning would be a data-dependent signal of its own.
        with np.errstate(all="ignore"):
            moment = params["second_moment"]
            sq_norms = np.einsum("ij,ij->i", x, x)
            quad = np.einsum("ij,ij->i", x @ moment, x)  # x_n^T E[w w^T] x_n
            # Overflow (inf - inf, 0 * inf) must not turn a record into NaN: a NaN release is a data-dependent
            # signal no noise hides. Any E[xi] in [0, 1/4] keeps the bound; treat it as c = inf (E[xi] = 0).
            quad = np.where(np.isnan(quad), np.inf, quad)
            xi = polya_gamma_mean(np.sqrt(np.maximum(quad, 0.0)))

            centred = y - 0.5
            s1_weights = centred * clip_factors(np.abs(centred) * np.sqrt(sq_norms), S1_BOUND)
            s2_weights = xi * clip_factors(xi * sq_norms, S2_BOUND)  # ||xi x x^T||_F = xi ||x||^2
            s1 = x.T @ s1_weights
            s2 = (x * s2_weights[:, None]).T @ x
        return {"s1": s1, "s2": upper_triangle(s2)}

    def postprocess(self, noised_means: dict[str, Array], dimension: int) -> dict[str, Array]:
        s2 = project_psd(symmetric_from_upper(noised_means["s2"], dimension))
        return {"s1": noised_means["s1"], "s2": s2}
