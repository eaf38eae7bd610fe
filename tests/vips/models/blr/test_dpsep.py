"""DP-SEP end to end (wall + loop + public half) for logistic and linear regression: recovery at sigma = 0,
UCI Adult against non-private VIPS-BLR, exactness of the Gaussian sites, the damped update, and private fits
that are charged once per iteration and cannot be seeded."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from privacy_wall.accounting.calibration import epsilon
from privacy_wall.data.store import Batch, InMemoryTabularStore, RowStore
from privacy_wall.gate import Gate, PrivacyError
from privacy_wall.ledger.base import InMemoryLedger
from tests.fitting import cosine, fit_through_gate, relative_error
from tests.privacy_wall.queries.test_linreg import regression_store
from tests.vips.models.blr.test_model import D, N
from tests.vips.models.blr.test_model import synthetic as logistic_data  # the same synthetic logistic data
from vips.datasets.adult import load_adult
from vips.models.blr.dpsep import DpSepLogisticRegression, DpSepState, site_norm
from vips.models.blr.model import predict_proba
from vips.models.linreg.dpsep import DpSepLinearRegression
from vips.models.linreg.model import predict, rmse
from vips.runner import LoopSettings

#: Non-private VIPS-BLR's test AUC on Adult (bench/README.md: batch, sigma = 0, T = 10).
VIPS_BLR_ADULT_AUC = 0.8997

Model = DpSepLogisticRegression | DpSepLinearRegression


def linear_data(seed: int, n: int = N) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Weights of norm 0.8, noise sd 0.05, targets clipped to [-1, 1] (essentially never active)."""
    rng = np.random.default_rng(seed)
    w = rng.normal(size=D)
    w *= 0.8 / np.linalg.norm(w)
    z = rng.normal(size=(n, D))
    x = z / np.linalg.norm(z, axis=1, keepdims=True) * rng.uniform(0.2, 1.0, size=(n, 1))
    return x, np.clip(x @ w + rng.normal(scale=0.05, size=n), -1.0, 1.0), w


@pytest.fixture(scope="module")
def logistic() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return logistic_data(0)


def fit(
    store: RowStore,
    model: Model,
    *,
    sigma: float,
    batch_size: int,
    iterations: int,
    tau0: float = 0.0,
    kappa: float = 1.0,
    seed: int | None = 0,
) -> tuple[DpSepState, InMemoryLedger, list[DpSepState]]:
    """DP-SEP through the real gate; returns the final state, the ledger and every iterate."""
    states: list[DpSepState] = []
    state, ledger = fit_through_gate(
        store,
        model,
        model.query(),
        LoopSettings(iterations, batch_size, sigma, tau0, kappa),
        seed=seed,
        on_iteration=lambda t, release, state: states.append(state),
    )
    return state, ledger, states


def exact_gaussian_posterior(
    x: np.ndarray, y: np.ndarray, prior_variance: float, noise_variance: float
) -> tuple[np.ndarray, np.ndarray]:
    """w ~ N(0, v0 I), y | w ~ N(Xw, s^2 I): precision I / v0 + X^T X / s^2, mean = its inverse times
    X^T y / s^2."""
    precision = np.eye(x.shape[1]) / prior_variance + x.T @ x / noise_variance
    return np.linalg.solve(precision, x.T @ y / noise_variance), precision


# --------------------------------------------------------------------------------------------------------
# Logistic regression.


def test_batch_sigma_zero_recovers_synthetic_logistic_weights(
    logistic: tuple[np.ndarray, np.ndarray, np.ndarray],
) -> None:
    """S = N, sigma = 0, damping 1 (averaged EP): converges to its fixed point within 10 iterations (last step
    ~1e-12 relative, observed) with cosine 0.9996 to the true weights (asked 0.95; the posterior sd per
    weight is ~0.1 against |w| = 10). C = 1 clips no site here (|alpha| ||x|| <= ~1, beta <= 1/4)."""
    x, y, w = logistic
    store = InMemoryTabularStore("logistic", x, y, public=True)
    state, ledger, states = fit(store, DpSepLogisticRegression(), sigma=0.0, batch_size=N, iterations=10)
    assert cosine(state.mean, w) > 0.95
    assert relative_error(states[-1].mean, states[-2].mean) < 1e-8
    assert 0.5 < np.linalg.norm(state.mean) / np.linalg.norm(w) < 1.5  # the scale, not only the direction
    assert len(ledger.charges()) == 10


