"""Sigmoid belief network, public half (VIPS paper Sec. 7, Alg. 6, Appendix Sec. 5).

Priors: W_jk ~ N(0, w_variance), c_j ~ N(0, c_variance), b_k ~ N(0, b_variance) (isotropic normals; the
paper's TPBN shrinkage prior on W is not implemented). Variational family q(b) prod_j q(w^_j) with
q(w^_j) = N(mu_j, Sigma_j) over the augmented row w^_j = (w_j, c_j) (K + 1 dimensional: the paper's q(w_j)
and q(c) in one Gaussian, which the natural parameter -1/2 diag(c) W of Eq. 65 couples anyway) and
q(b_k) = N(mu_bk, sigma_bk^2).

From the released batch means as the wall's postprocess returns them (s1 = <r - 1/2>, s3 = <y - 1/2>,
s4 = <xi>, s5 = <xi r^T>, s6 = <(y - 1/2) r^T>, s7 = <xi_j <z z^T>>; see privacy_wall.queries.sbn), after
`project_statistics` (s5 and diag(s7) combined, |s6_jk| <= <r_k> / 2):
  nu_hat(w^_j) = (N (s6_j, s3_j),  P0 + N psd([[s7_j, s5_j], [s5_j^T, s4_j]]))   (precision * mean, precision)
  nu_hat(b)    = (N s1,  1 / b_variance + N <xi^(1)>),  <xi^(1)_k> = E[PG(1, sqrt(<b_k^2>))]   (Eq. 68)
  nu_t = (1 - rho_t) nu_{t-1} + rho_t nu_hat
where P0 = diag(1/w_variance, ..., 1/c_variance) and psd() projects the noisy (K + 1) x (K + 1) data part to
the PSD cone (post-processing; a no-op at sigma = 0), so every precision stays >= P0. <xi^(1)> uses the
current q(b): it depends on the released posterior only and needs no noise (the paper's s2).
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
from scipy.special import expit

from privacy_wall.queries.blr import polya_gamma_mean
from privacy_wall.queries.sbn import DEFAULT_INNER_ITERATIONS, SigmoidBeliefNetworkQuery, hidden_posterior
from worker.models.base import Array

#: The service's default number of hidden units (option "hidden").
DEFAULT_HIDDEN = 50


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


def _project_psd(matrices: Array) -> Array:
    """Batched nearest (Frobenius) PSD matrices of the symmetric parts."""
    sym = (matrices + np.swapaxes(matrices, -1, -2)) / 2.0
    eigenvalues, vectors = np.linalg.eigh(sym)
    projected: Array = np.einsum("jak,jk,jbk->jab", vectors, np.maximum(eigenvalues, 0.0), vectors)
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


@dataclass(frozen=True)
class SigmoidBeliefNetwork:
    """VIPS-SBN with isotropic normal priors; `seed` (public) draws the initial means of W."""

    hidden: int = DEFAULT_HIDDEN
    w_variance: float = 1.0
    b_variance: float = 10.0
    c_variance: float = 10.0
    init_scale: float = 0.5
    seed: int = 0
    inner_iterations: int = DEFAULT_INNER_ITERATIONS
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
        return SigmoidBeliefNetworkQuery(self.hidden, self.inner_iterations)

    def prior_precision(self) -> Array:
        """P0 = diag(1/w_variance (K times), 1/c_variance) of q(w^_j)."""
        return np.diag(np.append(np.full(self.hidden, 1.0 / self.w_variance), 1.0 / self.c_variance))

    def initial_state(self, dimension: int) -> SbnState:
        """The prior, except that <W> is drawn N(0, init_scale^2) from the public seed (so the hidden
        units are not interchangeable at the first E-step)."""
        k = self.hidden
        rng = np.random.default_rng(self.seed)
        mean = np.zeros((dimension, k + 1))
        mean[:, :k] = rng.normal(0.0, self.init_scale, size=(dimension, k))
        eta2 = np.tile(self.prior_precision(), (dimension, 1, 1))
        eta1 = np.einsum("jab,jb->ja", eta2, mean)
        b_eta1 = np.zeros(k)
        b_eta2 = np.full(k, 1.0 / self.b_variance)
        return self._state(eta1, eta2, b_eta1, b_eta2, {})

    def _state(
        self, eta1: Array, eta2: Array, b_eta1: Array, b_eta2: Array, statistics: dict[str, Array]
    ) -> SbnState:
        mean, covariance = _gaussian_moments(eta1, eta2)
        return SbnState(
            eta1, eta2, b_eta1, b_eta2, mean, covariance, b_eta1 / b_eta2, 1.0 / b_eta2, statistics
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
        n = float(population)
        projected = project_statistics(statistics)
        eta1_hat = n * np.concatenate([projected["s6"], projected["s3"][:, None]], axis=1)
        eta2_hat = self.prior_precision() + n * _project_psd(data_precision(projected))
        xi_b = polya_gamma_mean(np.sqrt(state.b_mean**2 + state.b_variance))
        b_eta1_hat = n * projected["s1"]
        b_eta2_hat = 1.0 / self.b_variance + n * xi_b
        return self._state(
            (1 - rho) * state.wc_eta1 + rho * eta1_hat,
            (1 - rho) * state.wc_eta2 + rho * eta2_hat,
            (1 - rho) * state.b_eta1 + rho * b_eta1_hat,
            (1 - rho) * state.b_eta2 + rho * b_eta2_hat,
            dict(statistics),
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


def pixel_mean_metrics(train: Array, test: Array) -> dict[str, float]:
    """The baseline that ignores structure: p_j = the training frequency of pixel j (smoothed by 1/2)."""
    n = train.shape[0]
    p = (np.sum(train, axis=0) + 0.5) / (n + 1.0)
    logits = np.log(p) - np.log1p(-p)
    return {
        "pixel_accuracy": float(np.mean((logits > 0) == (test > 0.5))),
        "nll": float(np.mean(bernoulli_nll(test, np.broadcast_to(logits, test.shape)))),
    }
