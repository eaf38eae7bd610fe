"""VIPS for Bayesian logistic regression end to end (wall + loop + M-step): recovery at sigma = 0, agreement
with an independent non-private VB solver, smooth degradation under privacy, and the probit prediction."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.special import expit

from privacy_wall.accounting.calibration import epsilon
from privacy_wall.data.store import InMemoryTabularStore
from privacy_wall.ledger.base import InMemoryLedger
from privacy_wall.queries.blr import LogisticRegressionQuery
from tests.fitting import cosine, fit_through_gate, relative_error
from vips.estimators import VIPSLogisticRegression
from vips.models.blr.model import BayesianLogisticRegression, BlrState, predict_proba
from vips.runner import LoopSettings

D = 10
N = 20_000
A0, B0 = 1.0, 1.0


def synthetic(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows in uniformly random directions with norms in [0.2, 1]; true weights of norm 10, so the logits
    have std ~ 2.1 and the labels carry a strong signal."""
    rng = np.random.default_rng(seed)
    w = rng.normal(size=D)
    w *= 10.0 / np.linalg.norm(w)
    z = rng.normal(size=(N, D))
    x = z / np.linalg.norm(z, axis=1, keepdims=True) * rng.uniform(0.2, 1.0, size=(N, 1))
    y = (rng.random(N) < expit(x @ w)).astype(np.float64)
    return x, y, w


@pytest.fixture(scope="module")
def data() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return synthetic(0)


def direct_vb(x: np.ndarray, y: np.ndarray, a0: float, b0: float) -> tuple[np.ndarray, np.ndarray, float]:
    """Non-private mean-field VB for BLR, written from Jaakkola and Jordan (2000) with a Gamma hyperprior.

    q(w) = N(m, S), q(alpha) = Gamma(a_N, b_N); local bound lambda(xi) = tanh(xi/2) / (4 xi) with
    xi_n^2 = x_n^T (S + m m^T) x_n;  S^-1 = E[alpha] I + 2 sum_n lambda(xi_n) x_n x_n^T,
    m = S sum_n (y_n - 1/2) x_n;  a_N = a0 + d/2, b_N = b0 + (m^T m + tr S) / 2.
    Full-batch coordinate ascent (alpha updated right after w) to a relative change below 1e-13.
    """
    d = x.shape[1]
    target = x.T @ (y - 0.5)
    mean, cov, e_alpha = np.zeros(d), np.eye(d) * b0 / a0, a0 / b0
    for _ in range(10_000):
        xi = np.sqrt(np.einsum("ij,jk,ik->i", x, cov + np.outer(mean, mean), x))
        lam = np.where(xi > 1e-8, np.tanh(xi / 2) / (4 * np.maximum(xi, 1e-8)), 1 / 8)
        cov = np.linalg.inv(e_alpha * np.eye(d) + 2 * (x * lam[:, None]).T @ x)
        new_mean = cov @ target
        e_alpha = (a0 + d / 2) / (b0 + (new_mean @ new_mean + np.trace(cov)) / 2)
        converged = np.linalg.norm(new_mean - mean) <= 1e-13 * np.linalg.norm(new_mean)
        mean = new_mean
        if converged:
            return mean, cov, e_alpha
    raise AssertionError("direct VB did not converge")