def test_minibatch_sigma_zero_recovers_synthetic_logistic_weights(
    logistic: tuple[np.ndarray, np.ndarray, np.ndarray],
) -> None:
    """S = 2000, T = 50, gamma_t = rho_t = 1/t (the site is the running average of the releases): cosine
    0.9996 to the truth and relative error 3.6% to the batch fixed point (observed); asked 0.95 and 15%."""
    x, y, w = logistic
    store = InMemoryTabularStore("logistic", x, y, public=True)
    batch, _, _ = fit(store, DpSepLogisticRegression(), sigma=0.0, batch_size=N, iterations=10)
    state, _, _ = fit(store, DpSepLogisticRegression(), sigma=0.0, batch_size=2000, iterations=50, seed=1)
    assert cosine(state.mean, w) > 0.95
    assert relative_error(state.mean, batch.mean) < 0.15


@pytest.mark.slow
def test_adult_auc_at_sigma_zero_matches_vips_blr() -> None:
    """UCI Adult (N = 32,561, d = 114; official test split): DP-SEP at sigma = 0 in batch mode (S = N, damping
    1, T = 10; converged after ~8 iterations) reaches test AUC 0.8990 against non-private VIPS-BLR's 0.8997
    (asked: within 0.01), predicting with vips.models.blr.model.predict_proba on the posterior document's
    "mean" and "covariance" exactly as for VIPS-BLR. Minibatches (S = 1000, T = 100, gamma_t = 1/t) reach
    0.8989. The test takes ~3 s (loading Adult ~1 s, each batch iteration ~0.15 s)."""
    train, test = load_adult("train"), load_adult("test")
    store = InMemoryTabularStore("adult", train.features, train.labels, public=True)
    for batch_size, iterations in ((store.info.population, 10), (1000, 100)):
        state, _, _ = fit(
            store, DpSepLogisticRegression(), sigma=0.0, batch_size=batch_size, iterations=iterations
        )
        document = DpSepLogisticRegression().posterior(state)
        probabilities = predict_proba(
            np.array(document["mean"]), np.array(document["covariance"]), test.features
        )
        auc = float(roc_auc_score(test.labels, probabilities))
        assert auc > VIPS_BLR_ADULT_AUC - 0.01, (batch_size, auc)


def test_private_logistic_fit_is_charged_once_per_iteration_and_cannot_be_seeded(
    logistic: tuple[np.ndarray, np.ndarray, np.ndarray],
) -> None:
    """sigma = 5, S = 2000 of N = 20,000, T = 30 (epsilon 1.12 at delta = 1e-5): one charge per iteration,
    the ledger's epsilon is the accountant's for that schedule, and the fit stays informative (20 private
    fits: cosine to the truth median 0.986, min 0.974; asked 0.9). A seed is refused on private data, and
    two private fits after the same global numpy seed differ."""
    x, y, w = logistic
    store = InMemoryTabularStore("private", x, y, public=False)
    with pytest.raises(PrivacyError):
        Gate(store, InMemoryLedger(delta=1e-5), seed=0)
    sigma, batch_size, iterations = 5.0, 2000, 30
    means = []
    for _ in range(2):
        np.random.seed(0)
        state, ledger, _ = fit(
            store,
            DpSepLogisticRegression(noise_aware=False),
            sigma=sigma,
            batch_size=batch_size,
            iterations=iterations,
            seed=None,
        )
        assert [charge.iteration for charge in ledger.charges()] == list(range(1, iterations + 1))
        assert ledger.epsilon_spent() == pytest.approx(
            epsilon(sigma, batch_size, N, iterations, 1e-5), rel=1e-9
        )
        assert cosine(state.mean, w) > 0.9
        means.append(state.mean)
    assert not np.array_equal(means[0], means[1])


