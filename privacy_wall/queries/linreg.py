"""Bayesian linear regression's E-step behind the wall (VIPS for a conjugate-exponential model, paper Sec. 3).

Model (Normal-Gamma, conjugate): y_n = w^T x_n + e_n with e_n ~ N(0, 1 / tau), tau ~ Gamma(a0, b0),
w | tau ~ N(0, (tau lambda0)^-1 I). The complete-data likelihood of a record is an exponential family in
(tau w w^T, tau w, tau, log tau) with sufficient statistics (x x^T, y x, y^2, 1), and there are no latent
variables: the "expected" sufficient statistics of the E-step are the data statistics themselves and do not
depend on the current posterior. So the query takes no public parameters, and VIPS at sigma = 0 in batch
mode is exact Bayesian inference (the posterior natural parameters are prior + N times the batch means;
vips.models.linreg.model).

Ingestion bounds: ||x|| <= 1 and |y| <= 1. Released blocks (per-record contribution, its L2 bound C, the
replace-one sensitivity of the batch mean; docs/design.md section 2):

  xx = x x^T    packed upper triangle   ||x x^T||_F = ||x||^2 <= 1, PSD:   C = 1, Delta = sqrt(2) / S
  yx = y x      (d,)                    ||y x|| = |y| ||x|| <= 1, signed:   C = 1, Delta = 2 / S
  yy = y^2      (1,)                    y^2 in [0, 1], non-negative:       C = 1, Delta = sqrt(2) / S

The packed upper triangle of x x^T has L2 norm at most its Frobenius norm, and the PSD argument
(<u, v> >= 0, so ||u - v||^2 <= ||u||^2 + ||v||^2) holds in Frobenius norm, which bounds the packed
difference. The record itself is clipped to the ingestion bounds (a no-op within them): x is scaled by
min(1, 1 / ||x||) and y clipped to [-1, 1], and the three contributions are computed from the clipped
record, so each is within its bound and they stay the statistics of one record (x, y) with ||x|| <= 1 and
|y| <= 1, which the joint sensitivity below needs. A record with a non-finite value (unreachable through
the stores, which check finiteness) contributes 0 to every block, and one whose ||x||^2 overflows
contributes x = 0 (and its clipped y^2).

Joint sensitivity J = sqrt(7)/2 ~ 1.3229 (not sqrt(3)). Replace the clipped record (x, y) by (x', y');
r = ||x||, r' = ||x'||, w = <x, x'>, q = y^2, q' = y'^2, all in [0, 1] except w. In sum units (times S)
Delta_xx^2 = 2, Delta_yx^2 = 4, Delta_yy^2 = 2, and the packed triangle P has ||P(D)|| <= ||D||_F, so the
squared normalised change is
  F <= ||x x^T - x' x'^T||_F^2 / 2 + ||y x - y' x'||^2 / 4 + (q - q')^2 / 2
     = (r^4 + r'^4 - 2 w^2) / 2 + (q r^2 + q' r'^2 - 2 y y' w) / 4 + (q - q')^2 / 2.
The terms in w are -w^2 - y y' w / 2 <= q q' / 16 (maximum over all real w), and what remains increases
in r and r', so F <= g(q, q') = 1 + (q + q') / 4 + q q' / 16 + (q - q')^2 / 2. g is convex (Hessian
[[1, -15/16], [-15/16, 1]] is positive definite), so its maximum on [0, 1]^2 is at a vertex:
g(0, 0) = 1, g(1, 1) = 25/16, g(1, 0) = g(0, 1) = 7/4. Hence J = sqrt(7/4), reached by y = +-1 against
y' = 0 on orthogonal unit rows along coordinate axes (x = e_i, x' = e_j: x x^T - x' x'^T is diagonal, so
the packed triangle keeps its Frobenius norm sqrt(2)): 1 + 1/4 + 1/2.

Post-processing (data-independent): the three noised means are the blocks of the batch mean of the
(d + 1) x (d + 1) PSD matrix [x; y][x; y]^T, so the mirrored joint matrix [[xx, yx], [yx^T, yy]] is projected
to the PSD cone. That keeps xx PSD and y^2 >= 0, and more: yy >= yx^T xx^+ yx, which guarantees that the
posterior's Gamma rate b_N = b0 + (N yy - eta^T Lambda^-1 eta) / 2 stays >= b0 > 0 under noise.
"""

from __future__ import annotations

import math

import numpy as np

