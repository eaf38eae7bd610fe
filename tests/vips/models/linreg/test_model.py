"""VIPS for conjugate Bayesian linear regression end to end (wall + loop + M-step): exactness at sigma = 0,
recovery of known weights, a private fit through the real gate, the predictive distribution, and the public
diabetes data of vips.datasets.regression."""

from __future__ import annotations

import math

import numpy as np
import pytest
from sklearn.linear_model import Ridge

from privacy_wall.accounting.calibration import epsilon
from privacy_wall.gate import Gate, PrivacyError
from privacy_wall.ledger.base import InMemoryLedger
from tests.fitting import fit_through_gate, relative_error
from tests.privacy_wall.queries.test_linreg import regression_store
from vips.datasets.regression import load_regression
from vips.models.linreg.model import BayesianLinearRegression, LinregState, predict, rmse
from vips.runner import LoopSettings

D = 5
N = 20_000
NOISE_SD = 0.05


def synthetic(seed: int, n: int = N) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows in random directions with norms in [0.2, 1], weights of norm 0.8, Gaussian noise of sd 0.05:
    |w^T x| <= 0.8, so |y| <= 1 unless the noise exceeds 4 sd (clipped then; essentially never)."""
    rng = np.random.default_rng(seed)
    w = rng.normal(size=D)
    w *= 0.8 / np.linalg.norm(w)
    z = rng.normal(size=(n, D))
    x = z / np.linalg.norm(z, axis=1, keepdims=True) * rng.uniform(0.2, 1.0, size=(n, 1))
    y = np.clip(x @ w + rng.normal(scale=NOISE_SD, size=n), -1.0, 1.0)
    return x, y, w


@pytest.fixture(scope="module")
def data() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return synthetic(0)


def exact_posterior(
    x: np.ndarray, y: np.ndarray, prior_precision: float, a0: float, b0: float
) -> tuple[np.ndarray, np.ndarray, float, float]:
    """The Normal-Gamma posterior in closed form (e.g. Bishop 2006, ex. 3.12; Murphy 2012, Sec. 7.6.3):
    Lambda_N = lambda0 I + X^T X, m_N = Lambda_N^-1 X^T y, a_N = a0 + N/2,
    b_N = b0 + (y^T y - m_N^T Lambda_N m_N) / 2."""
    n, d = x.shape
    precision = prior_precision * np.eye(d) + x.T @ x
    mean = np.linalg.solve(precision, x.T @ y)
    return mean, precision, a0 + n / 2, b0 + (y @ y - mean @ precision @ mean) / 2


def fit(
    x: np.ndarray,
    y: np.ndarray,
    model: BayesianLinearRegression,
    *,
    sigma: float,
    batch_size: int,
    iterations: int,
    tau0: float = 0.0,
    kappa: float = 1.0,
    seed: int | None = 0,
) -> tuple[LinregState, InMemoryLedger]:
    """VIPS through the real gate: a public seeded store at sigma = 0, a private (CSPRNG) one otherwise."""
    return fit_through_gate(
        regression_store("regression", x, y, public=sigma == 0),
        model,
        model.query(),
        LoopSettings(iterations, batch_size, sigma, tau0, kappa),
        seed=seed,
    )


@pytest.mark.parametrize(("prior_precision", "a0", "b0", "n"), [(1.0, 1.0, 1.0, N), (3.0, 2.0, 0.5, 40)])
def test_batch_mode_at_sigma_zero_is_the_exact_posterior(
    prior_precision: float, a0: float, b0: float, n: int
) -> None:
    """S = N, sigma = 0 (rho = 1): the released means times N are the data statistics, so the posterior is
    the closed-form one up to rounding (observed <= 1e-14 relative; 1e-8 asked). N = 40 is where the prior and
    (a0, b0) matter: a wrong prior term, factor 1/2 in a_N or b_N would be far outside 1e-8."""
    x, y, _ = synthetic(1, n)
    model = BayesianLinearRegression(prior_precision=prior_precision, a0=a0, b0=b0)
    state, ledger = fit(x, y, model, sigma=0.0, batch_size=n, iterations=3)
    mean, precision, a_n, b_n = exact_posterior(x, y, prior_precision, a0, b0)
    assert relative_error(state.mean, mean) < 1e-8
    assert relative_error(state.precision_scale, precision) < 1e-8
    assert state.noise_shape == pytest.approx(a_n, rel=1e-8)
    assert state.noise_rate == pytest.approx(b_n, rel=1e-8)
    covariance = b_n / (a_n - 1) * np.linalg.inv(precision)  # the marginal Student-t covariance of w
    assert relative_error(state.covariance, covariance) < 1e-8
    assert len(ledger.charges()) == 3 and ledger.epsilon_spent() == math.inf


def test_one_batch_iteration_is_already_exact(data: tuple[np.ndarray, np.ndarray, np.ndarray]) -> None:
    """No latent variables: the E-step does not depend on q, so VIPS is exact after its first batch step."""
    x, y, _ = data
    state, _ = fit(x, y, BayesianLinearRegression(), sigma=0.0, batch_size=N, iterations=1)
    mean, _, _, _ = exact_posterior(x, y, 1.0, 1.0, 0.01)
    assert relative_error(state.mean, mean) < 1e-8


def test_recovers_known_weights_and_noise(data: tuple[np.ndarray, np.ndarray, np.ndarray]) -> None:
    """Exact posterior on N = 20,000 rows: the posterior sd of each weight is ~0.05 / sqrt(N E[x_i^2])
    ~ 1e-3, so |m - w| ~ 2e-3 against |w| = 0.8 (observed 0.3%; asked < 2%), and E[1/tau] estimates
    the noise variance 0.0025 within its sampling error ~1% plus the priors' pull (b0 = 0.01 and the ridge
    term lambda0 |m|^2 / 2 add ~1% to b_N here; b0 = 1 would add 4%): asked 5%. The true w lies within
    ~4 posterior sds in every coordinate."""
    x, y, w = data
    state, _ = fit(x, y, BayesianLinearRegression(), sigma=0.0, batch_size=N, iterations=1)
    assert relative_error(state.mean, w) < 0.02
    assert state.noise_variance == pytest.approx(NOISE_SD**2, rel=0.05)
    z = (state.mean - w) / np.sqrt(np.diag(state.covariance))
    assert np.all(np.abs(z) < 4.5), z


def test_minibatch_at_sigma_zero_approaches_the_exact_posterior(
    data: tuple[np.ndarray, np.ndarray, np.ndarray],
) -> None:
    """Stochastic VI (S = 2000, rho_t = 1/t, T = 30): the iterate is the average of 30 unbiased minibatch
    estimates of the natural parameters, so its mean is within ~1% of the exact one (observed 0.3%;
    asked 2%)."""
    x, y, w = data
    state, _ = fit(x, y, BayesianLinearRegression(), sigma=0.0, batch_size=2000, iterations=30, seed=2)
    mean, _, _, _ = exact_posterior(x, y, 1.0, 1.0, 0.01)
    assert relative_error(state.mean, mean) < 0.02
    assert relative_error(state.mean, w) < 0.03


def test_private_fit_through_the_gate_is_charged_and_informative(
    data: tuple[np.ndarray, np.ndarray, np.ndarray],
) -> None:
    """S = 2000 of N = 20,000, sigma = 2, T = 10, rho_t = 1/t: every iteration is charged once and the ledger
    spends the accountant's epsilon for that schedule (1.83 at delta = 1e-5). The fit stays useful: the
    noise on N <y x> has std ~N sigma sqrt(3) 2 / S ~ 35 per coordinate per release against a signal of
    ~N |w| E[||x||^2] / D ~ 1,200, averaged over 10 releases; 40 private fits had relative errors to the
    truth of median 0.041, max 0.075 (asked < 0.25). Private releases cannot be seeded."""
    x, y, w = data
    sigma, batch_size, iterations = 2.0, 2000, 10
    with pytest.raises(PrivacyError):
        Gate(regression_store("private", x, y, public=False), InMemoryLedger(delta=1e-5), seed=0)
    state, ledger = fit(
        x, y, BayesianLinearRegression(), sigma=sigma, batch_size=batch_size, iterations=iterations, seed=None
    )
    assert len(ledger.charges()) == iterations
    assert ledger.epsilon_spent() == pytest.approx(epsilon(sigma, batch_size, N, iterations, 1e-5), rel=1e-9)
    assert np.isfinite(state.mean).all() and state.noise_rate > 0
    assert relative_error(state.mean, w) < 0.25


def test_predictive_mean_and_variance_match_monte_carlo() -> None:
    """On N = 30 rows (so the posterior is wide), draws of tau ~ Gamma(a, b), w | tau ~ N(m, (tau Lambda)^-1),
    y ~ N(w^T x, 1/tau) have mean m^T x and variance E[1/tau] (1 + x^T Lambda^-1 x) = predict's. 400,000
    draws: the Monte Carlo sd of the variance is ~sqrt(2 / 4e5) ~ 0.2% of it times the Student-t kurtosis
    factor (a = 16: ~1.2), so 2% is > 8 sds."""
    x, y, _ = synthetic(3, 30)
    model = BayesianLinearRegression(prior_precision=2.0, a0=1.0, b0=0.1)
    state, _ = fit(x, y, model, sigma=0.0, batch_size=30, iterations=1)
    test_x = synthetic(4, 5)[0]
    mean, variance = predict(state.mean, state.covariance, state.noise_variance, test_x)
    rng = np.random.default_rng(5)
    draws = 400_000
    tau = rng.gamma(state.noise_shape, 1.0 / state.noise_rate, size=draws)
    chol = np.linalg.cholesky(state.scale_inverse)
    w = state.mean + (rng.standard_normal((draws, D)) @ chol.T) / np.sqrt(tau)[:, None]
    samples = w @ test_x.T + rng.standard_normal((draws, 5)) / np.sqrt(tau)[:, None]
    np.testing.assert_allclose(samples.mean(axis=0), mean, atol=5 * np.sqrt(variance.max() / draws))
    np.testing.assert_allclose(samples.var(axis=0), variance, rtol=0.02)


def test_diabetes_posterior_mean_is_ridge_regression() -> None:
    """On the public diabetes split, the exact posterior mean is ridge regression with penalty lambda0 (the
    prior w | tau ~ N(0, (tau lambda0)^-1 I) scales with the noise precision): predictions agree with
    scikit-learn's Ridge(alpha = lambda0, no separate intercept) to rounding. Test RMSE is then the ridge
    fit's: 0.331 in scaled units, 53.1 in the original ones (observed; OLS 53.3), well below the 0.481
    (77) of predicting the training mean."""
    split = load_regression("diabetes")
    train, test = split.train, split.test
    model = BayesianLinearRegression(prior_precision=0.1)
    n = train.features.shape[0]
    state, _ = fit(train.features, train.targets, model, sigma=0.0, batch_size=n, iterations=1)
    ridge = Ridge(alpha=0.1, fit_intercept=False, solver="cholesky").fit(train.features, train.targets)
    mean, variance = predict(state.mean, state.covariance, state.noise_variance, test.features)
    np.testing.assert_allclose(mean, ridge.predict(test.features), rtol=1e-8, atol=1e-10)
    assert np.all(variance > state.noise_variance)
    error = rmse(mean, test.targets)
    baseline = rmse(np.full(test.targets.shape, train.targets.mean()), test.targets)
    assert error < 0.8 * baseline, (error, baseline)
    assert error * split.target_scale < 60.0


def coverage_and_slope(fits: list[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> tuple[float, float]:
    """(share of true weights inside their 90% intervals, slope of the means on the truth through 0)."""
    truth = np.concatenate([w for w, _, _ in fits])
    mean = np.concatenate([m for _, m, _ in fits])
    sd = np.concatenate([s for _, _, s in fits])
    return float(np.mean(np.abs(truth - mean) <= 1.6448536 * sd)), float(truth @ mean / (truth @ truth))


def test_private_intervals_cover_the_true_weights_at_their_nominal_rate() -> None:
    """Issue 51: the posterior's covariance carries the release noise (propagated to first order), so 90%
    intervals of a fit given only epsilon 1 cover about 90% of known weights (28% when the noisy statistics
    were read as exact). 60 synthetic datasets (bench/calibration.py's family) x 10 weights: over 15
    repeats of these fits (private noise cannot be seeded) coverage was 0.907 +- 0.011 (0.895-0.927) and
    the slope 0.993-1.001, so 0.80-0.97 is over 5 standard deviations from the mean."""
    from bench.calibration import draw
    from vips.estimators import VIPSLinearRegression

    fits = []
    for seed in range(2_000, 2_060):
        data = draw("linreg", seed, 10_000)
        model = VIPSLinearRegression(epsilon=1.0).fit(data.train, data.y)
        fits.append((data.weights, model.coef_, np.sqrt(np.diag(model.covariance_))))
    coverage, slope = coverage_and_slope(fits)
    assert 0.80 <= coverage <= 0.97, coverage
    assert 0.9 <= slope <= 1.1, slope


def test_release_noise_adds_its_propagated_covariance_and_nothing_at_sigma_zero() -> None:
    """C = Lambda^-1 (s_e^2 I + s_L^2 (tr S I + S - diag S)) Lambda^-1 with S = E[w w^T], on top of
    E[1/tau] Lambda^-1; none without noise."""
    model = BayesianLinearRegression()
    rng = np.random.default_rng(3)
    x = rng.normal(size=(500, 3)) / 3
    y = np.clip(x @ np.array([0.5, -0.2, 0.1]) + rng.normal(0, 0.1, 500), -1, 1)
    stats = {"xx": x.T @ x / 500, "yx": x.T @ y / 500, "yy": np.array([y @ y / 500])}
    exact = model.m_step(model.initial_state(3), stats, 500, 1.0)
    noisy = model.m_step(model.initial_state(3), stats, 500, 1.0, {"xx": 0.01, "yx": 0.02, "yy": 0.01})
    np.testing.assert_allclose(exact.covariance, exact.noise_variance * exact.scale_inverse)
    base = noisy.noise_variance * noisy.scale_inverse
    second = np.outer(noisy.mean, noisy.mean) + base
    middle = 25.0 * (np.trace(second) * np.eye(3) + second - np.diag(np.diag(second))) + 100.0 * np.eye(3)
    np.testing.assert_allclose(
        noisy.covariance, base + noisy.scale_inverse @ middle @ noisy.scale_inverse, rtol=1e-10
    )
    assert (noisy.precision_noise_variance, noisy.eta_noise_variance) == pytest.approx((25.0, 100.0))