# --------------------------------------------------------------------------------------------------------
# Linear regression.


def test_linear_batch_sigma_zero_is_the_exact_posterior() -> None:
    """Exact Gaussian sites: with S = N, damping 1 and a clip at the ingestion bound (nothing clipped), the
    first release is the mean of the likelihood's natural parameters, so q = p0 f^N is the exact posterior
    (observed 1.3e-15; asked 1e-8). With damping 1/2 the site approaches it geometrically (error 2^-t in
    the site, less in the mean): after 40 iterations the mean is within 2e-15 (observed)."""
    x, y, _ = linear_data(1, 500)
    store = regression_store("linear", x, y, public=True)
    model = DpSepLinearRegression(prior_variance=0.5, noise_variance=0.01, noise_aware=False)
    mean, precision = exact_gaussian_posterior(x, y, 0.5, 0.01)
    state, _, _ = fit(store, model, sigma=0.0, batch_size=500, iterations=1)
    assert relative_error(state.mean, mean) < 1e-8
    assert relative_error(state.precision, precision) < 1e-8
    damped = DpSepLinearRegression(prior_variance=0.5, noise_variance=0.01, damping=0.5, noise_aware=False)
    state, _, _ = fit(store, damped, sigma=0.0, batch_size=500, iterations=40)
    assert relative_error(state.mean, mean) < 1e-8


def test_linear_minibatch_sigma_zero_approaches_the_exact_posterior_mean() -> None:
    """S = 2000 of N = 20,000, T = 30, gamma_t = 1/t: the site is the average of 30 unbiased minibatch means
    of the exact sites, so the mean is within 0.3% of the exact posterior's (observed); asked 2%. The
    posterior mean recovers the true weights to 1.0% (asked 3%), and its in-sample predictions have RMSE
    0.0498, the noise sd 0.05 (asked < 0.06)."""
    x, y, w = linear_data(2)
    store = regression_store("linear", x, y, public=True)
    model = DpSepLinearRegression(noise_variance=0.05**2, noise_aware=False)
    mean, _ = exact_gaussian_posterior(x, y, 1.0, 0.05**2)
    state, _, _ = fit(store, model, sigma=0.0, batch_size=2000, iterations=30, seed=3)
    assert relative_error(state.mean, mean) < 0.02
    assert relative_error(state.mean, w) < 0.03
    document = model.posterior(state)
    predicted, variance = predict(
        np.array(document["mean"]), np.array(document["covariance"]), document["noise_variance"], x[:1000]
    )
    assert rmse(predicted, y[:1000]) < 0.06
    assert np.all(variance >= 0.05**2)


def test_private_linear_fit_is_charged_once_per_iteration() -> None:
    """sigma = 3, S = 2000, T = 10 (epsilon 1.05 at delta = 1e-5), noise variance 0.05^2, so the default clip
    is the ingestion bound sqrt(2) / 0.05^2 ~ 566 (nothing is clipped, and Delta is that large). One charge
    per iteration; theta_f stays within C after the public clip; 20 private fits had relative errors to the
    true weights of median 0.16, max 0.26 (asked < 0.6, far in the tail of the noise)."""
    x, y, w = linear_data(4)
    store = regression_store("private", x, y, public=False)
    with pytest.raises(PrivacyError):
        Gate(store, InMemoryLedger(delta=1e-5), seed=1)
    state, ledger, _ = fit(
        store,
        DpSepLinearRegression(noise_variance=0.05**2, noise_aware=False),
        sigma=3.0,
        batch_size=2000,
        iterations=10,
        seed=None,
    )
    assert len(ledger.charges()) == 10
    assert ledger.epsilon_spent() == pytest.approx(epsilon(3.0, 2000, N, 10, 1e-5), rel=1e-9)
    assert np.isfinite(state.mean).all()
    assert relative_error(state.mean, w) < 0.6
    assert site_norm(state.site_eta, state.site_precision) <= math.sqrt(2.0) / 0.05**2 * (1 + 1e-12)


