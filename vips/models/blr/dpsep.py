"""DP-SEP, public half (Vinaroz and Park, TMLR 2022, Alg. 3): the damped site update, q and its cavity.

SEP approximates the N likelihood terms by one shared Gaussian site f(w) replicated N times. With the site's
natural parameters theta_f = (eta_f, Lambda_f) (precision-times-mean, precision) and the prior
p0 = N(0, prior_variance I) (precision P0 = I / prior_variance):

  q(w)    = p0 f^N       precision P0 + N Lambda_f,        precision * mean N eta_f
  q_-1(w) = p0 f^(N-1)   precision P0 + (N - 1) Lambda_f,  precision * mean (N - 1) eta_f   (the cavity)

Each iteration t (the loop of vips.runner drives it like VIPS):

1. public_params: the cavity's mean and covariance, all the wall's moment matching needs.
2. The wall (privacy_wall.queries.dpsep) moment-matches each record of a minibatch of S records against the
   cavity, clips each site's natural parameters to norm C and releases r = (1/S) sum_n clip(theta_fn) +
   Gaussian noise (Delta = 2 C / S), the site precision part projected to PSD.
3. m_step: the damped update (Alg. 3 steps 8 and 11, as post-processing of r),
       theta_f <- (1 - gamma_t) theta_f + gamma_t r,     gamma_t = damping * rho_t,
   then Lambda_f is projected to PSD (a no-op up to rounding: both terms are PSD) so that q's precision
   stays >= P0, and theta_f is scaled to norm <= C (the paper's step 12; a no-op at sigma = 0, where theta_f
   is a convex combination of vectors of norm <= C). q and the cavity follow from theta_f.

The damping schedule: rho_t is the runner's step size (tau0 + t)^-kappa (1 in batch mode at sigma = 0), so
kappa = 0 gives the paper's constant damping gamma, and the defaults (tau0 = 0, kappa = 1, damping = 1)
make theta_f the running average of the releases (gamma_1 = 1: the prior's zero site is forgotten at
once), which averages the noise down. Because q's natural parameters are affine in theta_f, mixing
theta_f with gamma_t is the same as VIPS's mixing of q's natural parameters with rho_t. The paper's
damping gamma_p / N per datapoint corresponds to gamma = gamma_p S / N (its experiments: gamma_p = 1, so
gamma = S / N, about one pass over the data per unit of damping); why damping as post-processing of the
released batch mean is the same mechanism as the paper's noised damped update is shown in
privacy_wall.queries.dpsep.

Noise-aware mode (DpSepLogisticRegression(noise_aware=True), the default; issue 51). The steps above read
the released site as exact, and its noise, mostly on the d (d + 1) / 2 entries of the site precision, enters
q's mean multiplied by the weights: 90% intervals covered 0.2-0.6 of known weights. In this mode the wall
releases each site centred at the cavity mean (privacy_wall.queries.dpsep, "Centred release"): the sum of
the records' clipped site gradients G = sum (alpha_n - beta_n m_n) x_n and site precisions
Lambda = sum beta_n x_n x_n^T. EP's update q's natural parameters (P0 + Lambda, G + Lambda mu_c) is then the
Newton step mu_c + (P0 + Lambda)^-1 (G - P0 mu_c) with the tilted (cavity-smoothed) gradient and curvature,
and the public half takes it as VIPS-BLR takes its Laplace releases (vips.models.blr.model,
BayesianLogisticRegression with laplace_from 1): z = G + Lambda mu_c is a pseudo-observation of w,
z | w ~ N(Lambda w, Lambda + v I) with v the public noise variance of G; Lambda is SURE-thresholded and
pooled by inverse variance over the releases from the second on (the first, taken at the prior's mean,
has the curvature of w = 0, up to 4 times the mode's; pooling it shrank the covariance: coverage 0.76 at
epsilon 3 on 100 datasets, 0.89 without), the weights' prior precision alpha ~ Gamma(1, prior_variance)
(prior mean 1 / prior_variance) is learned with q(alpha), and the intercept column gets a flat prior when
the release supports it. The cavity the wall reads is q itself (one site of N removed moves it by O(1 / N);
the release's privacy holds for any public cavity). Every step reads released values, their public noise
std and N only. damping does not apply in this mode (the step replaces the damped average).

Two likelihoods:
- DpSepLogisticRegression: p(y = 1 | w) = sigmoid(w^T x); posterior documents carry "mean" and
  "covariance", so vips.models.blr.model.predict_proba predicts exactly as for VIPS-BLR.
- DpSepLinearRegression: exact sites, so at sigma = 0 with S = N and damping 1 one iteration gives the exact
  posterior; vips.models.linreg.model.predict predicts with the document's "mean", "covariance" and
  "noise_variance". Noise-aware (the default; issue 51): Normal-Gamma with the noise variance learned, the
  site (y x, x x^T, y^2) released and read as VIPS-linreg reads its statistics, the release noise
  propagated to the weights. The paper's mode: y ~ N(w^T x, noise_variance) with the noise variance known
  (1 unless given: wide intervals, 0.99-1.0 coverage at epsilon 1-3 where the truth was 0.01).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from privacy_wall.noise.mechanisms import project_psd
from privacy_wall.queries.base import Query
from privacy_wall.queries.dpsep import (
    BLOCK,
    GRADIENT_SCALE,
    DpSepLogisticQuery,
)
from vips.models.base import Array
from vips.models.blr.model import BayesianLogisticRegression, BlrState, gaussian_moments

#: The paper's clipping norm C (its experiments use C = 1).
DEFAULT_CLIP = 1.0


@dataclass(frozen=True)
class DpSepState:
    """The shared site theta_f, q and the cavity (natural parameters and moments), the N they were formed
    with (0 before any data: then f = 1 and q = cavity = prior), and the last release."""

    site_eta: Array
    site_precision: Array
    population: int
    precision: Array
    precision_times_mean: Array
    mean: Array
    covariance: Array
    cavity_mean: Array
    cavity_covariance: Array
    statistics: dict[str, Array]


def site_norm(eta: Array, precision: Array) -> float:
    """||theta_f||_2: the L2 norm of (eta, Lambda), the matrix in Frobenius norm (the wall's clip norm)."""
    return float(math.sqrt(float(eta @ eta) + float(np.sum(precision * precision))))


@dataclass(frozen=True)
class DpSepModel:
    """Shared public half of the DP-SEP models (module docstring). Subclasses provide the query."""

    prior_variance: float = 1.0
    damping: float = 1.0
    algorithm: ClassVar[str] = "dpsep"

    def _check(self) -> None:
        if not (self.prior_variance > 0 and math.isfinite(self.prior_variance)):
            raise ValueError("prior_variance must be a finite number > 0")
        if not (0 < self.damping <= 1):
            raise ValueError("damping must be in (0, 1]")

    @property
    def site_clip(self) -> float:
        """C: the bound of the wall's clipping, also applied to theta_f after each update."""
        raise NotImplementedError

    def query(self) -> Query:
        raise NotImplementedError

    def _state(
        self, site_eta: Array, site_precision: Array, population: int, statistics: dict[str, Array]
    ) -> DpSepState:
        d = site_eta.shape[0]
        prior_precision = np.eye(d) / self.prior_variance
        n = float(population)
        precision = prior_precision + n * site_precision
        precision_times_mean = n * site_eta
        mean, covariance = gaussian_moments(precision_times_mean, precision)
        cavity_n = max(n - 1.0, 0.0)
        cavity_mean, cavity_covariance = gaussian_moments(
            cavity_n * site_eta, prior_precision + cavity_n * site_precision
        )
        return DpSepState(
            site_eta,
            site_precision,
            population,
            precision,
            precision_times_mean,
            mean,
            covariance,
            cavity_mean,
            cavity_covariance,
            statistics,
        )

    def initial_state(self, dimension: int) -> DpSepState:
        """f = 1 (theta_f = 0): q and the cavity are the prior."""
        return self._state(np.zeros(dimension), np.zeros((dimension, dimension)), 0, {})

    def public_params(self, state: DpSepState) -> dict[str, Array]:
        return {"cavity_mean": state.cavity_mean.copy(), "cavity_covariance": state.cavity_covariance.copy()}

    def m_step(
        self,
        state: DpSepState,
        statistics: dict[str, Array],
        population: int,
        rho: float,
        noise_std: Mapping[str, float] | None = None,
    ) -> DpSepState:
        """theta_f <- (1 - gamma) theta_f + gamma r with gamma = damping * rho; PSD projection; clip to C."""
        released_eta = np.asarray(statistics["precision_times_mean"], dtype=np.float64)
        released_precision = np.asarray(statistics["precision"], dtype=np.float64)
        d = state.site_eta.shape[0]
        if released_eta.shape != (d,) or released_precision.shape != (d, d):
            raise ValueError(f"the released site must have a ({d},) and a {d}x{d} part")
        gamma = self.damping * rho
        eta = (1.0 - gamma) * state.site_eta + gamma * released_eta
        precision = project_psd((1.0 - gamma) * state.site_precision + gamma * released_precision)
        factor = min(1.0, self.site_clip / max(site_norm(eta, precision), np.finfo(np.float64).tiny))
        released = {"precision_times_mean": released_eta, "precision": released_precision}
        return self._state(factor * eta, factor * precision, population, released)

    def _document(self, state: DpSepState) -> dict[str, Any]:
        second_moment = state.covariance + np.outer(state.mean, state.mean)
        return {
            "natural_parameters": {
                "precision_times_mean": state.precision_times_mean.tolist(),
                "precision": state.precision.tolist(),
                "site_precision_times_mean": state.site_eta.tolist(),
                "site_precision": state.site_precision.tolist(),
                "expected_w": state.mean.tolist(),
                "expected_neg_half_wwT": (-0.5 * second_moment).tolist(),
            },
            "sufficient_statistics": {k: v.tolist() for k, v in state.statistics.items()},
            "variational_parameters": {
                "mean": state.mean.tolist(),
                "covariance": state.covariance.tolist(),
                "population": state.population,
                "prior_variance": self.prior_variance,
                "damping": self.damping,
                "clip": self.site_clip,
            },
            "mean": state.mean.tolist(),
            "covariance": state.covariance.tolist(),
        }

    def posterior(self, state: DpSepState) -> dict[str, Any]:
        return self._document(state)


@dataclass(frozen=True)
class DpSepLogisticRegression(DpSepModel):
    """DP-SEP for Bayesian logistic regression, w ~ N(0, prior_variance I); clip is the paper's C.
    noise_aware (default): centred releases and the noise-aware Newton step (module docstring; the prior
    variance then the mean of a learned one); False: the paper's damped site average. intercept: the column
    of the constant intercept (noise-aware mode; vips.models.blr.model), None for none."""

    clip: float = DEFAULT_CLIP
    noise_aware: bool = True
    intercept: int | None = 0
    name: str = "blr"

    def __post_init__(self) -> None:
        self._check()
        if not (self.clip > 0 and math.isfinite(self.clip)):
            raise ValueError("clip must be a finite number > 0")
        if self.noise_aware and self.damping != 1.0:
            raise ValueError("damping weighs the paper's damped site average: it needs noise_aware False")

    @property
    def site_clip(self) -> float:
        return float(self.clip)

    def query(self) -> DpSepLogisticQuery:
        """The wall's query that pairs with this model."""
        return DpSepLogisticQuery(self.clip, centred=self.noise_aware)

    @property
    def newton(self) -> BayesianLogisticRegression:
        """The noise-aware step's model: Newton steps from every release, H pooled from the second."""
        return BayesianLogisticRegression(
            a0=1.0, b0=self.prior_variance, laplace_from=1, pool_from=2, intercept=self.intercept
        )

    def initial_state(self, dimension: int) -> Any:
        if self.noise_aware:
            return self.newton.initial_state(dimension)
        return super().initial_state(dimension)

    def public_params(self, state: Any) -> dict[str, Array]:
        if isinstance(state, BlrState):
            return {"cavity_mean": state.mean.copy(), "cavity_covariance": state.covariance.copy()}
        return super().public_params(state)

    def m_step(
        self,
        state: Any,
        statistics: dict[str, Array],
        population: int,
        rho: float,
        noise_std: Mapping[str, float] | None = None,
    ) -> Any:
        """The damped site average, or in noise-aware mode VIPS-BLR's Newton step with its statistics
        named as that model names them: s1 = G / 2 (its g / 2), s2 = Lambda, each with its noise std."""
        if not isinstance(state, BlrState):
            return super().m_step(state, statistics, population, rho, noise_std)
        released = float((noise_std or {}).get(BLOCK, 0.0))  # std of the released site mean's entries
        gradient = np.asarray(statistics["gradient"], dtype=np.float64)
        laplace = {"s1": gradient / 2.0, "s2": np.asarray(statistics["precision"], dtype=np.float64)}
        noise = {"s1": released / GRADIENT_SCALE / 2.0, "s2": released}
        return self.newton.m_step(state, laplace, population, rho, noise)

    def posterior(self, state: Any) -> dict[str, Any]:
        if not isinstance(state, BlrState):
            return super().posterior(state)
        document = self.newton.posterior(state)
        document["sufficient_statistics"] = {
            "gradient": (2.0 * np.asarray(state.statistics["s1"])).tolist(),
            "precision": np.asarray(state.statistics["s2"]).tolist(),
        }
        document["variational_parameters"].update(
            prior_variance=self.prior_variance, clip=self.site_clip, noise_aware=True
        )
        return document