from privacy_wall.data.store import Batch
from privacy_wall.noise.mechanisms import clip_factors, project_psd, symmetric_from_upper, upper_triangle
from privacy_wall.queries.base import Array, Block, chunked_sums

#: Per-record L2 bounds of the three blocks (||x|| <= 1, |y| <= 1).
XX_BOUND = 1.0
YX_BOUND = 1.0
YY_BOUND = 1.0
#: Proven joint sensitivity of (xx / Delta_xx, yx / Delta_yx, yy / Delta_yy) under replace-one (module
#: docstring): sqrt(7/4), below sqrt(3).
JOINT_SENSITIVITY = math.sqrt(7.0) / 2.0


def joint_second_moment(xx: Array, yx: Array, yy: float) -> Array:
    """The (d + 1) x (d + 1) matrix [[xx, yx], [yx^T, yy]] (xx given as a full symmetric matrix)."""
    d = yx.shape[0]
    joint = np.empty((d + 1, d + 1))
    joint[:d, :d] = xx
    joint[:d, d] = yx
    joint[d, :d] = yx
    joint[d, d] = yy
    return joint


def bounded_records(batch: Batch, query: str) -> tuple[Array, Array]:
    """The batch's records clipped to the ingestion bounds ||x|| <= 1, |y| <= 1 (a no-op within them): x
    scaled by min(1, 1 / ||x||), y clipped to [-1, 1]; a record with a non-finite value becomes (0, 0) and
    one whose ||x||^2 overflows gets x = 0."""
    x, y = batch.features, batch.labels
    if y is None:
        raise ValueError(f"{query} needs labelled rows")
    with np.errstate(over="ignore", invalid="ignore"):
        finite = np.isfinite(x).all(axis=1) & np.isfinite(y)
        x = np.where(finite[:, None], x, 0.0)
        y = np.where(finite, y, 0.0)
        x = x * clip_factors(np.sqrt(np.einsum("ij,ij->i", x, x)), 1.0)[:, None]
    return x, np.clip(y, -1.0, 1.0)


def split_joint(joint: Array) -> dict[str, Array]:
    """The statistics xx, yx and yy of a (d + 1) x (d + 1) joint second moment [[xx, yx], [yx^T, yy]]."""
    d = joint.shape[0] - 1
    return {"xx": joint[:d, :d], "yx": joint[:d, d].copy(), "yy": np.array([joint[d, d]])}


class LinearRegressionQuery:
    """The wall's half of VIPS for conjugate Bayesian linear regression: clipped data statistics."""

    name = "linreg"

    def blocks(self, dimension: int) -> tuple[Block, ...]:
        return (
            Block("xx", XX_BOUND, nonnegative_or_psd=True),
            Block("yx", YX_BOUND),
            Block("yy", YY_BOUND, nonnegative_or_psd=True),
        )

    def joint_sensitivity(self, dimension: int) -> float:
        """sqrt(7)/2 < sqrt(3): the three blocks cannot all reach their bounds at once (module docstring)."""
        return JOINT_SENSITIVITY

    def validate_params(self, params: dict[str, Array], dimension: int) -> None:
        if params:
            raise ValueError(
                "linreg takes no public parameters (its E-step does not depend on the posterior)"
            )

    def clipped_sums(
        self, batch: Batch, params: dict[str, Array], rng: np.random.Generator
    ) -> dict[str, Array]:
        """Per-record clipped contributions summed chunk by chunk (base.chunked_sums)."""
        return chunked_sums(batch, lambda rows: self._chunk_sums(rows, params))

    def _chunk_sums(self, batch: Batch, params: dict[str, Array]) -> dict[str, Array]:
        del params  # independent of the posterior
        # Within the ingestion bounds ||x x^T||_F = ||x||^2 <= XX_BOUND, ||y x|| <= YX_BOUND, y^2 <= YY_BOUND.
        x, y = bounded_records(batch, self.name)
        return {
            "xx": upper_triangle(x.T @ x),
            "yx": x.T @ y,
            "yy": np.array([float(y @ y)]),
        }

    def postprocess(self, noised_means: dict[str, Array], dimension: int) -> dict[str, Array]:
        """Mirror xx and project the joint second moment [[xx, yx], [yx^T, yy]] to the PSD cone."""
        xx = symmetric_from_upper(noised_means["xx"], dimension)
        return split_joint(
            project_psd(joint_second_moment(xx, noised_means["yx"], float(noised_means["yy"][0])))
        )