def test_noise_aware_linear_batch_sigma_zero_is_the_exact_normal_gamma_posterior() -> None:
    """Noise-aware mode with the clip sqrt(3) (nothing clipped), S = N, sigma 0: one release of the sites P(z
    z^T) gives the Normal-Gamma posterior in closed form with lambda0 = 1 / prior_variance, a0 = 1, b0 = 0.01
    (tests/vips/models/linreg/test_model.py's exact_posterior; observed agreement 1e-15, asked 1e-8). The
    document is VIPS-linreg's, with DP-SEP's options named."""
    from tests.vips.models.linreg.test_model import exact_posterior

    x, y, _ = linear_data(1, 500)
    store = regression_store("linear", x, y, public=True)
    model = DpSepLinearRegression(prior_variance=0.5)
    assert model.site_clip == pytest.approx(math.sqrt(3.0))
    state: Any = fit(store, model, sigma=0.0, batch_size=500, iterations=1)[0]
    mean, precision, shape, rate = exact_posterior(x, y, 2.0, 1.0, 0.01)
    assert relative_error(state.mean, mean) < 1e-8
    assert relative_error(state.precision_scale, precision) < 1e-8
    assert state.noise_shape == pytest.approx(shape, rel=1e-12)
    assert state.noise_rate == pytest.approx(rate, rel=1e-8)
    document = model.posterior(state)
    assert document["noise_variance"] == pytest.approx(state.noise_variance)
    np.testing.assert_allclose(
        document["covariance"], state.noise_variance * np.linalg.inv(precision), rtol=1e-8
    )
    assert document["variational_parameters"]["noise_aware"] is True
    assert document["variational_parameters"]["clip"] == pytest.approx(math.sqrt(3.0))


def test_noise_aware_linear_intervals_cover_the_true_weights() -> None:
    """Issue 51: given only epsilon 1 (the rule's clip 0.7), the 90% intervals of DP-SEP linear regression
    carry the release noise and the learned noise variance. 60 unseen synthetic datasets
    (bench/calibration.py's family, seeds 2100-2159) x 10 weights: over 10 repeats of these fits coverage
    was 0.862-0.900 (mean 0.883, sd 0.014) and the slope 0.986-0.992 (the paper's model, its noise variance
    1 against the truth's 0.01: 1.000), so 0.80-0.97 is over 5 sds from the mean.
    """
    from bench.calibration import draw
    from tests.vips.models.linreg.test_model import coverage_and_slope
    from vips.estimators import DPSEPLinearRegression

    fits = []
    for seed in range(2_100, 2_160):
        data = draw("linreg", seed, 10_000)
        model = DPSEPLinearRegression(epsilon=1.0).fit(data.train, data.y)
        assert model.posterior_["variational_parameters"]["clip"] == pytest.approx(0.7)
        fits.append((data.weights, model.coef_, np.sqrt(np.diag(model.covariance_))))
    coverage, slope = coverage_and_slope(fits)
    assert 0.80 <= coverage <= 0.97, coverage
    assert 0.9 <= slope <= 1.1, slope


# --------------------------------------------------------------------------------------------------------
# The damped update (post-processing of the release).


