"""Conjugate Bayesian linear regression, public half (VIPS for a conjugate-exponential model).

Model (Normal-Gamma): y_n = w^T x_n + e_n, e_n ~ N(0, 1/tau), tau ~ Gamma(a0, b0) (shape, rate),
w | tau ~ N(0, (tau lambda0)^-1 I) with lambda0 = `prior_precision`. The posterior is Normal-Gamma again:
q(w, tau) = N(w; m, (tau Lambda)^-1) Gamma(tau; a, b), and in the natural parametrisation (Lambda, eta, c, a)
of the density

    q(w, tau) propto tau^(a - 1 + d/2) exp(-tau/2 w^T Lambda w + tau w^T eta - tau c / 2)

(eta = Lambda m, c = 2 b + m^T Lambda m) the posterior is prior + data, linear in the data statistics. From
the released batch means (xx = <x x^T>, yx = <y x>, yy = <y^2>; privacy_wall.queries.linreg):

  nu_hat = (lambda0 I + N xx,  N yx,  2 b0 + N yy,  a0 + N/2)       (Lambda, eta, c, a)
  nu_t   = (1 - rho_t) nu_{t-1} + rho_t nu_hat
  m = Lambda^-1 eta,   b = (c - eta^T m) / 2

At sigma = 0 in batch mode (S = N, rho = 1) one iteration gives the exact posterior (there are no latent
variables, so VIPS's E-step does not depend on q and its fixed point is reached at once). The wall projects
[[xx, yx], [yx^T, yy]] to the PSD cone, which keeps b >= b0 > 0; a convex combination of such natural
parameters keeps it too (eta^T Lambda^-1 eta is jointly convex in (eta, Lambda)).

Marginals: E[tau] = a / b, E[1/tau] = b / (a - 1); w is Student-t with 2a degrees of freedom, location m and
scale matrix (b / a) Lambda^-1, so Cov(w) = b / (a - 1) Lambda^-1 (for a > 1). Predictive distribution of a
new y at x: Student-t with mean m^T x and variance E[1/tau] (1 + x^T Lambda^-1 x) = E[1/tau] + x^T Cov(w) x.

The release noise (issue 51). The released Lambda and eta carry Gaussian noise of public std: per entry
s_L = N sigma_xx on the packed triangle of N xx (a symmetric E) and s_e = N sigma_yx per coordinate of N yx
(e); the rho-average carries sum_t w_t^2 s_t^2 of each. The posterior above treats them as exact, so at
epsilon 1 its 90% intervals covered 28% of known weights (bench/calibration.py) while its means were
unbiased. To first order m - m* = Lambda^-1 (e - E m*), whose covariance is
    C = Lambda^-1 (s_e^2 I + s_L^2 (|m|^2 I + m m^T - diag(m * m))) Lambda^-1
(Cov(E m)_ik = s_L^2 sum_{j, l: {i,j} = {k,l}} m_j m_l), with m's second moments E[w w^T] = m m^T + Cov(w)
in place of m m^T. Cov(w) reported is b / (a - 1) Lambda^-1 + C: the delta method's propagation of the
statistics' known noise into the posterior, a post-processing of released values and public stds. C = 0
at sigma 0.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from privacy_wall.queries.linreg import LinearRegressionQuery
from vips.models.base import Array
from vips.models.blr.model import gaussian_moments


@dataclass(frozen=True)
class LinregState:
    """Natural parameters (Lambda, eta, c, a) of q(w, tau), its moments, and the last release."""

    precision_scale: Array  # Lambda: the precision of w given tau is tau Lambda
    precision_times_mean: Array  # eta = Lambda m
    scaled_sum_of_squares: float  # c = 2 b + m^T Lambda m
    noise_shape: float  # a
    mean: Array  # m
    scale_inverse: Array  # Lambda^-1
    noise_rate: float  # b
    statistics: dict[str, Array]
    #: Noise variance per entry of the averaged N xx and per coordinate of the averaged N yx (release noise).
    precision_noise_variance: float = 0.0
    eta_noise_variance: float = 0.0

    @property
    def noise_variance(self) -> float:
        """E[1/tau] = b / (a - 1) (a > 1); for a <= 1 it is infinite and b / a (the scale) is returned."""
        a, b = self.noise_shape, self.noise_rate
        return b / (a - 1.0) if a > 1.0 else b / a

    @property
    def covariance(self) -> Array:
        """Cov(w) = E[1/tau] Lambda^-1 (the Student-t scale matrix (b / a) Lambda^-1 when a <= 1), plus the
        release noise's propagated covariance C (module docstring)."""
        covariance: Array = self.noise_variance * self.scale_inverse
        if self.precision_noise_variance > 0.0 or self.eta_noise_variance > 0.0:
            second = np.outer(self.mean, self.mean) + covariance  # E[w w^T] under the exact-data posterior
            middle = self.precision_noise_variance * (
                np.trace(second) * np.eye(len(self.mean)) + second - np.diag(np.diag(second))
            )
            middle += self.eta_noise_variance * np.eye(len(self.mean))
            propagated = self.scale_inverse @ middle @ self.scale_inverse
            covariance = covariance + (propagated + propagated.T) / 2.0
        return covariance


