"""Bayesian logistic regression, public half (VIPS paper Sec. 6, Eq. 53-55), with a noise-aware M-step.

Prior w ~ N(0, alpha^-1 I), alpha ~ Gamma(a0, b0). From released batch means (s1, s2) the paper's M-step
averages the natural parameters with rho_t:
  z_t = (1 - rho_t) z_{t-1} + rho_t N s1        H_t = (1 - rho_t) H_{t-1} + rho_t N s2
  a_t = (1 - rho_t) a_{t-1} + rho_t E[alpha]    (so nu1 = z, nu2 = H + a I as in Eq. 53)
and takes q(w) = N(nu2^-1 nu1, nu2^-1). The release of s1 carries Gaussian noise of known std sigma_1 per
coordinate, so z = N s1 + eta with eta ~ N(0, v I), v_t = (1 - rho_t)^2 v_{t-1} + rho_t^2 (N sigma_1)^2.
Under the M-step's own quadratic (Polya-Gamma) likelihood, N s1 = H w + e with e ~ N(0, H); adding eta,
z | w ~ N(H w, H + v I). The posterior of w under the prior N(0, a^-1 I) given z is then, in the
eigenbasis H = V diag(h) V^T,
  precision  a + h^2 / (h + v)        mean  (h / (h + v)) (V^T z) / (a + h^2 / (h + v)),
which is the paper's update for v = 0 and shrinks the directions the noise dominates (h << v) toward the
prior instead of amplifying the noise by 1/a there (noise_aware=False keeps the paper's update).
q(alpha) = Gamma(a0 + d/2, b0 + (mu^T mu + tr Sigma) / 2). Every step is post-processing of released
values and their public noise std (bench/README.md, "BLR accuracy", measures the gain).
Expected natural parameters for the next E-step: E[w] = mu, E[w w^T] = Sigma + mu mu^T.
Prediction (probit approximation): p(y=1|x) ~= sigmoid(mu^T x / sqrt(1 + pi x^T Sigma x / 8)).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.special import expit

from worker.models.base import Array


@dataclass(frozen=True)
class BlrState:
    """Averaged natural parameters (z = nu1, H + prior_term I = nu2), the noise variance v of z, and q."""

    nu1: Array
    data_precision: Array
    prior_term: float
    nu1_noise_variance: float
    mean: Array
    covariance: Array
    alpha_shape: float
    alpha_rate: float
    statistics: dict[str, Array]

    @property
    def expected_alpha(self) -> float:
        return self.alpha_shape / self.alpha_rate

    @property
    def nu2(self) -> Array:
        precision: Array = self.data_precision + self.prior_term * np.eye(self.nu1.shape[0])
        return precision


def _cholesky(precision: Array) -> Array:
    """Cholesky factor of a precision matrix, adding the smallest jitter (relative 1e-12 to 1e-6) that
    rounding errors of a PSD projection may need; the prior term keeps precisions positive definite."""
    scale = max(float(np.trace(precision)) / precision.shape[0], np.finfo(np.float64).tiny)
    identity = np.eye(precision.shape[0])
    for relative in (0.0, 1e-12, 1e-9, 1e-6):
        try:
            factor: Array = np.linalg.cholesky(precision + relative * scale * identity)
            return factor
        except np.linalg.LinAlgError:
            continue
    raise np.linalg.LinAlgError("the posterior precision is not positive definite")


def gaussian_moments(nu1: Array, nu2: Array) -> tuple[Array, Array]:
    """(mean, covariance) = (nu2^-1 nu1, nu2^-1) of a Gaussian with precision nu2 and precision-times-mean
    nu1, through a (jittered if need be) Cholesky factor."""
    chol = _cholesky(nu2)
    identity = np.eye(nu2.shape[0])
    inv_chol = np.linalg.solve(chol, identity)
    covariance = inv_chol.T @ inv_chol
    return covariance @ nu1, covariance


def noise_aware_moments(
    z: Array, data_precision: Array, prior_precision: float, noise_variance: float
) -> tuple[Array, Array]:
    """(mean, covariance) of w ~ N(0, a^-1 I) given z | w ~ N(H w, H + v I) (module docstring):
    per eigenpair (h, u) of H, precision a + h^2 / (h + v) and mean (h / (h + v)) u^T z / precision."""
    symmetric = (data_precision + data_precision.T) / 2.0
    eigenvalues, vectors = np.linalg.eigh(symmetric)
    h = np.maximum(eigenvalues, 0.0)  # H is PSD (an average of PSD releases); clear rounding below 0
    denominator = h + noise_variance
    safe = np.where(denominator > 0, denominator, 1.0)
    gain = np.where(denominator > 0, h / safe, 0.0)
    precision = prior_precision + gain * h
    mean: Array = vectors @ (gain * (vectors.T @ z) / precision)
    covariance: Array = (vectors / precision) @ vectors.T
    return mean, covariance


@dataclass(frozen=True)
class BayesianLogisticRegression:
    """VIPS-BLR with hyperprior Gamma(a0, b0) on the prior precision; noise_aware: the M-step that knows
    s1's noise (module docstring; False is the paper's Eq. 53-55)."""

    a0: float = 1.0
    b0: float = 1.0
    noise_aware: bool = True
    name: str = "blr"

    def initial_state(self, dimension: int) -> BlrState:
        alpha = self.a0 / self.b0
        nu1 = np.zeros(dimension)
        mean, covariance = gaussian_moments(nu1, alpha * np.eye(dimension))
        zeros = np.zeros((dimension, dimension))
        return BlrState(nu1, zeros, alpha, 0.0, mean, covariance, self.a0, self.b0, {})

    def public_params(self, state: BlrState) -> dict[str, Array]:
        return {"second_moment": state.covariance + np.outer(state.mean, state.mean)}

    def m_step(
        self,
        state: BlrState,
        statistics: dict[str, Array],
        population: int,
        rho: float,
        noise_std: Mapping[str, float] | None = None,
    ) -> BlrState:
        s1, s2 = statistics["s1"], statistics["s2"]
        dimension = s1.shape[0]
        nu1 = (1 - rho) * state.nu1 + rho * population * s1
        data_precision = (1 - rho) * state.data_precision + rho * population * s2
        prior_term = (1 - rho) * state.prior_term + rho * state.expected_alpha
        sigma_1 = 0.0 if noise_std is None else float(noise_std.get("s1", 0.0))
        noise_variance = (1 - rho) ** 2 * state.nu1_noise_variance + (rho * population * sigma_1) ** 2
        if self.noise_aware and noise_variance > 0:
            mean, covariance = noise_aware_moments(nu1, data_precision, prior_term, noise_variance)
        else:
            mean, covariance = gaussian_moments(nu1, data_precision + prior_term * np.eye(dimension))
        shape = self.a0 + dimension / 2
        rate = self.b0 + (float(mean @ mean) + float(np.trace(covariance))) / 2
        return BlrState(
            nu1,
            data_precision,
            prior_term,
            noise_variance,
            mean,
            covariance,
            shape,
            rate,
            {"s1": s1, "s2": s2},
        )

    def posterior(self, state: BlrState) -> dict[str, Any]:
        second_moment = state.covariance + np.outer(state.mean, state.mean)
        # q's own natural parameters (with the noise-aware step they differ from the averaged nu1, nu2).
        precision = np.linalg.inv(state.covariance)
        precision = (precision + precision.T) / 2.0
        return {
            "natural_parameters": {
                "precision_times_mean": (precision @ state.mean).tolist(),
                "precision": precision.tolist(),
                "expected_w": state.mean.tolist(),
                "expected_neg_half_wwT": (-0.5 * second_moment).tolist(),
            },
            "sufficient_statistics": {k: v.tolist() for k, v in state.statistics.items()},
            "variational_parameters": {
                "mean": state.mean.tolist(),
                "covariance": state.covariance.tolist(),
                "alpha_shape": state.alpha_shape,
                "alpha_rate": state.alpha_rate,
            },
            "mean": state.mean.tolist(),
            "covariance": state.covariance.tolist(),
        }


def predict_proba(mean: Array, covariance: Array, features: Array) -> Array:
    """P(y = 1 | x) under the probit approximation of the logistic-Gaussian integral."""
    activation = features @ mean
    variance = np.einsum("ij,ij->i", features @ covariance, features)
    return np.asarray(expit(activation / np.sqrt(1.0 + np.pi * variance / 8.0)))