def test_m_step_is_the_damped_site_update() -> None:
    """theta_f <- (1 - gamma) theta_f + gamma r with gamma = damping * rho; q = p0 f^N and the cavity
    p0 f^(N-1) follow; the site precision stays PSD and theta_f is scaled back to norm C when noise pushes
    it beyond."""
    d, n = 3, 50
    model = DpSepLogisticRegression(prior_variance=2.0, damping=0.5, clip=1.0, noise_aware=False)
    state = model.initial_state(d)
    np.testing.assert_allclose(model.public_params(state)["cavity_covariance"], 2.0 * np.eye(d), rtol=1e-12)
    release = {"precision_times_mean": np.array([0.2, -0.1, 0.0]), "precision": np.diag([0.1, 0.2, 0.0])}
    state = model.m_step(state, release, n, rho=0.8)
    gamma = 0.4
    np.testing.assert_allclose(state.site_eta, gamma * release["precision_times_mean"], atol=1e-15)
    np.testing.assert_allclose(state.site_precision, gamma * release["precision"], atol=1e-15)
    prior = np.eye(d) / 2.0
    np.testing.assert_allclose(state.precision, prior + n * state.site_precision, atol=1e-12)
    np.testing.assert_allclose(np.linalg.inv(state.covariance), state.precision, atol=1e-9)
    np.testing.assert_allclose(state.mean, np.linalg.solve(state.precision, n * state.site_eta), atol=1e-12)
    cavity_precision = prior + (n - 1) * state.site_precision
    np.testing.assert_allclose(np.linalg.inv(state.cavity_covariance), cavity_precision, atol=1e-9)
    np.testing.assert_allclose(
        state.cavity_mean, np.linalg.solve(cavity_precision, (n - 1) * state.site_eta), atol=1e-12
    )
    # A wildly noisy release: theta_f is clipped to C = 1 and its precision stays PSD.
    noisy = {"precision_times_mean": np.array([30.0, -40.0, 5.0]), "precision": np.diag([50.0, 10.0, 1e-3])}
    state = model.m_step(state, noisy, n, rho=1.0)
    assert site_norm(state.site_eta, state.site_precision) == pytest.approx(1.0, rel=1e-12)
    assert float(np.linalg.eigvalsh(state.site_precision)[0]) >= -1e-15
    assert float(np.linalg.eigvalsh(state.precision)[0]) >= 0.5 - 1e-12


def test_model_options_are_checked() -> None:
    with pytest.raises(ValueError, match="damping"):
        DpSepLogisticRegression(damping=0.0, noise_aware=False)
    with pytest.raises(ValueError, match="damping"):
        DpSepLogisticRegression(damping=1.5, noise_aware=False)
    with pytest.raises(ValueError, match="noise_aware"):  # the noise-aware mode takes no damping
        DpSepLogisticRegression(damping=0.5)
    with pytest.raises(ValueError, match="clip"):
        DpSepLogisticRegression(clip=-1.0)
    with pytest.raises(ValueError, match="prior_variance"):
        DpSepLinearRegression(prior_variance=math.inf)
    with pytest.raises(ValueError, match="noise_variance"):
        DpSepLinearRegression(noise_variance=0.0, noise_aware=False)
    with pytest.raises(ValueError, match="noise_aware 0"):  # the noise-aware mode learns it
        DpSepLinearRegression(noise_variance=0.5)
    paper = DpSepLinearRegression(noise_variance=0.5, noise_aware=False)
    assert paper.site_clip == pytest.approx(2 * math.sqrt(2.0))
    assert DpSepLinearRegression(noise_variance=0.5, clip=1.0, noise_aware=False).query().clip == 1.0
    assert DpSepLinearRegression().site_clip == pytest.approx(math.sqrt(3.0))  # clips nothing


# --------------------------------------------------------------------------------------------------------
# Logistic regression, noise-aware mode (centred releases, Newton steps: vips.models.blr.dpsep).


def test_noise_aware_steps_without_noise_reach_the_ep_fixed_point(
    logistic: tuple[np.ndarray, np.ndarray, np.ndarray],
) -> None:
    """At sigma 0 on the whole batch the Newton steps stop where the centred site gradient at q's mean
    balances the prior, G(mu) = a mu (a: the prior precision the last step used), with q's covariance
    (a I + Lambda(mu))^-1: SEP's fixed point, reached to 1e-8 of G's scale; the weights are recovered."""
    x, y, w = logistic
    store = InMemoryTabularStore("synthetic", x, y, public=True)
    model = DpSepLogisticRegression(intercept=None)
    state, _ = fit_through_gate(store, model, model.query(), LoopSettings(30, N, 0.0))
    query = model.query()
    sums = query.clipped_sums(Batch(x, y), model.public_params(state), np.random.default_rng(0))
    released = query.postprocess(sums, D)
    a, mean = state.prior_term, state.mean
    assert np.linalg.norm(released["gradient"] - a * mean) < 1e-8 * np.linalg.norm(released["gradient"] + 1)
    expected = np.linalg.inv(a * np.eye(D) + released["precision"])
    np.testing.assert_allclose(state.covariance, expected, rtol=1e-6, atol=1e-12)
    assert cosine(mean, w) > 0.99


