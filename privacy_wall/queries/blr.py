"""Bayesian logistic regression's E-step (VIPS paper Alg. 5) with Polya-Gamma augmentation, and the
curvature release at a point (Laplace mode).

Polya-Gamma mode (params {"second_moment": M}, M = E[w w^T] public): for each record
c_n = sqrt(x_n^T M x_n) and E[xi_n] = tanh(c_n / 2) / (2 c_n) (1/4 at c_n = 0). Blocks:
  s1 = sum_n (y_n - 1/2) x_n            per-record bound C = 1/2 (||x|| <= 1), general: Delta = 1/S
  s2 = sum_n E[xi_n] x_n x_n^T           per-record bound C = 1/4 (Frobenius), PSD: Delta = sqrt(2)/(4S)
Laplace mode (params {"mean": m}, a public point): with p_n = sigmoid(x_n^T m),
  s1 = sum_n (y_n - p_n) / 2 x_n         (half the log-likelihood's gradient at m; |y - p| / 2 < 1/2)
  s2 = sum_n p_n (1 - p_n) x_n x_n^T     (minus its Hessian at m; p (1 - p) <= 1/4)
the same blocks with the same bounds: each record's coefficients stay in the ranges the proof below uses,
so the sensitivity and every statement about the blocks hold unchanged (vips.models.blr.model takes a Newton
step from these and reads the Laplace approximation's covariance from them).
A smaller gradient bound (LogisticRegressionQuery(gradient_bound=A), A < 1/2; VIPS-BLR's option
gradient_bound, issue 51) clips each record's s1 term to norm A: the s1 block's bound, and so its noise,
is A instead of 1/2 (records whose |y - p| ||x|| / 2 exceeds A, the confidently misclassified, are scaled
down: DP-SGD's trade of bias for noise). Everything below holds for any bounds: in units of each block's
sensitivity the two brackets are a^2 + a'^2 - 2 a a' c over (2 A)^2 and b^2 + b'^2 - 2 b b' c^2 over
2 B^2, so with a / A and b / B in place of 2 a and 4 b the maximisation is the same and J = 5/4 for
every A (and B = 1/4). At the point w = 0 (p = 1/2) no record is clipped for A >= 1/4.
s2 is released as its packed upper triangle (whose L2 norm is at most the Frobenius norm), mirrored and
projected to PSD afterwards (Analyze Gauss).

Joint sensitivity J = 5/4 (not sqrt(2)): s1 and s2 cannot both reach their bounds on one replacement.
After clipping, a record contributes (a u, b u u^T) with u a unit vector (x's direction; any u if x = 0),
|a| <= 1/2 and 0 <= b <= 1/4 (in either mode); this holds for every record, in bounds or not. Replace
(a, b, u) by (a', b', v), c = <u, v>. In sum units (times S) Delta_1 = 1 and Delta_2^2 = 1/8, and the
packed triangle P satisfies ||P(D)||^2 = (||D||_F^2 + sum_i D_ii^2) / 2 <= ||D||_F^2, so the squared
normalised change is
  F <= ||a u - a' v||^2 + 8 ||b u u^T - b' v v^T||_F^2
     = (a^2 + a'^2 - 2 a a' c) + 8 (b^2 + b'^2 - 2 b b' c^2).
Both brackets are convex quadratic forms (|c| <= 1), in (a, a') and in (b, b'), so F is maximised at a
vertex of the box: |a| = |a'| = 1/2 with a a' c <= 0 gives (1 + |c|) / 2 (zeroing a or a' gives at most
1/4); b = b' = 1/4 gives 1 - c^2, one of them 0 gives at most 1/2. Hence
  F <= max((1 + |c|)/2 + 1 - c^2, (1 + |c|)/2 + 1/2) <= max(25/16, 3/2) = 25/16,
as |c|/2 - c^2 <= 1/16 (equality at |c| = 1/4). J = 5/4, and it is reached: unit rows at cosine c = +-1/4
(labels differ when c > 0, agree when c < 0), both E[xi] = 1/4 (e.g. x^T M x = 0), and D diagonal in the
coordinates (x = (cos t, sin t, 0), x' = (sin t, cos t, 0) with sin 2t = +-1/4 give D = diag(cos 2t,
-cos 2t, 0) b), so that the packed triangle keeps D's Frobenius norm. (Orthogonal rows give only sqrt(1.5).)
"""

from __future__ import annotations

import numpy as np
from scipy.linalg.blas import dsyrk
from scipy.special import expit

from privacy_wall.data.store import Batch
from privacy_wall.noise.mechanisms import clip_factors, project_psd, symmetric_from_upper, upper_triangle
from privacy_wall.queries.base import Array, Block, chunked_sums

