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
More noise-aware steps (issue 35; docs/schedules.md, "VIPS-BLR: the M-step", and docs/design.md, "BLR's
treatment of the noise on the releases", say why they are post-processing; shrink_h=False turns the last
two off):
- z is the inverse-variance average of all releases N s1, whatever rho is: s1 = sum (y - 1/2) x does not
  depend on the state, so every release estimates the same sum (for rho = 1/t it is the paper's average).
- H's off-diagonal entries are soft-thresholded, H_ij -> sign(H_ij) max(|H_ij| - t, 0) for i != j, with
  t minimising Stein's unbiased risk estimate of the entries' error given the noise std tau,
  tau^2 = sum_t w_t^2 (N sigma_2)^2 for the rho-average H = sum_t w_t N s2_t (sigma_2: the released std of
  s2; SureShrink, Donoho and Johnstone 1995). At small epsilon the noise matrix's spectral norm
  2 tau sqrt(d) swamps most of H's eigenvalues, but not its few large entries, which thresholding keeps
  (Bickel and Levina 2008). The error that matters is that of H w (the mean solves H w = z), whose
  expectation weighs entry (i, j)'s squared error by E[w_i^2] + E[w_j^2]; so t minimises SURE with those
  weights, E[w_j^2] taken from a first pass at the unweighted threshold (weighted_sure_threshold).
  (Both passes share one sort of the entries; the first needs only E[w_i^2] = mu_i^2 + Sigma_ii, read
  from its eigendecomposition without forming Sigma: bench.blr_iteration.)
  (With the exact H and the same noisy z, VIPS-BLR's test AUC rose by 0.01-0.04 at epsilon 0.1-0.3 on
  Adult and synthetic data: H's noise, not z's, held it back at small epsilon x N; docs/schedules.md.)
- The wall projects each release of s2 to PSD, which adds about k sqrt(d) tau_t I to a release whose
  noise (std tau_t per entry) dominates H, k = 4 / (3 pi) the mean positive part of the semicircle law of
  radius 2: a ridge that helps, but the average of T releases keeps the ridge of each release, k sqrt(d)
  tau_t = k sqrt(d T) tau_1 at S = N, and the fit worsens as T grows. H's diagonal gives back the excess
  over the ridge of one projection at the average's noise, r - k sqrt(d) tau with r = sum_t w_t k sqrt(d)
  tau_t (>= k sqrt(d) tau; 0 when T = 1, the service's schedule for a job that gives epsilon), so that the
  schedule no longer decides the ridge.
The eigenvalue floor at 0 of the step above makes the result PSD again.
- The intercept (column `intercept`: the registry gives the one named "intercept", else 0, where the public
  scaler and every bundled dataset put the constant column). With few positives z = sum (y - 1/2) x is
  dominated by (share - 1/2) N mean(x), which only the intercept explains exactly (H e_0 is proportional to
  the xi-weighted mean of x). Soft-thresholding the intercept's row and column of H with the rest (their
  entries are the features' means, shrunk by t) and shrinking w_0 by the prior in directions the noise
  dominates put that mean into the feature weights, w_j ~ -mean(x_j): on held-out MLC churn (14% churners)
  rows with larger features scored lower, AUC below 1/2. So the intercept's entries are left out of both SURE
  passes and soft-thresholded at their own weighted SURE threshold; if at least half of them survive (the
  column carries the features' means; a column that is not an intercept, or features of mean 0, keep almost
  none) w_0 gets a flat prior and the posterior is solved jointly (intercept_moments: without noise the other
  weights see the Schur complement of H_00, i.e. centred features), and q(alpha) is the precision
  of the other weights only. Otherwise, and for intercept=None, the step above unchanged.
Laplace releases (laplace_from k, default 2; 0: the paper's E-step throughout; issue 51, docs/design.md):
from release k on the wall returns, at the public point m = E[w], g / 2 = sum (y - p) x / 2 and
H = sum p (1 - p) x x^T with p = sigmoid(x^T m) (privacy_wall.queries.blr, Laplace mode: the same blocks and
sensitivity). z = g + H m is then a pseudo-observation of w, z | w ~ N(H w, H + v I) with v = (2 sigma_1)^2
the noise variance of g, and the step above (SURE thresholding of H, then z formed with the thresholded H,
and the noise-aware or intercept posterior) is a Newton step from m that knows g's noise: without noise it
converges to the maximum a posteriori and the covariance to the Laplace approximation there, which covers
where the Polya-Gamma fixed point does not (its curvature tanh(c/2) / (2c) exceeds sigmoid'(c) for
well-classified rows). In these steps, and in the first release's when Laplace releases follow, q(w) and
q(alpha) are iterated to their joint fixed point given the release (alpha_steps at most) when the release
carries noise (without it, on separable rows, that fixed point runs off to alpha = 0). The Laplace
releases' H are pooled by inverse variance (not with the Polya-Gamma
releases' H, which weigh rows differently); without noise, a subsample's H is averaged with rho and its step
damped by rho, as the paper's M-step averages.
q(alpha) = Gamma(a0 + d/2, b0 + (mu^T mu + tr Sigma) / 2). Every step is post-processing of released
values and their public noise std (bench/README.md, "BLR accuracy" and "VIPS-BLR schedules and M-steps",
measure the gains).
The last step (noise_aware; issue 51): a few Newton steps from w = 0 stop short of the mode (without
noise, two steps: 90% intervals held 0.47-0.57 of the true weights), and q's Sigma, the inverse curvature
where they stopped, leaves the remaining error out. The posterior document's `covariance` is q(w)'s of the
last release widened along the iteration's last step s = m_T - m_{T-1}, u = s / |s|, by
  e = max(0, |s|^2 - 2 tr Sigma):    Sigma + e u u^T
(variational_parameters keeps q's own and s). Write s = delta + n, delta the step the iteration would take
without release noise and n the noise's share; were m_T and m_{T-1} two independent draws about their
targets with q's covariance, E |n|^2 = 2 tr Sigma, so e is a moment estimate of |delta|^2 (floored at 0),
and the remaining error of a few Newton steps from 0 is of the order of their last step, along it (they
contract it; sigma 0, T 2: the widened intervals hold 0.985-0.995). The widening is public post-processing
of q's iterates; the iterations themselves are unchanged. It is an estimate, not a bound: where the last
step is noise alone, e is positive when |n|^2 exceeds its mean; a fit of one release (T 1: s is the whole
mean from the prior's 0) is widened by its mean's length less the noise's, as its one step from the prior
may have gone a fraction of the way. Measured (docs/calibration.md, "The last step"): given only epsilon,
on 100 unseen datasets at epsilon 0.3 / 1 / 3 (N 10,000) VIPS's intervals cover 0.854 / 0.863 / 0.854
(0.833 / 0.845 / 0.830 unwidened) and DP-SEP's 0.880 / 0.868 / 0.831 (0.857 / 0.810 / 0.802), the held-out
log loss the same to 0.0005; at epsilon x N 500-2,000 VIPS's 0.62-0.73 and DP-SEP's 0.58-0.76 (0.53-0.73
unwidened, DP-SEP).
Expected natural parameters for the next E-step: E[w] = mu, E[w w^T] = Sigma + mu mu^T.
Prediction (probit approximation): p(y=1|x) ~= sigmoid(mu^T x / sqrt(1 + pi x^T Sigma x / 8)).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray
from scipy.special import expit

from vips.models.base import Array


@dataclass(frozen=True)
class BlrState:
    """Averaged natural parameters (z = nu1, H + prior_term I = nu2), the noise variances of z (v, per
    coordinate) and of H's entries (tau^2), the average r of the releases' PSD-projection ridges, and q."""

    nu1: Array
    data_precision: Array
    prior_term: float
    nu1_noise_variance: float
    mean: Array
    covariance: Array
    alpha_shape: float
    alpha_rate: float
    statistics: dict[str, Array]
    data_precision_noise_variance: float = 0.0
    projection_ridge: float = 0.0
    releases: int = 0
    #: q's mean minus the previous state's: the iteration's last step (None before the first).
    last_step: Array | None = None

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


def _noise_aware_eigen(
    data_precision: Array, prior_precision: float, noise_variance: float
) -> tuple[Array, Array, Array]:
    """(eigenvectors of H, gains h / (h + v), posterior precisions a + h^2 / (h + v)): one
    eigendecomposition, from which noise_aware_moments and noise_aware_mean_and_variances read."""
    symmetric = (data_precision + data_precision.T) / 2.0
    eigenvalues, vectors = np.linalg.eigh(symmetric)
    h = np.maximum(eigenvalues, 0.0)  # H is PSD (an average of PSD releases); clear rounding below 0
    denominator = h + noise_variance
    safe = np.where(denominator > 0, denominator, 1.0)
    gain = np.where(denominator > 0, h / safe, 0.0)
    return vectors, gain, prior_precision + gain * h


@dataclass(frozen=True)
class NoiseAwareSolver:
    """The noise-aware posterior of w given z | w ~ N(H w, H + v I) for any prior precision a, from one
    eigendecomposition of H (q(alpha)'s fixed point re-solves with the same H and v, only a changes)."""

    z: Array
    vectors: Array
    gain: Array  # h / (h + v) per eigenpair
    data_part: Array  # h^2 / (h + v) per eigenpair

    @classmethod
    def of(cls, z: Array, data_precision: Array, noise_variance: float) -> NoiseAwareSolver:
        vectors, gain, data_part = _noise_aware_eigen(data_precision, 0.0, noise_variance)
        return cls(z, vectors, gain, data_part)

    def _mean(self, precision: Array) -> Array:
        """Per eigenpair (h, u) of H, mean (h / (h + v)) u^T z / precision."""
        mean: Array = self.vectors @ (self.gain * (self.vectors.T @ self.z) / precision)
        return mean

    def moments(self, prior_precision: float) -> tuple[Array, Array]:
        """(mean, covariance) under w ~ N(0, a^-1 I): per eigenpair of H, precision a + h^2 / (h + v)."""
        precision = prior_precision + self.data_part
        covariance: Array = (self.vectors / precision) @ self.vectors.T
        return self._mean(precision), covariance

    def second_moments(self, prior_precision: float) -> Array:
        """E[w_i^2] = mu_i^2 + Sigma_ii under `moments`' posterior, without forming Sigma
        (Sigma_ii = sum_k V_ik^2 / precision_k)."""
        precision = prior_precision + self.data_part
        second: Array = (self.vectors**2) @ (1.0 / precision) + self._mean(precision) ** 2
        return second

    def intercept_moments(self, prior_precision: float, intercept: int) -> tuple[Array, Array]:
        """(mean, covariance) with a flat prior on the intercept w_k and N(0, a^-1 I) on the rest: the exact
        Gaussian posterior, precision P = H (H + v I)^-1 H + diag(a, .., 0 (at k), .., a) and mean
        P^-1 H (H + v I)^-1 z (for v = 0, H + diag(...) and z: w_k integrated out exactly sees centred
        features, the Schur complement of H_kk). Needs w_k identified (P positive definite: H_kk > 0)."""
        vectors = self.vectors
        prior = np.full(self.z.shape[0], prior_precision)
        prior[intercept] = 0.0
        precision = (vectors * self.data_part) @ vectors.T + np.diag(prior)
        return gaussian_moments(vectors @ (self.gain * (vectors.T @ self.z)), (precision + precision.T) / 2.0)


def noise_aware_moments(
    z: Array, data_precision: Array, prior_precision: float, noise_variance: float
) -> tuple[Array, Array]:
    """(mean, covariance) of w ~ N(0, a^-1 I) given z | w ~ N(H w, H + v I) (module docstring;
    NoiseAwareSolver.moments)."""
    return NoiseAwareSolver.of(z, data_precision, noise_variance).moments(prior_precision)


def noise_aware_second_moments(
    z: Array, data_precision: Array, prior_precision: float, noise_variance: float
) -> Array:
    """E[w_i^2] under noise_aware_moments' posterior (NoiseAwareSolver.second_moments)."""
    return NoiseAwareSolver.of(z, data_precision, noise_variance).second_moments(prior_precision)


def intercept_moments(
    z: Array, data_precision: Array, prior_precision: float, noise_variance: float, intercept: int
) -> tuple[Array, Array]:
    """(mean, covariance) of w with a flat prior on the intercept w_k and N(0, a^-1 I) on the rest, given
    z | w ~ N(H w, H + v I) as in noise_aware_moments (NoiseAwareSolver.intercept_moments)."""
    solver = NoiseAwareSolver.of(z, data_precision, noise_variance)
    return solver.intercept_moments(prior_precision, intercept)


#: Mean of the positive part of the semicircle law of radius 2: a PSD projection of symmetric noise with
#: entry std tau adds about PROJECTION_RIDGE sqrt(d) tau to every eigenvalue the noise dominates.
PROJECTION_RIDGE = 4.0 / (3.0 * np.pi)


def soft_threshold_off_diagonal(matrix: Array, threshold: float) -> Array:
    """M_ij -> sign(M_ij) max(|M_ij| - threshold, 0) for i != j; the diagonal is kept."""
    diagonal = np.diag(np.diag(matrix))
    off = matrix - diagonal
    shrunk: Array = diagonal + np.sign(off) * np.maximum(np.abs(off) - threshold, 0.0)
    return shrunk


def sure_threshold(values: Array, std: float, order: NDArray[np.intp] | None = None) -> float:
    """The soft threshold t minimising Stein's unbiased risk estimate for values = signal + N(0, std^2):
    SURE(t) = n std^2 - 2 std^2 #{|x_i| <= t} + sum_i min(x_i^2, t^2) (Donoho and Johnstone 1995),
    over t in {0} and the |x_i|. order: argsort(|values|) if already known."""
    return weighted_sure_threshold(values, np.ones_like(values, dtype=np.float64), std, order)


def weighted_sure_threshold(
    values: Array, weights: Array, std: float, order: NDArray[np.intp] | None = None
) -> float:
    """The soft threshold t minimising Stein's unbiased estimate of the weighted risk
    E sum_i w_i (soft_t(x_i) - mu_i)^2 for values x_i = mu_i + N(0, std^2) and fixed weights w_i >= 0:
    SURE_w(t) = sum_i w_i (std^2 - 2 std^2 [|x_i| <= t] + min(x_i^2, t^2)) (each term is SURE for one
    coordinate, unbiased on its own), over t in {0} and the |x_i|; all weights 1 is sure_threshold.
    order: argsort(|values|) if already known (the M-step's two passes sort the same values)."""
    if order is None:  # ties: the last of a group has the least risk, whatever the order
        order = np.argsort(np.abs(values))
    magnitudes = np.abs(values)[order]
    weight = np.asarray(weights, dtype=np.float64)[order]
    if magnitudes.shape[0] == 0 or std <= 0:
        return 0.0
    below = np.cumsum(weight)  # sum of w over |x| <= t at t = the k-th smallest magnitude
    # SURE_w(t) - std^2 sum w at each candidate t > 0:
    risks = -2 * std**2 * below + np.cumsum(weight * magnitudes**2) + (below[-1] - below) * magnitudes**2
    best = int(np.argmin(risks))
    return float(magnitudes[best]) if risks[best] < 0.0 else 0.0  # SURE_w(0) - std^2 sum w = 0


@functools.lru_cache(maxsize=8)
def _column_mask(dimension: int, column: int) -> NDArray[np.bool_]:
    """Which of the entries at _off_diagonal_indices(dimension) lie in row or column `column`."""
    rows, cols = _off_diagonal_indices(dimension)
    mask: NDArray[np.bool_] = (rows == column) | (cols == column)
    mask.flags.writeable = False
    return mask


@functools.lru_cache(maxsize=8)
def _off_diagonal_indices(dimension: int) -> tuple[NDArray[np.intp], NDArray[np.intp]]:
    """np.triu_indices(dimension, k=1), computed once per dimension (read-only arrays)."""
    rows, cols = np.triu_indices(dimension, k=1)
    rows.flags.writeable = False
    cols.flags.writeable = False
    return rows, cols


def pooled_mean(mean: Array, variance: float, value: Array, value_variance: float) -> tuple[Array, float]:
    """Inverse-variance average of two independent unbiased estimates of one vector, and its variance:
    (mean / variance + value / value_variance) / (1 / variance + 1 / value_variance)."""
    if variance == 0.0:  # no estimate yet (the prior state): the new value alone
        return value, value_variance
    weight = variance / (variance + value_variance)  # the new value's weight
    return (1 - weight) * mean + weight * value, (1 - weight) * variance


@dataclass(frozen=True)
class BayesianLogisticRegression:
    """VIPS-BLR with hyperprior Gamma(a0, b0) on the prior precision; noise_aware: the M-step that knows
    the releases' noise (module docstring; False is the paper's Eq. 53-55); shrink_h: also treat H's
    noise (thresholding and the ridge correction; False: the issue-12 step, which treats only z's);
    threshold: None (SURE's threshold for H's off-diagonal entries, weighted by the error of H w) or c,
    thresholding at c noise stds; intercept: the column of the constant intercept (0: the public scaler's
    and the bundled datasets' convention) whose entries of H get their own SURE threshold and whose weight a
    flat prior when they carry the features' means (with shrink_h and threshold None; module docstring),
    None: no intercept step; laplace_from: the first Laplace release (0: none; module docstring);
    pool_hessians: pool the Laplace releases' H (False: each step its own); pool_from: the first release
    whose H enters the pool (0: laplace_from; DP-SEP's noise-aware mode leaves out its first, at w = 0);
    alpha_steps: the most iterations of q(alpha)'s fixed point in a step with Laplace releases (module
    docstring)."""

    a0: float = 1.0
    b0: float = 1.0
    noise_aware: bool = True
    shrink_h: bool = True
    threshold: float | None = None
    intercept: int | None = 0
    laplace_from: int = 2
    pool_hessians: bool = True
    pool_from: int = 0
    alpha_steps: int = 50
    name: str = "blr"

    def initial_state(self, dimension: int) -> BlrState:
        alpha = self.a0 / self.b0
        nu1 = np.zeros(dimension)
        mean, covariance = gaussian_moments(nu1, alpha * np.eye(dimension))
        zeros = np.zeros((dimension, dimension))
        return BlrState(nu1, zeros, alpha, 0.0, mean, covariance, self.a0, self.b0, {})

    def laplace_release(self, state: BlrState) -> bool:
        """Whether the next release is a Laplace-mode one (at q's mean): from release laplace_from on."""
        return 0 < self.laplace_from <= state.releases + 1

    def public_params(self, state: BlrState) -> dict[str, Array]:
        if self.laplace_release(state):
            return {"mean": state.mean.copy()}
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
        noise: Mapping[str, float] = {} if noise_std is None else noise_std
        sigma_1 = population * float(noise.get("s1", 0.0))  # std of N s1's noise per coordinate
        sigma_2 = population * float(noise.get("s2", 0.0))  # std of N s2's noise per entry
        ridge_scale = PROJECTION_RIDGE * np.sqrt(s1.shape[0])
        noise_aware = self.noise_aware and sigma_1 > 0
        if self.laplace_release(state):
            # A Newton step from m (module docstring, "Laplace releases"): the pseudo-observation
            # z = g + H m of w, g = 2 N s1 the gradient at m (noise std 2 sigma_1), H = N s2; z replaces
            # the average (the release was taken at the current point); H is pooled over Laplace releases.
            data_precision, h_noise = population * s2, sigma_2**2
            ridge = ridge_scale * sigma_2
            later = self.laplace_from < state.releases + 1
            pooled_later = max(self.laplace_from, self.pool_from) < state.releases + 1
            if self.pool_hessians and pooled_later and sigma_2 > 0:
                previous = state.data_precision_noise_variance
                data_precision, pooled = pooled_mean(state.data_precision, previous, data_precision, h_noise)
                weight = previous / (previous + h_noise)
                ridge = (1 - weight) * state.projection_ridge + weight * ridge
                h_noise = pooled
            elif later and rho < 1:  # a subsample without noise: H averaged as the paper averages it
                data_precision = (1 - rho) * state.data_precision + rho * data_precision
            prior_term = state.expected_alpha
            gradient: Array | None = 2.0 * population * s1
            nu1, z_noise = 2.0 * population * s1 + data_precision @ state.mean, (2.0 * sigma_1) ** 2
        else:
            gradient = None
            data_precision = (1 - rho) * state.data_precision + rho * population * s2
            h_noise = (1 - rho) ** 2 * state.data_precision_noise_variance + (rho * sigma_2) ** 2
            ridge = (1 - rho) * state.projection_ridge + rho * ridge_scale * sigma_2
            prior_term = (1 - rho) * state.prior_term + rho * state.expected_alpha
            if noise_aware:
                nu1, z_noise = pooled_mean(state.nu1, state.nu1_noise_variance, population * s1, sigma_1**2)
            else:
                nu1 = (1 - rho) * state.nu1 + rho * population * s1
                z_noise = (1 - rho) ** 2 * state.nu1_noise_variance + (rho * sigma_1) ** 2
        flat: int | None = None
        solved = data_precision  # the H the step solves with
        if noise_aware:
            excess = ridge - ridge_scale * float(np.sqrt(h_noise))
            if self.shrink_h and self.threshold is None:
                solved, flat = self._sure_shrunk(
                    data_precision, excess, float(np.sqrt(h_noise)), nu1, prior_term, z_noise
                )
            else:
                threshold = 0.0 if self.threshold is None else self.threshold * float(np.sqrt(h_noise))
                solved = self._shrunk(data_precision, excess, threshold)
        if gradient is not None:  # z formed with the H the step solves with: a converged step stays put
            nu1 = gradient + solved @ state.mean

        solver = NoiseAwareSolver.of(nu1, solved, z_noise) if noise_aware else None

        def solve(prior: float) -> tuple[Array, Array]:
            if solver is None:
                return gaussian_moments(nu1, solved + prior * np.eye(s1.shape[0]))
            if flat is None:
                return solver.moments(prior)
            return solver.intercept_moments(prior, flat)

        mean, covariance = solve(prior_term)
        # With Laplace releases ahead, every noise-aware step takes q(alpha) to its fixed point given the
        # release (post-processing): a stale prior precision (a0 / b0 at the start) leaves the first point,
        # and with it the Newton steps' curvature, shrunk (coverage at epsilon 1 on 150 datasets 0.836 ->
        # 0.861). Not without noise: on separable rows the fixed point runs off to alpha = 0 and overflows.
        if noise_aware and self.laplace_from > 0 and (gradient is not None or state.releases == 0):
            for _ in range(self.alpha_steps):
                shape, rate = self._alpha_posterior(mean, covariance, flat)
                if abs(shape / rate - prior_term) <= 1e-9 * prior_term:
                    break
                prior_term = shape / rate
                mean, covariance = solve(prior_term)
        if gradient is not None and rho < 1 and not noise_aware:  # a subsample's Newton step without noise,
            mean = (1 - rho) * state.mean + rho * mean  # damped as the paper's steps are
        averages = (nu1, data_precision, prior_term, z_noise, h_noise, ridge)
        return self._with_q(
            averages, mean, covariance, statistics, flat, state.releases + 1, mean - state.mean
        )

    def _sure_shrunk(
        self, data_precision: Array, excess_ridge: float, std: float, z: Array, prior: float, z_noise: float
    ) -> tuple[Array, int | None]:
        """H thresholded at the weighted SURE threshold (module docstring): a first pass at the unweighted
        threshold gives E[w_i^2], which weighs each entry's risk in the second (the off-diagonal entries are
        sorted once). With an intercept column k, its entries are left out of both thresholds and
        soft-thresholded at their own weighted SURE threshold; if at least half of them survive (the column
        carries the features' means), the intercept is returned too, to get a flat prior; else None."""
        dimension = z.shape[0]
        rows, cols = _off_diagonal_indices(dimension)
        off = data_precision[rows, cols]
        order = np.argsort(np.abs(off))
        k = self.intercept
        if k is not None and not (0 <= k < dimension and dimension > 1):
            k = None
        if k is None:
            first = self._shrunk(data_precision, excess_ridge, sure_threshold(off, std, order))
            second = noise_aware_second_moments(z, first, prior, z_noise)
            threshold = weighted_sure_threshold(off, second[rows] + second[cols], std, order)
            return self._shrunk(data_precision, excess_ridge, threshold), None
        in_column = _column_mask(dimension, k)
        rest_order = order[~in_column[order]]  # still sorted by |H_ij|
        first = self._shrunk(data_precision, excess_ridge, sure_threshold(off, std, rest_order), k, 0.0)
        second = noise_aware_second_moments(z, first, prior, z_noise)
        weights = second[rows] + second[cols]
        threshold = weighted_sure_threshold(off, weights, std, rest_order)
        column_threshold = weighted_sure_threshold(off[in_column], weights[in_column], std)
        shrunk = self._shrunk(data_precision, excess_ridge, threshold, k, column_threshold)
        survivors = int(np.count_nonzero(shrunk[:, k])) - int(shrunk[k, k] != 0.0)
        flat = 2 * survivors >= dimension - 1 and shrunk[k, k] > 0.0
        return shrunk, (k if flat else None)

    def _shrunk(
        self,
        data_precision: Array,
        excess_ridge: float,
        threshold: float,
        column: int | None = None,
        column_threshold: float = 0.0,
    ) -> Array:
        """H with its off-diagonal entries soft-thresholded at threshold (those of row and column `column`
        at column_threshold) and the projections' excess ridge removed from its diagonal (module
        docstring); H itself when shrink_h is off."""
        if not self.shrink_h:
            return data_precision
        shrunk = soft_threshold_off_diagonal(data_precision, threshold)
        if column is not None:
            entries = data_precision[:, column]
            kept = np.sign(entries) * np.maximum(np.abs(entries) - column_threshold, 0.0)
            kept[column] = entries[column]
            shrunk[:, column] = kept
            shrunk[column, :] = kept
        diagonal = np.diag_indices_from(shrunk)
        shrunk[diagonal] -= max(excess_ridge, 0.0)
        return shrunk

    def _alpha_posterior(self, mean: Array, covariance: Array, flat: int | None) -> tuple[float, float]:
        """q(alpha)'s (shape, rate) = (a0 + k/2, b0 + sum E[w_i^2] / 2) over the k weights alpha is the
        prior precision of (all but the intercept `flat` when it has a flat prior)."""
        second = mean**2 + np.diag(covariance)
        if flat is not None:
            second = np.delete(second, flat)
        return self.a0 + second.shape[0] / 2, self.b0 + float(np.sum(second)) / 2

    def _with_q(
        self,
        averages: tuple[Array, Array, float, float, float, float],
        mean: Array,
        covariance: Array,
        statistics: dict[str, Array],
        flat: int | None = None,
        releases: int = 0,
        last_step: Array | None = None,
    ) -> BlrState:
        """The new state from the averages (z, H, prior term, z's and H's noise variances, projection
        ridge) and q(w), with q(alpha) = Gamma(a0 + d/2, b0 + (mu^T mu + tr Sigma) / 2), over the weights
        alpha is the prior precision of (all but the intercept `flat` when it had a flat prior)."""
        nu1, data_precision, prior_term, z_noise, h_noise, ridge = averages
        shape, rate = self._alpha_posterior(mean, covariance, flat)
        return BlrState(
            nu1,
            data_precision,
            prior_term,
            z_noise,
            mean,
            covariance,
            shape,
            rate,
            {"s1": statistics["s1"], "s2": statistics["s2"]},
            h_noise,
            ridge,
            releases,
            last_step,
        )

    def posterior(self, state: BlrState) -> dict[str, Any]:
        """The posterior document's fields: `covariance` (and the natural parameters, of the same Gaussian)
        with noise_aware q's widened along the last step (widened_covariance); variational_parameters q's
        own, with the last step."""
        covariance, step = state.covariance, state.last_step if self.noise_aware else None
        if step is not None:
            covariance = widened_covariance(covariance, step)
        second_moment = covariance + np.outer(state.mean, state.mean)
        # The reported Gaussian's natural parameters (with the noise-aware step they differ from the
        # averaged nu1, nu2).
        precision = np.linalg.inv(covariance)
        precision = (precision + precision.T) / 2.0
        variational: dict[str, Any] = {
            "mean": state.mean.tolist(),
            "covariance": state.covariance.tolist(),
            "alpha_shape": state.alpha_shape,
            "alpha_rate": state.alpha_rate,
        }
        if step is not None:  # the step the covariance was widened along (by nothing if q explains it)
            variational["last_step"] = step.tolist()
        return {
            "natural_parameters": {
                "precision_times_mean": (precision @ state.mean).tolist(),
                "precision": precision.tolist(),
                "expected_w": state.mean.tolist(),
                "expected_neg_half_wwT": (-0.5 * second_moment).tolist(),
            },
            "sufficient_statistics": {k: v.tolist() for k, v in state.statistics.items()},
            "variational_parameters": variational,
            "mean": state.mean.tolist(),
            "covariance": covariance.tolist(),
        }


def widened_covariance(covariance: Array, step: Array) -> Array:
    """Sigma + max(0, |s|^2 - 2 tr Sigma) u u^T for the iteration's last step s = m_T - m_{T-1},
    u = s / |s| (module docstring, "The last step")."""
    length = float(np.linalg.norm(step))
    if not (length > 0.0 and math.isfinite(length * length)):
        return covariance
    direction = step / length
    excess = length * length - 2.0 * float(np.trace(covariance))
    if not (excess > 0.0 and math.isfinite(excess)):
        return covariance
    widened: Array = covariance + excess * np.outer(direction, direction)
    return widened


def predict_proba(mean: Array, covariance: Array, features: Array) -> Array:
    """P(y = 1 | x) under the probit approximation of the logistic-Gaussian integral."""
    activation = features @ mean
    variance = np.einsum("ij,ij->i", features @ covariance, features)
    return np.asarray(expit(activation / np.sqrt(1.0 + np.pi * variance / 8.0)))