@pytest.mark.slow
def test_the_services_schedule_at_epsilon_one_covers_the_true_weights() -> None:
    """Only epsilon 1 (the rule: five whole-batch noise-aware releases, clip 0.35) on 100 datasets of
    bench.calibration's family (d 10 with an intercept, N 10,000, w ~ N(0, 9 I); seeds 3000-3099, apart
    from the tuning seeds 0-99 and the judging seeds 1000-1099): the nominal 90% intervals cover 80-97% of
    the 1,000 true weights with slope 0.85-1.15 (issue 51). Two runs of this computation gave
    0.848-0.854 and slope 0.96 (q unwidened, vips.models.blr.model "The last step", nine runs: 0.825-0.853,
    standard deviation about 0.01): 0.80 is about five of them below. The paper's damped
    site average on the first 20 of them covers under 0.6 (measured 0.29-0.47): the test can fail. The
    noise is not seeded (private releases)."""
    from bench.calibration import Z90, draw
    from vips.estimators import DPSEPLogisticRegression

    def coverage_and_slope(seeds: range, **given: float) -> tuple[float, float]:
        truths, means, sds = [], [], []
        for seed in seeds:
            data = draw("blr", seed, 10_000)
            fitted = DPSEPLogisticRegression(epsilon=1.0, **given).fit(data.train, data.y)
            truths.append(data.weights)
            means.append(fitted.coef_)
            sds.append(np.sqrt(np.diag(fitted.covariance_)))
        truth, mean, sd = (np.concatenate(v) for v in (truths, means, sds))
        return float(np.mean(np.abs(truth - mean) <= Z90 * sd)), float(truth @ mean / (truth @ truth))

    coverage, slope = coverage_and_slope(range(3000, 3100))
    assert 0.80 <= coverage <= 0.97, coverage
    assert 0.85 <= slope <= 1.15, slope
    paper, _ = coverage_and_slope(range(3000, 3020), noise_aware=0, clip=0.25)
    assert paper < 0.6, paper


def test_noise_aware_step_reads_the_centred_release_with_its_noise() -> None:
    """The m-step hands VIPS-BLR's Newton step the gradient as its g / 2 (noise std released / kappa / 2)
    and the site precision as its H: the same state as that model given those statistics."""
    from privacy_wall.queries.dpsep import GRADIENT_SCALE

    d, n = 3, 400
    model = DpSepLogisticRegression(prior_variance=2.0, intercept=None)
    release = {"gradient": np.array([3.0, -1.0, 0.5]), "precision": np.diag([0.2, 0.1, 0.3])}
    state = model.m_step(model.initial_state(d), release, n, 1.0, {"site": 0.01})
    newton = model.newton
    assert (newton.laplace_from, newton.pool_from, newton.a0, newton.b0) == (1, 2, 1.0, 2.0)
    laplace = {"s1": release["gradient"] / 2, "s2": release["precision"]}
    noise = {"s1": 0.01 / GRADIENT_SCALE / 2, "s2": 0.01}
    expected = newton.m_step(newton.initial_state(d), laplace, n, 1.0, noise)
    np.testing.assert_allclose(state.mean, expected.mean, rtol=1e-12)
    np.testing.assert_allclose(state.covariance, expected.covariance, rtol=1e-12)
    cavity = model.public_params(state)
    np.testing.assert_array_equal(cavity["cavity_mean"], state.mean)
    document = model.posterior(state)
    assert document["variational_parameters"]["noise_aware"] is True
    assert document["sufficient_statistics"]["gradient"] == release["gradient"].tolist()


