"""DPVI for Bayesian logistic regression behind the wall: clipped per-example ELBO gradients
(Jalko, Dikmen, Honkela, UAI 2017, Alg. 1).

Model: p(y = 1 | x, w) = sigmoid(w^T x), w ~ N(0, prior_variance I). Variational family (mean-field
Gaussian, the paper's xi): q(w) = N(mean, diag(exp(2 log_std))), reparameterised as
w_j = mean + exp(log_std) * eps_j with eps_j ~ N(0, I), j = 1..draws.

Public parameters (all drawn or computed outside the wall, none depends on data):
  mean     (d,)          the variational mean
  log_std  (d,)          the variational log standard deviations
  eps      (draws, d)    the reparameterisation noise of this iteration; standard normal, drawn by the
                         public half (vips.models.blr.dpvi) from its public generator
Per record n (x_n, y_n), with r_nj = y_n - sigmoid(x_n^T w_j) (d/dz log p(y | z) = y - sigmoid(z)):
  g_n = (1/draws) sum_j ( r_nj x_n,  r_nj x_n * exp(log_std) * eps_j )        (2d,)
the Monte Carlo (reparameterisation) gradient of the record's data term E_q[log p(y_n | x_n, w)] with
respect to (mean, log_std). The paper's per-example term L_i also carries -KL(q || p) / N; that part is
the same for every record and depends on public values only, so it is added outside the wall (in the
M-step) instead of being clipped with the data term. That changes nothing for privacy and removes a
distortion: clipping would otherwise shrink the prior's pull whenever a record's gradient is clipped.

Each g_n is clipped to L2 norm `clip` (c_t of the paper, constant here) and the clipped vectors are
summed: one block "gradient" (2d,), mean part first, with per-record bound C = clip and general sign, so
under replace-one Delta = 2 clip / S (docs/design.md section 2; the paper's sensitivity 2 c_t of the sum).
Post-processing is the identity.

Bounds: with ||x|| <= 1 and |r| <= 1 the mean part has norm <= 1, so clip >= 1 never touches it; the
log_std part is at most max_i exp(log_std_i) |mean_j eps_ji| and is not bounded by the ingestion bounds
alone: clipping is what makes the sensitivity hold.

Numerics: every record's contribution is finite for any finite public parameters and any finite record.
A logit x^T w that is NaN (inf - inf after an overflow) is read as 0; a record whose gradient still has a
non-finite entry (only possible when exp(log_std) or the products overflow) contributes 0; norms are
computed after scaling each vector by its largest entry, so large finite gradients are clipped rather
than overflowing to an infinite norm. Each of these is a function of the record alone, so the
per-record bound, and hence Delta, holds whatever the data. Floating-point warnings are silenced where
overflow is expected, so that no data-dependent warning leaves the wall.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.special import expit

from privacy_wall.data.store import Batch
from privacy_wall.queries.base import Array, Block, chunked_sums

BLOCK = "gradient"
PARAMS = ("mean", "log_std", "eps")


def per_example_gradients(x: Array, y: Array, mean: Array, log_std: Array, eps: Array) -> Array:
    """Unclipped reparameterised gradients of E_q[log p(y_n | x_n, w)] w.r.t. (mean, log_std), per record.

    Parameters
    ----------
    x : (S, d) features;  y : (S,) labels in {0, 1};  mean, log_std : (d,);  eps : (draws, d).

    Returns
    -------
    (S, 2d): row n is (mean part, log_std part) of g_n, averaged over the draws (module docstring).
    Entries may be non-finite for extreme inputs; `clip_rows` deals with that.
    """
    draws = eps.shape[0]
    with np.errstate(all="ignore"):  # overflow is handled by clip_rows; no warning leaves the wall
        std = np.exp(log_std)
        weights = mean + std * eps  # (draws, d): w_j
        logits = x @ weights.T  # (S, draws): x_n^T w_j
        logits = np.where(np.isnan(logits), 0.0, logits)
        residuals = y[:, None] - expit(logits)  # (S, draws): r_nj
        mean_part = x * (residuals.sum(axis=1) / draws)[:, None]
        log_std_part = x * ((residuals @ eps) / draws) * std  # sum_j r_nj eps_j, times exp(log_std)
        return np.concatenate([mean_part, log_std_part], axis=1)


def clip_rows(vectors: Array, bound: float) -> Array:
    """Each row scaled to L2 norm <= bound; rows with a non-finite entry become 0.

    The norm is taken after dividing the row by its largest absolute entry, so it never overflows.
    """
    finite = np.isfinite(vectors).all(axis=1, keepdims=True)
    rows = np.where(finite, vectors, 0.0)
    peak = np.max(np.abs(rows), axis=1)
    scale = np.where(peak > 0, peak, 1.0)
    unit_norms = np.linalg.norm(rows / scale[:, None], axis=1)  # in [1, sqrt(2d)] for non-zero rows
    with np.errstate(all="ignore"):  # bound / scale may overflow to inf for subnormal rows: factor 1
        factors = np.minimum(1.0, (bound / scale) / np.maximum(unit_norms, 1.0))
        clipped: Array = rows * factors[:, None]
    return clipped


class DpviLogisticRegressionQuery:
    """The wall's half of DPVI for logistic regression: clipped per-example ELBO gradients.

    Parameters (public): clip, the per-record L2 bound c_t (> 0, finite); draws, the number of Monte Carlo
    draws of w per iteration (the rows of the public parameter eps).
    """

    name = "dpvi"

    def __init__(self, clip: float, draws: int = 1) -> None:
        if isinstance(clip, bool) or not isinstance(clip, int | float) or not (0 < clip < math.inf):
            raise ValueError("clip must be a finite number > 0")
        if isinstance(draws, bool) or not isinstance(draws, int) or draws < 1:
            raise ValueError("draws must be an integer >= 1")
        self.clip = float(clip)
        self.draws = draws

    def blocks(self, dimension: int) -> tuple[Block, ...]:
        return (Block(BLOCK, self.clip),)

    def validate_params(self, params: dict[str, Array], dimension: int) -> None:
        if set(params) != set(PARAMS):
            raise ValueError("dpvi takes exactly the public parameters mean, log_std and eps")
        shapes = {"mean": (dimension,), "log_std": (dimension,), "eps": (self.draws, dimension)}
        for name, shape in shapes.items():
            value = np.asarray(params[name])
            real = np.issubdtype(value.dtype, np.floating) or np.issubdtype(value.dtype, np.integer)
            if value.shape != shape or not real:
                raise ValueError(f"{name} must be a real array of shape {shape}")
            if not np.isfinite(value).all():
                raise ValueError(f"{name} must be finite")

    def clipped_sums(
        self, batch: Batch, params: dict[str, Array], rng: np.random.Generator
    ) -> dict[str, Array]:
        """Per-record clipped contributions summed chunk by chunk (base.chunked_sums)."""
        return chunked_sums(batch, lambda rows: self._chunk_sums(rows, params))

    def _chunk_sums(self, batch: Batch, params: dict[str, Array]) -> dict[str, Array]:
        x, y = batch.features, batch.labels
        if y is None:
            raise ValueError("dpvi needs labelled rows")
        mean = np.asarray(params["mean"], dtype=np.float64)
        log_std = np.asarray(params["log_std"], dtype=np.float64)
        eps = np.asarray(params["eps"], dtype=np.float64)
        clipped = clip_rows(per_example_gradients(x, y, mean, log_std, eps), self.clip)
        return {BLOCK: clipped.sum(axis=0)}

    def postprocess(self, noised_means: dict[str, Array], dimension: int) -> dict[str, Array]:
        return {BLOCK: noised_means[BLOCK]}
