"""Bayesian logistic regression, public half (VIPS paper Sec. 6, Eq. 53-55).

Prior w ~ N(0, alpha^-1 I), alpha ~ Gamma(a0, b0). From released batch means (s1, s2):
  nu_hat = (N s1, N s2 + E[alpha] I)       natural parameters (precision * mean, precision)
  nu_t   = (1 - rho_t) nu_{t-1} + rho_t nu_hat
  Sigma = nu2^-1, mu = Sigma nu1; q(alpha) = Gamma(a0 + d/2, b0 + (mu^T mu + tr Sigma) / 2)
Expected natural parameters for the next E-step: E[w] = mu, E[w w^T] = Sigma + mu mu^T.
Prediction (probit approximation): p(y=1|x) ~= sigmoid(mu^T x / sqrt(1 + pi x^T Sigma x / 8)).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.special import expit

from worker.models.base import Array


@dataclass(frozen=True)
class BlrState:
    nu1: Array
    nu2: Array
    mean: Array
    covariance: Array
    alpha_shape: float
    alpha_rate: float
    statistics: dict[str, Array]

    @property
    def expected_alpha(self) -> float:
        return self.alpha_shape / self.alpha_rate


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


@dataclass(frozen=True)
class BayesianLogisticRegression:
    """VIPS-BLR with hyperprior Gamma(a0, b0) on the prior precision."""

    a0: float = 1.0
    b0: float = 1.0
    name: str = "blr"

    def initial_state(self, dimension: int) -> BlrState:
        alpha = self.a0 / self.b0
        nu1 = np.zeros(dimension)
        nu2 = alpha * np.eye(dimension)
        mean, covariance = gaussian_moments(nu1, nu2)
        return BlrState(nu1, nu2, mean, covariance, self.a0, self.b0, {})

    def public_params(self, state: BlrState) -> dict[str, Array]:
        return {"second_moment": state.covariance + np.outer(state.mean, state.mean)}

    def m_step(self, state: BlrState, statistics: dict[str, Array], population: int, rho: float) -> BlrState:
        s1, s2 = statistics["s1"], statistics["s2"]
        dimension = s1.shape[0]
        nu1_hat = population * s1
        nu2_hat = population * s2 + state.expected_alpha * np.eye(dimension)
        nu1 = (1 - rho) * state.nu1 + rho * nu1_hat
        nu2 = (1 - rho) * state.nu2 + rho * nu2_hat
        mean, covariance = gaussian_moments(nu1, nu2)
        shape = self.a0 + dimension / 2
        rate = self.b0 + (float(mean @ mean) + float(np.trace(covariance))) / 2
        return BlrState(nu1, nu2, mean, covariance, shape, rate, {"s1": s1, "s2": s2})

    def posterior(self, state: BlrState) -> dict[str, Any]:
        second_moment = state.covariance + np.outer(state.mean, state.mean)
        return {
            "natural_parameters": {
                "precision_times_mean": state.nu1.tolist(),
                "precision": state.nu2.tolist(),
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