#: s1's per-record bound without a gradient bound: |y - 1/2| ||x|| <= 1/2 and |y - p| ||x|| / 2 < 1/2.
S1_BOUND = 0.5
S2_BOUND = 0.25
#: Proven joint sensitivity of (s1 / Delta_1, s2 / Delta_2) under replace-one (module docstring).
JOINT_SENSITIVITY = 1.25


def polya_gamma_mean(c: Array) -> Array:
    """E[xi] for xi ~ PG(1, c): tanh(c/2) / (2c), continuous at 0 with value 1/4."""
    c = np.abs(c)
    small = c < 1e-6
    safe = np.where(small, 1.0, c)
    return np.where(small, 0.25 - c * c / 48.0, np.tanh(safe / 2.0) / (2.0 * safe))


class LogisticRegressionQuery:
    """The wall's half of VIPS-BLR."""

    name = "blr"

    def __init__(self, gradient_bound: float = S1_BOUND) -> None:
        """gradient_bound: s1's per-record bound A in (0, 1/2] (module docstring; 1/2 clips nothing)."""
        if isinstance(gradient_bound, bool) or not (0 < gradient_bound <= S1_BOUND):
            raise ValueError(f"gradient_bound must be in (0, {S1_BOUND}]")
        self.gradient_bound = float(gradient_bound)

    def blocks(self, dimension: int) -> tuple[Block, ...]:
        return (Block("s1", self.gradient_bound), Block("s2", S2_BOUND, nonnegative_or_psd=True))

    def joint_sensitivity(self, dimension: int) -> float:
        """5/4 < sqrt(2): s1 and s2 cannot both reach their bounds on one replacement (module docstring)."""
        return JOINT_SENSITIVITY

    def validate_params(self, params: dict[str, Array], dimension: int) -> None:
        if set(params) == {"mean"}:
            mean = params["mean"]
            if mean.shape != (dimension,) or not np.isfinite(mean).all():
                raise ValueError(f"mean must be a finite vector of length {dimension}")
            return
        if set(params) != {"second_moment"}:
            raise ValueError("blr takes exactly one public parameter: second_moment, or mean (Laplace mode)")
        moment = params["second_moment"]
        if moment.shape != (dimension, dimension) or not np.isfinite(moment).all():
            raise ValueError(f"second_moment must be a finite {dimension}x{dimension} matrix")

    def clipped_sums(
        self, batch: Batch, params: dict[str, Array], rng: np.random.Generator
    ) -> dict[str, Array]:
        """Per-record clipped contributions summed chunk by chunk (base.chunked_sums); s2's chunks are
        summed as upper triangles (the lower is never computed) and packed once."""
        sums = chunked_sums(batch, lambda rows: self._chunk_sums(rows, params))
        return {"s1": sums["s1"], "s2": upper_triangle(sums["s2"])}

    def _chunk_sums(self, batch: Batch, params: dict[str, Array]) -> dict[str, Array]:
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
            sq_norms = np.einsum("ij,ij->i", x, x)
            if "mean" in params:
                # Laplace mode. A NaN activation (inf - inf) would make a NaN release: take p = 1/2 there,
                # which keeps both coefficients in range (as any p in [0, 1] does).
                activation = x @ params["mean"]
                p = expit(np.where(np.isnan(activation), 0.0, activation))
                centred = (y - p) / 2.0
                xi = p * (1.0 - p)
            else:
                moment = params["second_moment"]
                quad = np.einsum("ij,ij->i", x @ moment, x)  # x_n^T E[w w^T] x_n
                # Overflow (inf - inf, 0 * inf) must not turn a record into NaN: a NaN release is a data-
                # dependent signal no noise hides. Any E[xi] in [0, 1/4] keeps the bound; treat it as
                # c = inf (E[xi] = 0).
                quad = np.where(np.isnan(quad), np.inf, quad)
                xi = polya_gamma_mean(np.sqrt(np.maximum(quad, 0.0)))
                centred = y - 0.5

            s1_weights = centred * clip_factors(np.abs(centred) * np.sqrt(sq_norms), self.gradient_bound)
            s2_weights = xi * clip_factors(xi * sq_norms, S2_BOUND)  # ||xi x x^T||_F = xi ||x||^2
            s1 = x.T @ s1_weights
            # sum_n w_n x_n x_n^T (w_n >= 0) as the rank-S update (sqrt(w) x)^T (sqrt(w) x): BLAS syrk
            # fills only the upper triangle, half the products of (w x)^T x; upper_triangle packs it.
            scaled = x * np.sqrt(s2_weights)[:, None]
            s2 = dsyrk(1.0, scaled.T, trans=0, lower=0)
        return {"s1": s1, "s2": s2}

    def postprocess(self, noised_means: dict[str, Array], dimension: int) -> dict[str, Array]:
        s2 = project_psd(symmetric_from_upper(noised_means["s2"], dimension))
        return {"s1": noised_means["s1"], "s2": s2}
