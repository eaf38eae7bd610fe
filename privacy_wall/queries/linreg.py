"""Bayesian linear regression's E-step behind the wall (VIPS for a conjugate-exponential model, paper Sec. 3).

Model (Normal-Gamma, conjugate): y_n = w^T x_n + e_n with e_n ~ N(0, 1 / tau), tau ~ Gamma(a0, b0),
w | tau ~ N(0, (tau lambda0)^-1 I). The complete-data likelihood of a record is an exponential family in
(tau w w^T, tau w, tau, log tau) with sufficient statistics (x x^T, y x, y^2, 1), and there are no latent
variables: the "expected" sufficient statistics of the E-step are the data statistics themselves and do not
depend on the current posterior. So the query takes no public parameters, and VIPS at sigma = 0 in batch
mode is exact Bayesian inference (the posterior natural parameters are prior + N times the batch means;
worker.models.linreg).

Ingestion bounds: ||x|| <= 1 and |y| <= 1. Released blocks (per-record contribution, its L2 bound C, the
replace-one sensitivity of the batch mean; DESIGN section 2):

  xx = x x^T    packed upper triangle   ||x x^T||_F = ||x||^2 <= 1, PSD:   C = 1, Delta = sqrt(2) / S
  yx = y x      (d,)                    ||y x|| = |y| ||x|| <= 1, signed:   C = 1, Delta = 2 / S
  yy = y^2      (1,)                    y^2 in [0, 1], non-negative:       C = 1, Delta = sqrt(2) / S

The packed upper triangle of x x^T has L2 norm at most its Frobenius norm, and the PSD argument
(<u, v> >= 0, so ||u - v||^2 <= ||u||^2 + ||v||^2) holds in Frobenius norm, which bounds the packed
difference. Each contribution is clipped to its bound (a no-op within the ingestion bounds): x x^T is scaled
by min(1, 1 / ||x||^2), y x by min(1, 1 / (|y| ||x||)), y^2 is capped at 1. A record with a non-finite value
(unreachable through the stores, which check finiteness) contributes 0 to every block, and so does y x
when y = 0 and ||x||^2 overflows (0 * inf); every other record's clip factors are finite.

Post-processing (data-independent): the three noised means are the blocks of the batch mean of the
(d + 1) x (d + 1) PSD matrix [x; y][x; y]^T, so the mirrored joint matrix [[xx, yx], [yx^T, yy]] is projected
to the PSD cone. That keeps xx PSD and y^2 >= 0, and more: yy >= yx^T xx^+ yx, which guarantees that the
posterior's Gamma rate b_N = b0 + (N yy - eta^T Lambda^-1 eta) / 2 stays >= b0 > 0 under noise.
"""

from __future__ import annotations

import numpy as np

from privacy_wall.mechanisms import clip_factors, project_psd, symmetric_from_upper, upper_triangle
from privacy_wall.queries.base import Array, Block
from privacy_wall.store import Batch

#: Per-record L2 bounds of the three blocks (||x|| <= 1, |y| <= 1).
XX_BOUND = 1.0
YX_BOUND = 1.0
YY_BOUND = 1.0


def joint_second_moment(xx: Array, yx: Array, yy: float) -> Array:
    """The (d + 1) x (d + 1) matrix [[xx, yx], [yx^T, yy]] (xx given as a full symmetric matrix)."""
    d = yx.shape[0]
    joint = np.empty((d + 1, d + 1))
    joint[:d, :d] = xx
    joint[:d, d] = yx
    joint[d, :d] = yx
    joint[d, d] = yy
    return joint


class LinearRegressionQuery:
    """The wall's half of VIPS for conjugate Bayesian linear regression: clipped data statistics."""

    name = "linreg"

    def blocks(self, dimension: int) -> tuple[Block, ...]:
        return (
            Block("xx", XX_BOUND, nonnegative_or_psd=True),
            Block("yx", YX_BOUND),
            Block("yy", YY_BOUND, nonnegative_or_psd=True),
        )

    def validate_params(self, params: dict[str, Array], dimension: int) -> None:
        if params:
            raise ValueError(
                "linreg takes no public parameters (its E-step does not depend on the posterior)"
            )

    def clipped_sums(
        self, batch: Batch, params: dict[str, Array], rng: np.random.Generator
    ) -> dict[str, Array]:
        del rng, params  # deterministic, and independent of the posterior
        x, y = batch.features, batch.labels
        if y is None:
            raise ValueError("linreg needs labelled rows")
        with np.errstate(over="ignore", invalid="ignore"):
            finite = np.isfinite(x).all(axis=1) & np.isfinite(y)
            x = np.where(finite[:, None], x, 0.0)
            y = np.where(finite, y, 0.0)
            sq_norms = np.einsum("ij,ij->i", x, x)
            xx_weights = clip_factors(sq_norms, XX_BOUND)  # ||x x^T||_F = ||x||^2
            yx_weights = y * clip_factors(np.abs(y) * np.sqrt(sq_norms), YX_BOUND)
            # 0 * inf (y = 0 and ||x||^2 overflowing) is NaN: such a record contributes 0 to y x.
            yx_weights = np.where(np.isnan(yx_weights), 0.0, yx_weights)
            yy = np.minimum(y * y, YY_BOUND)
        xx = (x * xx_weights[:, None]).T @ x
        return {
            "xx": upper_triangle(xx),
            "yx": x.T @ yx_weights,
            "yy": np.array([float(yy.sum())]),
        }

    def postprocess(self, noised_means: dict[str, Array], dimension: int) -> dict[str, Array]:
        """Mirror xx and project the joint second moment [[xx, yx], [yx^T, yy]] to the PSD cone."""
        xx = symmetric_from_upper(noised_means["xx"], dimension)
        joint = project_psd(joint_second_moment(xx, noised_means["yx"], float(noised_means["yy"][0])))
        return {
            "xx": joint[:dimension, :dimension],
            "yx": joint[:dimension, dimension].copy(),
            "yy": np.array([joint[dimension, dimension]]),
        }