@pytest.fixture(scope="module")
def reference(data: tuple[np.ndarray, np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray, float]:
    x, y, _ = data
    return direct_vb(x, y, A0, B0)


def fit(
    x: np.ndarray,
    y: np.ndarray,
    *,
    sigma: float,
    batch_size: int,
    iterations: int,
    tau0: float,
    kappa: float,
    seed: int | None,
) -> tuple[BlrState, InMemoryLedger]:
    """VIPS through the real gate: public + seeded at sigma = 0, private (CSPRNG) otherwise. The M-step is
    the issue-12 step (shrink_h=False), on which the noise levels of test_private_fits_degrade_smoothly were
    calibrated; at sigma = 0 it is the default step. H's thresholding, the default with noise, is tested in
    tests/vips/models/blr/test_shrinkage.py."""
    return fit_through_gate(
        InMemoryTabularStore("synthetic", x, y, public=sigma == 0),
        BayesianLogisticRegression(A0, B0, shrink_h=False, laplace_from=0),
        LogisticRegressionQuery(),
        LoopSettings(iterations, batch_size, sigma, tau0, kappa),
        seed=seed,
    )


def test_direct_vb_recovers_the_weights(
    data: tuple[np.ndarray, np.ndarray, np.ndarray], reference: tuple
) -> None:
    """Sanity of the reference itself: with N = 20,000 the posterior sd per weight is ~0.1, so the error norm
    is ~0.3 against |w| = 10 and the cosine ~0.9995."""
    _, _, w = data
    assert cosine(reference[0], w) > 0.99


def test_batch_mode_at_sigma_zero_is_the_direct_vb_solution(
    data: tuple[np.ndarray, np.ndarray, np.ndarray], reference: tuple
) -> None:
    """Batch mode (S = N, rho = 1: kappa = 0) is exactly full-batch coordinate ascent, so VIPS converges to
    the same fixed point; it contracts by well over a factor 2 per iteration here, so after 50 iterations the
    remaining gap is far below the 1% asked. A wrong factor anywhere in the E-step or M-step (E[xi], N, the
    alpha update) moves the fixed point by much more than 1%."""
    x, y, w = data
    state, ledger = fit(x, y, sigma=0.0, batch_size=N, iterations=50, tau0=0.0, kappa=0.0, seed=0)
    mean, cov, _ = reference
    assert relative_error(state.mean, mean) < 1e-2
    assert relative_error(state.covariance, cov) < 1e-2
    assert cosine(state.mean, w) > 0.99
    assert len(ledger.charges()) == 50 and ledger.epsilon_spent() == math.inf


def test_batch_mode_matches_direct_vb_where_the_hyperprior_matters() -> None:
    """N = 200 rows and |w| = 3: the prior precision E[alpha] ~ 1.7 is comparable to the data's curvature,
    so an error in q(alpha) (a_N, b_N) or in how E[alpha] enters the precision changes the solution.
    VIPS in batch mode and the direct solver are the same fixed-point map, contracting by ~1e-6 in 20
    iterations here, so after 100 iterations they agree to rounding; 1e-8 leaves a wide margin."""
    rng = np.random.default_rng(5)
    n = 200
    w = rng.normal(size=D)
    w *= 3.0 / np.linalg.norm(w)
    z = rng.normal(size=(n, D))
    x = z / np.linalg.norm(z, axis=1, keepdims=True) * rng.uniform(0.2, 1.0, size=(n, 1))
    y = (rng.random(n) < expit(x @ w)).astype(np.float64)
    mean, cov, e_alpha = direct_vb(x, y, A0, B0)
    state, _ = fit(x, y, sigma=0.0, batch_size=n, iterations=100, tau0=0.0, kappa=0.0, seed=0)
    assert relative_error(state.mean, mean) < 1e-8
    assert relative_error(state.covariance, cov) < 1e-8
    assert state.expected_alpha == pytest.approx(e_alpha, rel=1e-8)


def test_estimator_batch_mode_is_the_direct_vb_solution(
    data: tuple[np.ndarray, np.ndarray, np.ndarray], reference: tuple
) -> None:
    """The researcher's estimator with batch_size=None runs batch mode, which (docs/design.md section 4) uses
    rho = 1. With rho_t = 1/t instead the iterate is a running average of every past update, including
    those made from the prior, and is still ~10% away from the fixed point after 50 iterations."""
    x, y, _ = data
    model = VIPSLogisticRegression(sigma=0.0, iterations=50, a0=A0, b0=B0, random_state=0).fit(x, y)
    assert relative_error(model.coef_, reference[0]) < 1e-2


def test_minibatch_at_sigma_zero_recovers_the_weights(
    data: tuple[np.ndarray, np.ndarray, np.ndarray], reference: tuple
) -> None:
    """Stochastic VI (S = 2000, rho_t = (1 + t)^-0.7, T = 100): the iterate fluctuates around the VB solution
    by ~2% (observed), which costs ~2e-4 of cosine; 0.99 leaves room for 7% error."""
    x, y, w = data
    state, _ = fit(x, y, sigma=0.0, batch_size=2000, iterations=100, tau0=1.0, kappa=0.7, seed=1)
    assert cosine(state.mean, w) > 0.99
    # The scale too, not only the direction (a batch mean divided by N instead of S keeps the direction
    # but shrinks the weights several-fold): within 10% of the VB solution (observed: 1.6%).
    assert relative_error(state.mean, reference[0]) < 0.1


@pytest.mark.slow
def test_private_fits_degrade_smoothly(
    data: tuple[np.ndarray, np.ndarray, np.ndarray], reference: tuple
) -> None:
    """Minibatch VIPS (S = 2000, T = 30, tau0 = 1, kappa = 0.7, delta = 1e-5) at three noise levels whose
    budget prices (the filter) are ~2.19, ~0.59 and ~0.17 (each job alone by `pld` ~1.3, ~0.36 and ~0.1).
    The error against the non-private VB solution must grow as epsilon falls, while the fits stay usable.

    Private releases cannot be seeded, so this test is random. Calibrated on 400 simulated fits per level:
    relative errors have medians 0.073 / 0.18 / 0.43 (the middle level has a heavy right tail, up to 1.0),
    cosines to the truth >= 0.995 / 0.968 / 0.89. Medians of 15 fits per level kept the ordering in all of
    200,000 bootstrap draws, and the cosine bounds below are far outside the simulated ranges.
    """
    x, y, w = data
    vb_mean = reference[0]
    runs = 15
    levels = (2.1, 5.6, 18.0)
    epsilons = [epsilon(sigma, 2000, N, 30, 1e-5) for sigma in levels]
    assert epsilons[0] > 1.8 and epsilons[2] < 0.2
    assert epsilons[0] > epsilons[1] > epsilons[2]
    errors, cosines = [], []
    for sigma, eps in zip(levels, epsilons, strict=True):
        level_errors, level_cosines = [], []
        for _ in range(runs):
            state, ledger = fit(
                x, y, sigma=sigma, batch_size=2000, iterations=30, tau0=1.0, kappa=0.7, seed=None
            )
            assert np.isfinite(state.mean).all()
            assert ledger.epsilon_spent() == pytest.approx(eps, rel=1e-9)
            level_errors.append(relative_error(state.mean, vb_mean))
            level_cosines.append(cosine(state.mean, w))
        errors.append(float(np.median(level_errors)))
        cosines.append(float(np.mean(level_cosines)))
    assert errors[0] < errors[1] < errors[2], errors
    assert cosines[0] > cosines[2], cosines
    assert cosines[0] > 0.99, "at epsilon ~3 the fit is close to the non-private one"
    assert cosines[2] > 0.8, "at epsilon ~0.3 the fit degrades but stays informative"


def test_predict_proba_matches_monte_carlo() -> None:
    """The probit approximation of E[sigmoid(a)], a ~ N(mu^T x, x^T Sigma x), against Monte Carlo.

    The approximation's own error is < 0.014 for activation variances <= 10 (its worst case over all means,
    computed by quadrature); 400,000 draws give a Monte Carlo sd <= 0.5 / sqrt(4e5) = 8e-4, so 0.02 leaves
    > 7 Monte Carlo sds. Forgetting the variance term (sigmoid(mu^T x)) errs by up to ~0.15 on these rows.
    """
    rng = np.random.default_rng(400)
    mean = rng.normal(scale=2.0, size=4)
    factor = rng.normal(size=(4, 4))
    covariance = factor @ factor.T / 2 + 0.5 * np.eye(4)
    features = rng.normal(size=(40, 4))
    features /= np.linalg.norm(features, axis=1, keepdims=True)
    features *= rng.uniform(0.0, 1.5, size=(40, 1))
    approx = predict_proba(mean, covariance, features)
    activation_mean = features @ mean
    activation_var = np.einsum("ij,jk,ik->i", features, covariance, features)
    assert activation_var.max() <= 10.0
    draws = rng.standard_normal(400_000)
    for i in range(features.shape[0]):
        mc = float(np.mean(expit(activation_mean[i] + math.sqrt(activation_var[i]) * draws)))
        assert abs(approx[i] - mc) < 0.02, (i, approx[i], mc)
    assert np.max(np.abs(approx - expit(activation_mean))) > 0.05, "the test rows must exercise the variance"
