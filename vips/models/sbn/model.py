"""Sigmoid belief network, public half (VIPS paper Sec. 7, Alg. 6, Appendix Sec. 5).

Priors: W_jk ~ N(0, w_variance), c_j ~ N(0, c_variance), b_k ~ N(0, b_variance) (isotropic normals; the
paper's TPBN shrinkage prior on W is not implemented). Variational family q(b) prod_j q(w^_j) with
q(w^_j) = N(mu_j, Sigma_j) over the augmented row w^_j = (w_j, c_j) (K + 1 dimensional: the paper's q(w_j)
and q(c) in one Gaussian, which the natural parameter -1/2 diag(c) W of Eq. 65 couples anyway) and
q(b_k) = N(mu_bk, sigma_bk^2).

From the released batch means as the wall's postprocess returns them (s1 = <r - 1/2>, s3 = <y - 1/2>,
s4 = <xi>, s5 = <xi r^T>, s6 = <(y - 1/2) r^T>, s7 = <xi_j <z z^T>>; see privacy_wall.queries.sbn), after
`project_statistics` (s5 and diag(s7) combined, |s6_jk| <= <r_k> / 2), the data parts are averaged,
  A1_t = (1 - rho_t) A1_{t-1} + rho_t N (s6_j, s3_j),  A2_t = (1 - rho_t) A2_{t-1} + rho_t N D_j,
  D_j = [[s7_j, s5_j], [s5_j^T, s4_j]],
with the per-entry variances of the noise they carry (`NoiseVariances`, from the releases' public noise_std:
v_t = (1 - rho_t)^2 v_{t-1} + rho_t^2 N^2 std^2), and q(w^_j) is read from the averages (issue 35):
  c drive   g = denoise_frequencies(A1[:, K])            (empirical-Bayes posterior means of the frequencies)
  W drive   shrink_columns(A1[:, :K] - g <r>^T) + g <r>^T   (<r> = s1 + 1/2 from the running N s1 of q(b))
  nu(w^_j) = ((W drive, g),  P0 + psd_floor(shrink_precision(A2)))
  nu(b)_t  = (1 - rho_t) nu(b)_{t-1} + rho_t (N s1,  1 / b_variance + N <xi^(1)>),
  <xi^(1)_k> = E[PG(1, sqrt(<b_k^2>))] (Eq. 68),
where P0 = diag(1/w_variance, ..., 1/c_variance), so every precision stays >= P0.
- denoise_frequencies: the released pixel frequencies' noise is what the fallback (the per-pixel means)
  pays; a prior estimated from all J pixels (nonparametric maximum likelihood) and the posterior mean
  reduce it and keep the frequencies in [0, 1]. The release may weight s3 (frequency_copies k, the model's
  default 4, the schedule rule's by epsilon x N: s3 is the mean of k released copies, its noise scale
  frequency_noise_std reads the copies' public noise_std).
- shrink_columns switches off a hidden unit whose weights the noise cannot support (positive-part
  James-Stein per column), applied to the covariance part of N s6 only: N s3_j <r_k> is what a model
  without hidden structure implies (w = 0 solves the M-step then), large whatever the noise, and shrinking
  the sum kept pure-noise columns. A switched-off unit has drive and data precision 0.
- shrink_precision moves the noisy data precision toward a PSD target pooled over the J pixels, whose c-c
  entries are those the released s3 implies for a model without hidden units (so a fit that noise
  overwhelms falls back to c_j = logit(pixel frequency), the per-pixel means, instead of below them).
- psd_floor raises the eigenvalues of what is left to the spectral edge of its noise, 2 lambda
  sqrt((K + 1) v) (a (K + 1) x (K + 1) symmetric noise matrix of entry variance v has its eigenvalues
  within ~2 sqrt((K + 1) v); lambda the shrinkage factor): directions the noise can fake are not inverted
  (a projection to 0 left only P0 there, and the noise of the drive, N std, became weights of hundreds).
All read only released values and public noise scales (post-processing) and are the identity at sigma = 0,
where this is the paper's update. <xi^(1)> uses the current q(b): it depends on the released posterior only
and needs no noise (the paper's s2).
The expected natural parameters for the next E-step are <b>, <W> and <w^_j w^_j^T> = Sigma_j + mu_j mu_j^T.

Reconstruction of public binary rows: q(z | y) by the same fixed-iteration E-step (plug-in point estimates
of W, b, c unless second moments are given), then p(y_j = 1 | <z>) = sigmoid(<w_j>^T <z> + <c_j>).
Metrics: pixel accuracy (threshold 1/2) and reconstruction negative log-likelihood in nats per image.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.special import expit, log_expit, logsumexp

from privacy_wall.queries.blr import polya_gamma_mean
from privacy_wall.queries.sbn import (
    DEFAULT_FREQUENCY_COPIES,
    DEFAULT_INNER_ITERATIONS,
    SigmoidBeliefNetworkQuery,
    hidden_posterior,
)
from vips.models.base import Array
from vips.models.sbn.spec import DEFAULTS

#: The default number of hidden units (option "hidden"; the model's spec, vips.models.sbn.spec).
DEFAULT_HIDDEN = int(DEFAULTS["hidden"])


@dataclass(frozen=True)
class NoiseVariances:
    """Per-entry variances of the release noise left in the running averages (public: from the releases'
    noise_std, N and the step sizes). `w` (K,): column k of N s6; `diagonal`: N s5 (= the diagonal of N s7);
    `off`: the off-diagonal entries of N s7; `s4`: N s4; `s3`: N s3 (the pixel frequencies' drive); `w_raw`:
    N s6 before the clip |s6_jk| <= <r_k> / 2 (the clip bounds the variance but not the shift of what is
    left after subtracting N s3 <r_k>, so the shrinkage of that covariance uses w_raw). All zero without
    noise."""

    w: Array
    diagonal: float = 0.0
    off: float = 0.0
    s4: float = 0.0
    s3: float = 0.0
    w_raw: float = 0.0

    def is_zero(self) -> bool:
        """No noise in the averages (every release so far at sigma = 0)."""
        return not (np.any(self.w > 0) or self.diagonal > 0 or self.off > 0 or self.s4 > 0 or self.s3 > 0)

    def mixed(self, new: NoiseVariances, rho: float) -> NoiseVariances:
        """The variance of (1 - rho) old + rho new for independent noises: (1 - rho)^2 v + rho^2 v_new."""
        a, b = (1.0 - rho) ** 2, rho**2
        return NoiseVariances(
            a * self.w + b * new.w,
            a * self.diagonal + b * new.diagonal,
            a * self.off + b * new.off,
            a * self.s4 + b * new.s4,
            a * self.s3 + b * new.s3,
            a * self.w_raw + b * new.w_raw,
        )


@dataclass(frozen=True)
class SbnState:
    """q(w^_j) for j = 1..J and q(b), as natural parameters and as moments, plus the last release."""

    wc_eta1: Array  # (J, K + 1): precision_j mean_j
    wc_eta2: Array  # (J, K + 1, K + 1): precision_j
    b_eta1: Array  # (K,): precision * mean of q(b_k)
    b_eta2: Array  # (K,): precision of q(b_k)
    wc_mean: Array  # (J, K + 1): (<w_j>, <c_j>)
    wc_covariance: Array  # (J, K + 1, K + 1)
    b_mean: Array  # (K,)
    b_variance: Array  # (K,)
    statistics: dict[str, Array]
    data_eta1: Array  # (J, K + 1): running average of N (s6_j, s3_j), before shrinkage
    data_eta2: Array  # (J, K + 1, K + 1): running average of N D_j (data_precision), before shrinkage / PSD
    noise: NoiseVariances  # per-entry noise variances of data_eta1 and data_eta2 (public: from noise_std)

    @property
    def hidden(self) -> int:
        return int(self.b_mean.shape[0])

    @property
    def w_mean(self) -> Array:
        """<W> (J x K)."""
        return self.wc_mean[:, :-1]

    @property
    def c_mean(self) -> Array:
        """<c> (J,)."""
        return self.wc_mean[:, -1]

    @property
    def wc_second_moment(self) -> Array:
        """<w^_j w^_j^T> = Sigma_j + mu_j mu_j^T (J x K + 1 x K + 1)."""
        return self.wc_covariance + self.wc_mean[:, :, None] * self.wc_mean[:, None, :]


def _gaussian_moments(eta1: Array, eta2: Array) -> tuple[Array, Array]:
    """Batched mean and covariance of N with precision eta2 (symmetric PD) and precision * mean eta1."""
    identity = np.broadcast_to(np.eye(eta2.shape[-1]), eta2.shape)
    inverse = np.linalg.solve(eta2, identity)
    covariance: Array = np.asarray((inverse + np.swapaxes(inverse, -1, -2)) / 2.0, dtype=np.float64)
    mean: Array = np.einsum("jab,jb->ja", covariance, eta1)
    return mean, covariance


def _project_psd(matrices: Array, floor: float = 0.0) -> Array:
    """Batched symmetric parts with their eigenvalues raised to at least `floor` (0: the nearest PSD
    matrices in Frobenius norm)."""
    sym = (matrices + np.swapaxes(matrices, -1, -2)) / 2.0
    eigenvalues, vectors = np.linalg.eigh(sym)
    projected: Array = np.einsum("jak,jk,jbk->jab", vectors, np.maximum(eigenvalues, floor), vectors)
    return projected


def project_statistics(statistics: dict[str, Array]) -> dict[str, Array]:
    """Use what the exact statistics are known to satisfy to reduce the noise (post-processing only).

    - s5_jk = <xi_j r_k> and the diagonal s7_jkk = <xi_j <z_k^2>> are the same quantity (z is binary) released
      twice, with noise variances in the public ratio Delta5^2 / Delta7^2 = 2 / (K + 1): both are replaced by
      their inverse-variance weighted mean.
    - |s6_jk| = |<(y_j - 1/2) r_k>| <= <r_k> / 2 with <r_k> = s1_k + 1/2 (s1 clipped to [-1/2, 1/2]): a hidden
      unit that is (almost) never on cannot receive large weights from noise alone. Without this, noisy W
      makes the quadratic terms of d_nk switch units off, which shrinks <r_k> and the precision of w_.k while
      the noise on s6 stays: b runs to large negative values and the fit collapses to the pixel means.
    Other box constraints (0 <= s7_jkl, s4 in [0, 1/4], ...) are not imposed: clipping zero-mean noise biases
    the running averages that the step sizes form, which hurt more than the clipping helped (bench/README.md).
    At sigma = 0 every constraint already holds and this is the identity up to rounding.
    """
    k = statistics["s1"].shape[0]
    on = np.clip(statistics["s1"], -0.5, 0.5) + 0.5
    s7 = np.array(statistics["s7"], dtype=np.float64, copy=True)
    index = np.arange(k)
    s5 = ((k + 1) * statistics["s5"] + 2.0 * s7[:, index, index]) / (k + 3)
    s7[:, index, index] = s5
    out = dict(statistics)
    out.update(s5=s5, s7=s7, s6=np.clip(statistics["s6"], -on / 2.0, on / 2.0))
    return out


def data_precision(statistics: dict[str, Array]) -> Array:
    """[[s7_j, s5_j], [s5_j^T, s4_j]] per visible unit (J x K + 1 x K + 1): the batch mean of
    xi_nj <z^_n z^_n^T> with z^ = (z, 1)."""
    s4, s5, s7 = statistics["s4"], statistics["s5"], statistics["s7"]
    j, k = s5.shape
    out = np.empty((j, k + 1, k + 1))
    out[:, :k, :k] = s7
    out[:, :k, k] = s5
    out[:, k, :k] = s5
    out[:, k, k] = s4
    return out


def release_noise(
    statistics: dict[str, Array], noise_std: Mapping[str, float] | None, population: int
) -> NoiseVariances:
    """Per-entry noise variances of one release's N (s6, s3) and N D after `project_statistics`.

    s6 is released centred (privacy_wall.queries.sbn) and postprocess adds s3 / 2: std6^2 + std3^2 / 4 per
    entry. s6_jk is clipped to |s6_jk| <= <r_k> / 2, and a value confined to [-a, a] has variance <= a^2, so
    column k's is N^2 min(std6^2 + std3^2 / 4, <r_k>^2 / 4). s5 and diag(s7) are combined with weights
    (K + 1, 2) / (K + 3): N^2 ((K + 1)^2 std5^2 + 4 std7^2) / (K + 3)^2. Zero when noise_std is None."""
    std = dict.fromkeys(("s3", "s4", "s5", "s6", "s7"), 0.0) if noise_std is None else dict(noise_std)
    std["s3"] = frequency_noise_std(std)
    k = statistics["s1"].shape[0]
    n2 = float(population) ** 2
    on = np.clip(statistics["s1"], -0.5, 0.5) + 0.5
    raw = n2 * (std["s6"] ** 2 + std["s3"] ** 2 / 4.0)
    w = np.minimum(raw, n2 * on**2 / 4.0)
    diagonal = n2 * ((k + 1) ** 2 * std["s5"] ** 2 + 4.0 * std["s7"] ** 2) / (k + 3) ** 2
    return NoiseVariances(
        w, diagonal, n2 * std["s7"] ** 2, n2 * std["s4"] ** 2, n2 * std["s3"] ** 2, float(raw)
    )


def frequency_noise_std(noise_std: Mapping[str, float]) -> float:
    """The noise scale of the postprocessed s3, the mean of its k released copies s3, s3_2, ..., s3_k
    (privacy_wall.queries.sbn.frequency_copy_names; independent noises of one scale): std / sqrt(k)."""
    copies = [float(value) for name, value in noise_std.items() if name == "s3" or name.startswith("s3_")]
    return float(np.sqrt(np.mean(np.square(copies)) / len(copies))) if copies else 0.0


def shrink_columns(drive: Array, variance: Array) -> Array:
    """Positive-part James-Stein toward 0 per column k of a J x K matrix with entry noise variance v_k:
    x_k max(0, 1 - (J - 2) v_k / |x_k|^2). A hidden unit whose weights the noise cannot support is switched
    off instead of being fitted to the noise; the identity when v = 0."""
    j = drive.shape[0]
    energy = np.einsum("jk,jk->k", drive, drive)
    with np.errstate(divide="ignore", invalid="ignore"):
        factor = np.where(variance > 0, np.maximum(0.0, 1.0 - max(j - 2, 1) * variance / energy), 1.0)
    shrunk: Array = drive * np.nan_to_num(factor, nan=0.0)
    return shrunk


def pooled_target(data: Array, s4: Array) -> Array:
    """s4_j psd([[R, m], [m^T, 1]]) with R, m pooled over the J visible units (sum_j D_j / sum_j D_j,KK): the
    data precision if xi_nj were independent of z_n, estimated from all J rows at once (J times less noise
    variance than one row), scaled by the given c-c entries s4 (J,)."""
    k = data.shape[1] - 1
    pooled = data.sum(axis=0) / max(float(data[:, k, k].sum()), np.finfo(np.float64).tiny)
    pooled[k, k] = 1.0
    shape: Array = _project_psd(pooled[None])[0]
    target: Array = np.clip(s4, 0.0, None)[:, None, None] * shape[None, :, :]
    return target


def _shrink_factor(residual: Array, variance: float) -> float:
    """max(0, 1 - v / mean(residual^2)): the share of the residual's energy that is not noise."""
    if variance <= 0:
        return 1.0
    energy = float(np.mean(residual**2)) if residual.size else 0.0
    return max(0.0, 1.0 - variance / energy) if energy > 0 else 0.0


#: Support of the empirical-Bayes prior of the pixel frequencies (denoise_frequencies): a public grid.
FREQUENCY_GRID = np.linspace(0.0, 1.0, 201)
#: EM rounds of the prior's weights (a fixed count: no convergence test).
FREQUENCY_EM_ROUNDS = 200


def denoise_frequencies(drive_c: Array, variance: float, population: int) -> Array:
    """Empirical-Bayes posterior means of the pixel frequencies p_j = s3_j + 1/2 from the noisy running
    average N s3 (entry noise variance `variance`, public): p^_j = p_j + N(0, v / N^2) independently, a
    prior g on FREQUENCY_GRID estimated from all J pixels at once (Kiefer-Wolfowitz nonparametric maximum
    likelihood, by EM on its weights), and E[p_j | p^_j] under g, returned as the drive N (E[p_j] - 1/2).
    The posterior mean is what the log-loss of a pixel's prediction asks for; with many pixels nearly always
    off (or on), g puts its mass there and pulls their noisy frequencies back into [0, 1] instead of
    clipping them. Post-processing of released values; the identity when v = 0."""
    if variance <= 0 or drive_c.size == 0:
        return drive_c
    n = float(population)
    observed = drive_c / n + 0.5
    scale = np.sqrt(variance) / n
    log_lik = -0.5 * ((observed[:, None] - FREQUENCY_GRID[None, :]) / scale) ** 2
    likelihood = np.exp(log_lik - log_lik.max(axis=1, keepdims=True))  # rows rescaled: weights unchanged
    weights = np.full(FREQUENCY_GRID.size, 1.0 / FREQUENCY_GRID.size)
    for _ in range(FREQUENCY_EM_ROUNDS):
        posterior = likelihood * weights
        posterior /= posterior.sum(axis=1, keepdims=True)
        weights = posterior.mean(axis=0)
    posterior = likelihood * weights
    posterior /= posterior.sum(axis=1, keepdims=True)
    denoised: Array = n * (posterior @ FREQUENCY_GRID - 0.5)
    return denoised


def implied_s4(drive_c: Array, population: int) -> Array:
    """N pg(logit(p_j)), p_j = s3_j + 1/2 clipped to [1/(N + 1), N/(N + 1)]: the batch mean of xi_nj at the
    fixed point of the model without hidden units (c = s3 / s4 there gives c_j = logit(p_j)), read from the
    released s3 alone (N s3 has J K times less noise variance per entry than s7 and 1/16 of s4's ratio)."""
    n = float(population)
    p = np.clip(drive_c / n + 0.5, 1.0 / (n + 1.0), n / (n + 1.0))
    implied: Array = n * polya_gamma_mean(np.log(p) - np.log1p(-p))
    return implied


def shrink_precision(
    data: Array, drive_c: Array, population: int, noise: NoiseVariances, alive: Array
) -> tuple[Array, float]:
    """Noise-aware shrinkage of the running N D (post-processing; the identity without noise):
    - N D moves toward T = pooled_target(N D, implied_s4(N s3)) by one positive-part James-Stein factor
      lambda: the smaller of those of the off-diagonal entries of the K x K part and of its diagonal with the
      z-c column (N s5), i.e. the share of their energy around T that is not noise (lambda = 0 when every
      unit is off: T's c-c entries are then the exact fixed point of the model without hidden units);
    - units switched off by shrink_columns (alive_k false) lose their data precision: q(w_.k) is the prior.
    A convex combination of the released matrices and a PSD target, then a public mask; returned with lambda
    (at lambda = 0 the result is PSD: masked principal parts of the PSD target)."""
    if noise.off <= 0 and noise.diagonal <= 0 and noise.s4 <= 0:
        return data, 1.0
    k = data.shape[1] - 1
    anchor = implied_s4(drive_c, population)
    target = pooled_target(data, anchor)
    residual = data - target
    rows, cols = np.triu_indices(k, 1)
    index = np.arange(k)
    factor = min(
        _shrink_factor(residual[:, rows, cols], noise.off),
        _shrink_factor(
            np.concatenate([residual[:, index, index], residual[:, index, k]], axis=1), noise.diagonal
        ),
    )
    if not np.any(alive):
        factor = 0.0
    out = target + factor * residual
    keep = np.append(alive, True).astype(np.float64)
    out *= keep[None, :, None] * keep[None, None, :]
    return out, factor


@dataclass(frozen=True)
class SigmoidBeliefNetwork:
    """VIPS-SBN with isotropic normal priors; `seed` (public) draws the initial means of W."""

    hidden: int = DEFAULT_HIDDEN
    w_variance: float = 1.0
    b_variance: float = 10.0
    c_variance: float = 10.0
    init_scale: float = 1.0
    seed: int = 0
    inner_iterations: int = DEFAULT_INNER_ITERATIONS
    frequency_copies: int = DEFAULT_FREQUENCY_COPIES
    name: str = "sbn"

    def __post_init__(self) -> None:
        if isinstance(self.hidden, bool) or not isinstance(self.hidden, int) or self.hidden < 1:
            raise ValueError("hidden must be an integer >= 1")
        for label, value in (
            ("w_variance", self.w_variance),
            ("b_variance", self.b_variance),
            ("c_variance", self.c_variance),
        ):
            if not (value > 0 and np.isfinite(value)):
                raise ValueError(f"{label} must be a finite number > 0")
        if not (self.init_scale >= 0 and np.isfinite(self.init_scale)):
            raise ValueError("init_scale must be a finite number >= 0")

    def query(self) -> SigmoidBeliefNetworkQuery:
        """The wall's query that pairs with this model."""
        return SigmoidBeliefNetworkQuery(self.hidden, self.inner_iterations, self.frequency_copies)

    def prior_precision(self) -> Array:
        """P0 = diag(1/w_variance (K times), 1/c_variance) of q(w^_j)."""
        return np.diag(np.append(np.full(self.hidden, 1.0 / self.w_variance), 1.0 / self.c_variance))

    def initial_state(self, dimension: int) -> SbnState:
        """q(w_jk) = N(m_jk, s^2) with m_jk ~ N(0, s^2) from the public seed, s = init_scale / sqrt(J); q(c)
        and q(b) the priors. The small variance keeps the E-step's penalty 1/2 sum_j xi_nj <w_jk^2>
        ~ J s^2 / 4 = init_scale^2 / 4 at any image size (the prior's w_variance gave J / 8: every unit off
        at 784 pixels, and W = 0 is a fixed point); the random means make the units distinguishable."""
        k = self.hidden
        scale = self.init_scale / np.sqrt(dimension)
        rng = np.random.default_rng(self.seed)
        mean = np.zeros((dimension, k + 1))
        mean[:, :k] = rng.normal(0.0, scale, size=(dimension, k))
        prior = self.prior_precision()
        start = np.append(np.full(k, max(1.0 / max(scale, 1e-150) ** 2, 1.0 / self.w_variance)), 0.0)
        data_eta2 = np.tile(np.diag(start) - np.diag(np.append(np.diag(prior)[:k], 0.0)), (dimension, 1, 1))
        data_eta1 = np.einsum("jab,jb->ja", prior + data_eta2, mean)
        noise = NoiseVariances(np.zeros(k))
        b_eta1 = np.zeros(k)
        b_eta2 = np.full(k, 1.0 / self.b_variance)
        return self._state(data_eta1, data_eta2, noise, b_eta1, b_eta2, {}, 1)  # no noise: N unused

    def effective_parameters(
        self,
        data_eta1: Array,
        data_eta2: Array,
        noise: NoiseVariances,
        population: int,
        hidden_drive: Array | None = None,
    ) -> tuple[Array, Array]:
        """q(w^_j)'s natural parameters from the running averages (post-processing of released values):
        the c drive N s3 denoised (denoise_frequencies); the weights' drive N s6 split into the part a
        model without hidden structure implies, N s3_j <r_k> (<r_k> = s1_k + 1/2 from `hidden_drive`, the
        running N s1), and the covariance N (s6 - s3 <r>^T), which alone is shrunk per column
        (shrink_columns: the first part is large whatever the noise, and shrinking the sum would keep noise
        columns); P0 + psd(shrink_precision(N D)). A unit whose covariance column is shrunk to 0 is off: its
        drive and its data precision are 0, so q(w_.k) is the prior."""
        k = self.hidden
        eta1 = data_eta1.copy()
        if noise.is_zero():  # exact releases: N D is PSD already (a mean of xi_nj <z^ z^^T>), no projection
            return eta1, data_eta2 + self.prior_precision()
        n = float(population)
        eta1[:, k] = denoise_frequencies(data_eta1[:, k], noise.s3, population)
        drive_b = np.zeros(k) if hidden_drive is None else hidden_drive
        on = np.clip(drive_b / n + 0.5, 0.0, 1.0)
        implied = eta1[:, k : k + 1] * on[None, :]  # N s3_j <r_k>, from the denoised s3
        shrunk = shrink_columns(data_eta1[:, :k] - implied, np.where(noise.w > 0, noise.w_raw, 0.0))
        alive = np.any(shrunk != 0, axis=0) | (noise.w <= 0)
        eta1[:, :k] = np.where(alive[None, :], shrunk + implied, 0.0)
        shrunk_eta2, factor = shrink_precision(data_eta2, eta1[:, k], population, noise, alive)
        floor = 2.0 * factor * np.sqrt((k + 1) * max(noise.off, noise.diagonal, noise.s4))
        eta2 = _project_psd(shrunk_eta2, floor) if factor > 0 else shrunk_eta2  # lambda = 0: PSD already
        eta2 += self.prior_precision()
        return eta1, eta2

    def _state(
        self,
        data_eta1: Array,
        data_eta2: Array,
        noise: NoiseVariances,
        b_eta1: Array,
        b_eta2: Array,
        statistics: dict[str, Array],
        population: int,
    ) -> SbnState:
        eta1, eta2 = self.effective_parameters(data_eta1, data_eta2, noise, population, b_eta1)
        mean, covariance = _gaussian_moments(eta1, eta2)
        return SbnState(
            eta1,
            eta2,
            b_eta1,
            b_eta2,
            mean,
            covariance,
            b_eta1 / b_eta2,
            1.0 / b_eta2,
            statistics,
            data_eta1,
            data_eta2,
            noise,
        )

    def public_params(self, state: SbnState) -> dict[str, Array]:
        return {
            "b_mean": state.b_mean.copy(),
            "w_mean": state.w_mean.copy(),
            "second_moment": state.wc_second_moment,
        }

    def m_step(
        self,
        state: SbnState,
        statistics: dict[str, Array],
        population: int,
        rho: float,
        noise_std: Mapping[str, float] | None = None,
    ) -> SbnState:
        """nu_t = (1 - rho) nu_{t-1} + rho nu_hat on the data parts, their noise variances alongside, then
        effective_parameters (module docstring)."""
        n = float(population)
        projected = project_statistics(statistics)
        data_eta1 = (1 - rho) * state.data_eta1
        data_eta1 += rho * n * np.concatenate([projected["s6"], projected["s3"][:, None]], axis=1)
        data_eta2 = (1 - rho) * state.data_eta2
        data_eta2 += rho * n * data_precision(projected)
        noise = state.noise.mixed(release_noise(statistics, noise_std, population), rho)
        xi_b = polya_gamma_mean(np.sqrt(state.b_mean**2 + state.b_variance))
        b_eta1_hat = n * projected["s1"]
        b_eta2_hat = 1.0 / self.b_variance + n * xi_b
        return self._state(
            data_eta1,
            data_eta2,
            noise,
            (1 - rho) * state.b_eta1 + rho * b_eta1_hat,
            (1 - rho) * state.b_eta2 + rho * b_eta2_hat,
            dict(statistics),
            population,
        )

    def posterior(self, state: SbnState) -> dict[str, Any]:
        second = state.wc_second_moment
        return {
            "natural_parameters": {
                "wc_precision_times_mean": state.wc_eta1.tolist(),
                "wc_precision": state.wc_eta2.tolist(),
                "b_precision_times_mean": state.b_eta1.tolist(),
                "b_precision": state.b_eta2.tolist(),
                "expected_W": state.w_mean.tolist(),
                "expected_c": state.c_mean.tolist(),
                "expected_b": state.b_mean.tolist(),
                "expected_neg_half_wc_second_moment": (-0.5 * second).tolist(),
                "expected_neg_half_b_squared": (-0.5 * (state.b_mean**2 + state.b_variance)).tolist(),
            },
            "sufficient_statistics": {k: v.tolist() for k, v in state.statistics.items()},
            "variational_parameters": {
                "hidden": state.hidden,
                "wc_mean": state.wc_mean.tolist(),
                "wc_covariance": state.wc_covariance.tolist(),
                "b_mean": state.b_mean.tolist(),
                "b_variance": state.b_variance.tolist(),
            },
            "W": state.w_mean.tolist(),
            "b": state.b_mean.tolist(),
            "c": state.c_mean.tolist(),
        }


def _plug_in_moment(W: Array, c: Array) -> Array:
    augmented = np.concatenate([W, c[:, None]], axis=1)
    moment: Array = augmented[:, :, None] * augmented[:, None, :]
    return moment


def reconstruction_logits(
    y: Array,
    W: Array,
    b: Array,
    c: Array,
    *,
    iterations: int = DEFAULT_INNER_ITERATIONS,
    second_moment: Array | None = None,
) -> Array:
    """Logits <w_j>^T <z_n> + <c_j> of p(y_nj = 1 | <z_n>), with q(z_n | y_n) from the fixed-iteration
    E-step (plug-in W, c for its second moments unless `second_moment` is given)."""
    y = np.asarray(y, dtype=np.float64)
    moment = _plug_in_moment(W, c) if second_moment is None else second_moment
    r, _ = hidden_posterior(y, b, W, moment, iterations)
    logits: Array = r @ W.T + c
    return logits


def reconstruct_proba(
    y: Array,
    W: Array,
    b: Array,
    c: Array,
    *,
    iterations: int = DEFAULT_INNER_ITERATIONS,
    second_moment: Array | None = None,
) -> Array:
    """Reconstruction probabilities p(y_nj = 1 | <z_n>) (n x J) for binary rows y."""
    logits = reconstruction_logits(y, W, b, c, iterations=iterations, second_moment=second_moment)
    return np.asarray(expit(logits))


def bernoulli_nll(y: Array, logits: Array) -> Array:
    """-log p(y_n) = sum_j softplus(a_nj) - y_nj a_nj per row, in nats (numerically stable)."""
    nll: Array = np.sum(np.logaddexp(0.0, logits) - y * logits, axis=1)
    return nll


def reconstruction_metrics(
    y: Array,
    W: Array,
    b: Array,
    c: Array,
    *,
    iterations: int = DEFAULT_INNER_ITERATIONS,
    second_moment: Array | None = None,
) -> dict[str, float]:
    """{"pixel_accuracy": mean of [p_nj > 1/2] == y_nj, "nll": mean over rows of -log p(y_n | <z_n>)}."""
    y = np.asarray(y, dtype=np.float64)
    logits = reconstruction_logits(y, W, b, c, iterations=iterations, second_moment=second_moment)
    return {
        "pixel_accuracy": float(np.mean((logits > 0) == (y > 0.5))),
        "nll": float(np.mean(bernoulli_nll(y, logits))),
    }


#: Up to this many hidden units the held-out likelihood sums over every configuration of z exactly.
EXACT_HIDDEN = 12
#: Importance samples per row beyond EXACT_HIDDEN units.
IMPORTANCE_SAMPLES = 1_000
#: The proposal's share of the prior p(z) (a defensive mixture: importance weights stay bounded).
PRIOR_SHARE = 0.2
#: Rows x configurations (or samples) evaluated at a time.
BLOCK = 1 << 22


def _log_joint(y: Array, z: Array, W: Array, b: Array, c: Array) -> Array:
    """log p(z) + log p(y | z) for rows y (n x J) and configurations z (m x K): an n x m array."""
    logits = z @ W.T + c  # m x J
    prior = z @ log_expit(b) + (1.0 - z) @ log_expit(-b)  # m
    likelihood = y @ logits.T - np.sum(np.logaddexp(0.0, logits), axis=1)  # n x m
    joint: Array = likelihood + prior
    return joint


def heldout_nll(
    y: Array,
    W: Array,
    b: Array,
    c: Array,
    *,
    samples: int = IMPORTANCE_SAMPLES,
    seed: int = 0,
    iterations: int = DEFAULT_INNER_ITERATIONS,
) -> dict[str, Any]:
    """Held-out negative log-likelihood of binary rows under the plug-in SBN, -log p(y_n) with
    p(y) = sum_z p(z) p(y | z), in nats per row (mean over rows), never reading z from anything but y.

    Up to EXACT_HIDDEN units the sum runs over all 2^K configurations ("method": "exact"). Beyond, it is
    estimated per row by importance sampling from q(z) = (1 - PRIOR_SHARE) q(z | y) + PRIOR_SHARE p(z),
    q(z | y) the mean-field E-step's: log p^(y) = log mean_s p(y, z_s) / q(z_s), whose expectation is at most
    log p(y) (Jensen), so the reported NLL is an upper bound in expectation ("importance sampling", with
    its "samples"). The samples are seeded: the rows are public and nothing is released."""
    y = np.asarray(y, dtype=np.float64)
    hidden = W.shape[1]
    if hidden <= EXACT_HIDDEN:
        grid = (np.arange(1 << hidden)[:, None] >> np.arange(hidden)[None, :]) & 1
        z = grid.astype(np.float64)
        step = max(1, BLOCK // len(z))
        log_p = np.concatenate(
            [logsumexp(_log_joint(y[i : i + step], z, W, b, c), axis=1) for i in range(0, len(y), step)]
        )
        return {"nll": float(-np.mean(log_p)), "method": "exact", "samples": 1 << hidden}
    rng = np.random.default_rng(seed)
    r, _ = hidden_posterior(y, b, W, _plug_in_moment(W, c), iterations)
    proposal = (1.0 - PRIOR_SHARE) * r + PRIOR_SHARE * expit(b)[None, :]
    log_p = np.empty(len(y))
    for n in range(len(y)):
        q = np.clip(proposal[n], 1e-12, 1.0 - 1e-12)
        z = (rng.random((samples, hidden)) < q).astype(np.float64)
        log_q = z @ np.log(q) + (1.0 - z) @ np.log1p(-q)
        log_p[n] = logsumexp(_log_joint(y[n : n + 1], z, W, b, c)[0] - log_q) - np.log(samples)
    return {"nll": float(-np.mean(log_p)), "method": "importance sampling", "samples": samples}


def pixel_mean_metrics(train: Array, test: Array) -> dict[str, float]:
    """The baseline that ignores structure: p_j = the training frequency of pixel j (smoothed by 1/2)."""
    n = train.shape[0]
    p = (np.sum(train, axis=0) + 0.5) / (n + 1.0)
    logits = np.log(p) - np.log1p(-p)
    return {
        "pixel_accuracy": float(np.mean((logits > 0) == (test > 0.5))),
        "nll": float(np.mean(bernoulli_nll(test, np.broadcast_to(logits, test.shape)))),
    }