def test_the_paper_mode_is_an_option() -> None:
    """noise_aware 0 through the registry gives the paper's query and damped average; the default is the
    noise-aware mode with the centred query."""
    from vips.models.registry import model_setup

    paper = model_setup("blr", {"noise_aware": 0, "clip": 0.25}, sigma=1.0, algorithm="dpsep")
    assert isinstance(paper.model, DpSepLogisticRegression) and not paper.model.noise_aware
    assert not paper.query.centred and paper.query.clip == 0.25
    default = model_setup("blr", {}, sigma=1.0, algorithm="dpsep", columns=["x", "intercept"])
    assert default.model.noise_aware and default.query.centred and default.model.intercept == 1


def test_noise_aware_linear_steps_are_vips_linregs_on_the_released_sites() -> None:
    """The noise-aware mode's M-step is BayesianLinearRegression's (lambda0 = 1 / prior_variance) with the
    release's one noise std on every entry of xx and yx and gamma = damping x rho; the registry builds it by
    default and the paper's model with noise_aware 0; noise_variance without noise_aware 0 is refused at
    admission and in `vips fit --local` (schedule_problem) as in the model."""
    from control.planning.options import schedule_problem
    from control.planning.schedules import chosen_options
    from privacy_wall.queries.dpsep import DpSepLinearQuery, DpSepNormalGammaQuery
    from vips.models.registry import model_setup

    d, n = 3, 400
    model = DpSepLinearRegression(prior_variance=0.5, damping=0.5)
    release = {"xx": np.diag([0.3, 0.2, 0.1]), "yx": np.array([0.1, -0.05, 0.02]), "yy": np.array([0.05])}
    state = model.m_step(model.initial_state(d), release, n, 0.8, {"site": 0.01})
    conjugate = model.conjugate
    assert conjugate.prior_precision == 2.0
    expected = conjugate.m_step(conjugate.initial_state(d), release, n, 0.4, {"xx": 0.01, "yx": 0.01})
    np.testing.assert_allclose(state.mean, expected.mean, rtol=1e-12)
    np.testing.assert_allclose(state.covariance, expected.covariance, rtol=1e-12)
    assert expected.precision_noise_variance > 0 and model.public_params(state) == {}
    default = model_setup("linreg", {}, sigma=1.0, algorithm="dpsep")
    assert isinstance(default.query, DpSepNormalGammaQuery) and default.query.clip == pytest.approx(
        math.sqrt(3)
    )
    paper = model_setup("linreg", {"noise_aware": 0, "noise_variance": 0.1}, sigma=1.0, algorithm="dpsep")
    assert isinstance(paper.query, DpSepLinearQuery) and paper.query.noise_precision == pytest.approx(10.0)
    runs_with = chosen_options("linreg", "dpsep", 10_000, 1.0, {}, 10)
    assert runs_with == {"clip": 0.7}
    # the rule's clip is the noise-aware mode's: the paper's model keeps its own (its sites' bound)
    assert chosen_options("linreg", "dpsep", 10_000, 1.0, {"noise_aware": 0, "noise_variance": 0.1}, 10) == {}
    problem = schedule_problem("linreg", {**runs_with, "noise_variance": 0.1}, 1.0)
    assert problem is not None and problem[0] == "noise_variance" and "noise_aware=0" in problem[1]
    assert schedule_problem("linreg", {"noise_variance": 0.1, "noise_aware": 0}, 1.0) is None