@dataclass(frozen=True)
class BayesianLinearRegression:
    """VIPS for Normal-Gamma linear regression (module docstring): w | tau ~ N(0, (tau prior_precision)^-1 I),
    tau ~ Gamma(a0, b0).

    Defaults: targets are scaled to |y| <= 1, so the noise variance is at most 1 and usually far smaller;
    Gamma(1, 0.01) acts like 2 pseudo-observations with squared residual 0.01 (b0 = 1 would be 2 residuals
    of 1 and inflate the noise variance of a well-fitted model noticeably even at N = 20,000).
    prior_precision = 1 is a ridge penalty of 1 in units of sum_n x_n x_n^T (negligible once N >> d).
    """

    prior_precision: float = 1.0
    a0: float = 1.0
    b0: float = 0.01
    name: str = "linreg"
    algorithm: ClassVar[str] = "vips"

    def __post_init__(self) -> None:
        for label, value in (("prior_precision", self.prior_precision), ("a0", self.a0), ("b0", self.b0)):
            if not (value > 0 and math.isfinite(value)):
                raise ValueError(f"{label} must be a finite number > 0")

    def query(self) -> LinearRegressionQuery:
        """The wall's query that pairs with this model."""
        return LinearRegressionQuery()

    def _state(
        self,
        precision: Array,
        eta: Array,
        c: float,
        a: float,
        statistics: dict[str, Array],
        noise_variances: tuple[float, float] = (0.0, 0.0),
    ) -> LinregState:
        mean, scale_inverse = gaussian_moments(eta, precision)
        # c - eta^T m >= 0 in exact arithmetic (module docstring); guard rounding with the prior's b0.
        rate = max((c - float(eta @ mean)) / 2.0, self.b0 * 1e-12)
        return LinregState(precision, eta, c, a, mean, scale_inverse, rate, statistics, *noise_variances)

    def initial_state(self, dimension: int) -> LinregState:
        """The prior: Lambda = lambda0 I, eta = 0, c = 2 b0, a = a0."""
        precision = self.prior_precision * np.eye(dimension)
        return self._state(precision, np.zeros(dimension), 2.0 * self.b0, self.a0, {})

    def public_params(self, state: LinregState) -> dict[str, Array]:
        """None: the E-step of a conjugate model without latent variables does not depend on q."""
        return {}

    def natural_parameters_hat(
        self, statistics: dict[str, Array], population: int
    ) -> tuple[Array, Array, float, float]:
        """nu_hat = (lambda0 I + N xx, N yx, 2 b0 + N yy, a0 + N / 2) from released batch means."""
        xx = np.asarray(statistics["xx"], dtype=np.float64)
        yx = np.asarray(statistics["yx"], dtype=np.float64)
        yy = float(np.asarray(statistics["yy"], dtype=np.float64).reshape(-1)[0])
        d = yx.shape[0]
        if xx.shape != (d, d):
            raise ValueError(f"xx must be a {d}x{d} matrix")
        n = float(population)
        precision = self.prior_precision * np.eye(d) + n * xx
        return precision, n * yx, 2.0 * self.b0 + n * yy, self.a0 + n / 2.0

    def m_step(
        self,
        state: LinregState,
        statistics: dict[str, Array],
        population: int,
        rho: float,
        noise_std: Mapping[str, float] | None = None,
    ) -> LinregState:
        precision_hat, eta_hat, c_hat, a_hat = self.natural_parameters_hat(statistics, population)
        precision = (1 - rho) * state.precision_scale + rho * precision_hat
        eta = (1 - rho) * state.precision_times_mean + rho * eta_hat
        c = (1 - rho) * state.scaled_sum_of_squares + rho * c_hat
        a = (1 - rho) * state.noise_shape + rho * a_hat
        released = {k: np.asarray(v, dtype=np.float64) for k, v in statistics.items()}
        noise: Mapping[str, float] = {} if noise_std is None else noise_std
        variances = (
            (1 - rho) ** 2 * state.precision_noise_variance
            + (rho * population * float(noise.get("xx", 0.0))) ** 2,
            (1 - rho) ** 2 * state.eta_noise_variance + (rho * population * float(noise.get("yx", 0.0))) ** 2,
        )
        return self._state(precision, eta, c, a, released, variances)

    def posterior(self, state: LinregState) -> dict[str, Any]:
        return {
            "natural_parameters": {
                "precision_scale": state.precision_scale.tolist(),
                "precision_times_mean": state.precision_times_mean.tolist(),
                "scaled_sum_of_squares": state.scaled_sum_of_squares,
                "noise_shape": state.noise_shape,
            },
            "sufficient_statistics": {k: v.tolist() for k, v in state.statistics.items()},
            "variational_parameters": {
                "mean": state.mean.tolist(),
                "precision_scale": state.precision_scale.tolist(),
                "noise_shape": state.noise_shape,
                "noise_rate": state.noise_rate,
            },
            "mean": state.mean.tolist(),
            "covariance": state.covariance.tolist(),
            "noise_precision": {"shape": state.noise_shape, "rate": state.noise_rate},
            "noise_variance": state.noise_variance,
        }


def predict(mean: Array, covariance: Array, noise_variance: float, features: Array) -> tuple[Array, Array]:
    """Predictive mean m^T x and variance noise_variance + x^T Cov(w) x of y at each row of `features`.

    With the posterior document's "mean", "covariance" (Cov(w)) and "noise_variance" (E[1/tau]) this is the
    exact predictive variance of the Normal-Gamma posterior (a Student-t with 2a degrees of freedom).
    """
    features = np.asarray(features, dtype=np.float64)
    predictive_mean: Array = features @ mean
    variance: Array = noise_variance + np.einsum("ij,ij->i", features @ covariance, features)
    return predictive_mean, variance


def rmse(predictions: Array, targets: Array) -> float:
    """Root mean squared error."""
    residuals = np.asarray(predictions, dtype=np.float64) - np.asarray(targets, dtype=np.float64)
    return float(np.sqrt(np.mean(residuals * residuals)))