def stored_options_after_upgrade(
    tmp_path: Path, before: str, after: str, rows: dict[str, tuple[str, str, dict[str, float]]]
) -> dict[str, dict[str, float]]:
    """Jobs (id -> model, algorithm, options) stored at control revision `before`, upgraded to `after`:
    their options."""
    from alembic import command
    from sqlalchemy import create_engine, insert, select

    from control.store.models import jobs
    from vips.migrate import alembic_config

    url = f"sqlite:///{tmp_path / 'control.db'}"
    command.upgrade(alembic_config("control", url), before)
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            for job_id, (model, algorithm, options) in rows.items():
                conn.execute(
                    insert(jobs).values(
                        id=job_id, dataset="d", owner="k", model=model, algorithm=algorithm, options=options,
                        iterations=5, batch_size=10, sigma=1.0, delta=1e-5, status="queued",
                        created_at=datetime.now(UTC),
                    )
                )  # fmt: skip
        command.upgrade(alembic_config("control", url), after)
        with engine.connect() as conn:
            return dict(conn.execute(select(jobs.c.id, jobs.c.options)).all())
    finally:
        engine.dispose()


def test_migration_0017_keeps_earlier_dpsep_blr_jobs_on_the_papers_update(tmp_path: Path) -> None:
    """A DP-SEP-BLR job stored before the option existed reads its releases as it made them (noise_aware
    0) after the upgrade; a DP-SEP linreg job and a job that already names the option are left as they
    were."""
    rows = {
        "old": ("blr", "dpsep", {"clip": 0.25}),
        "linreg": ("linreg", "dpsep", {}),
        "named": ("blr", "dpsep", {"noise_aware": 1}),
    }
    stored = stored_options_after_upgrade(tmp_path, "0016", "0017", rows)
    assert stored == {"old": {"clip": 0.25, "noise_aware": 0}, "linreg": {}, "named": {"noise_aware": 1}}


def test_migration_0018_keeps_earlier_dpsep_linreg_jobs_on_the_papers_model(tmp_path: Path) -> None:
    """As 0017 for DP-SEP linear regression: a job stored before its noise-aware mode gets noise_aware 0
    (and keeps its noise_variance); VIPS linreg, DP-SEP-BLR and a job that names the option are left alone;
    the downgrade takes back exactly what the upgrade added."""
    from alembic import command
    from sqlalchemy import create_engine, select

    from control.store.models import jobs
    from vips.migrate import alembic_config

    rows = {
        "old": ("linreg", "dpsep", {"noise_variance": 0.1}),
        "vips": ("linreg", "vips", {}),
        "blr": ("blr", "dpsep", {"noise_aware": 1}),
        "named": ("linreg", "dpsep", {"noise_aware": 1}),
    }
    stored = stored_options_after_upgrade(tmp_path, "0017", "0018", rows)
    assert stored == {
        "old": {"noise_variance": 0.1, "noise_aware": 0},
        "vips": {},
        "blr": {"noise_aware": 1},
        "named": {"noise_aware": 1},
    }
    url = f"sqlite:///{tmp_path / 'control.db'}"
    command.downgrade(alembic_config("control", url), "0017")
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            assert dict(conn.execute(select(jobs.c.id, jobs.c.options)).all())["old"] == {
                "noise_variance": 0.1
            }
    finally:
        engine.dispose()


def test_damping_without_the_papers_update_is_refused_before_anything_runs() -> None:
    """A DP-SEP-BLR job that gives damping but not noise_aware=0 (the rule would choose the noise-aware
    mode, or the model's default is it) is refused naming damping, at admission and in `vips fit --local`
    (schedule_problem on the options the job runs with); linear regression's damping is its own."""
    from control.planning.options import schedule_problem
    from control.planning.schedules import chosen_options

    given = {"damping": 0.5}
    runs_with = {**chosen_options("blr", "dpsep", 32_561, 1.0, given, 114), **given}
    problem = schedule_problem("blr", runs_with, 1.0)
    assert problem is not None and problem[0] == "damping" and "noise_aware=0" in problem[1]
    assert schedule_problem("blr", {"damping": 0.5}, 1.0) is not None  # sigma given: the model's default
    assert schedule_problem("blr", {"damping": 0.5, "noise_aware": 0}, 1.0) is None
    assert schedule_problem("linreg", {"damping": 0.5}, 1.0) is None
