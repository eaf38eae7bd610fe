"""DPVI for Bayesian logistic regression end to end (wall + loop + AdaGrad): recovery at sigma = 0 and
agreement with a direct non-private mean-field solution, UCI Adult against non-private VIPS-BLR, a private
fit through the gate, and the public half's pieces (ELBO gradient, AdaGrad, eps, posterior document)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy.optimize import minimize
from scipy.special import expit, log_expit
from sklearn.metrics import roc_auc_score

from bench.calibration import Z90, draw
from privacy_wall.accounting.calibration import epsilon
from privacy_wall.data.store import InMemoryTabularStore
from privacy_wall.gate import Gate, PrivacyError
from privacy_wall.ledger.base import InMemoryLedger
from privacy_wall.queries.blr import LogisticRegressionQuery
from privacy_wall.queries.dpvi import BLOCK, DpviLogisticRegressionQuery
from tests.fitting import cosine, fit_through_gate, relative_error
from tests.vips.models.blr.test_model import D, N, synthetic  # the same synthetic logistic data
from vips.datasets.adult import load_adult
from vips.estimators import DPVILogisticRegression
from vips.models.blr.dpvi import DpviLogisticRegression, DpviState, adagrad_step
from vips.models.blr.model import BayesianLogisticRegression, predict_proba
from vips.posterior import blr_parameters
from vips.runner import LoopSettings, run_vips


@pytest.fixture(scope="module")
def data() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return synthetic(0)


def direct_mean_field(x: np.ndarray, y: np.ndarray, prior_variance: float) -> tuple[np.ndarray, np.ndarray]:
    """The exact optimum of the same ELBO, without DP, Monte Carlo or minibatches (written independently of
    vips.models.blr.dpvi): x^T w ~ N(u, v^2) with u = x^T m, v^2 = sum_i x_i^2 exp(2 s_i) under q, so each
    record's E_q[log sigmoid((2y - 1) x^T w)] is a 1-D Gauss-Hermite integral (20 nodes: the optimum
    agrees with 60 nodes to 1e-12), with gradients d/du = E[f'], d/dv = E[f' z]; L-BFGS to gtol 1e-10.
    Returns (mean, log_std)."""
    nodes, weights = np.polynomial.hermite_e.hermegauss(20)
    weights = weights / math.sqrt(2 * math.pi)
    sign = (2 * y - 1)[:, None]
    d = x.shape[1]

    def negative_elbo(theta: np.ndarray) -> tuple[float, np.ndarray]:
        m, s = theta[:d], theta[d:]
        variance = np.exp(2 * s)
        u, v = x @ m, np.sqrt((x * x) @ variance)
        t = u[:, None] + v[:, None] * nodes[None, :]
        f = log_expit(sign * t)
        slope = sign * expit(-sign * t)
        elbo = float(np.sum(f @ weights)) - (m @ m + variance.sum()) / (2 * prior_variance) + s.sum()
        grad_m = x.T @ (slope @ weights) - m / prior_variance
        grad_s = ((x * x).T @ ((slope * nodes) @ weights / v)) * variance - variance / prior_variance + 1
        return -elbo, -np.concatenate([grad_m, grad_s])

    result = minimize(
        negative_elbo, np.zeros(2 * d), jac=True, method="L-BFGS-B", options={"gtol": 1e-10, "ftol": 1e-15}
    )
    assert result.success, result.message
    return result.x[:d], result.x[d:]


@pytest.fixture(scope="module")
def reference(data: tuple[np.ndarray, np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    x, y, _ = data
    return direct_mean_field(x, y, 1.0)


def fit(
    x: np.ndarray,
    y: np.ndarray,
    model: DpviLogisticRegression,
    *,
    sigma: float,
    batch_size: int,
    iterations: int,
    seed: int | None,
) -> tuple[DpviState, InMemoryLedger]:
    """DPVI through the real gate: public + seeded at sigma = 0, private (CSPRNG) otherwise."""
    store = InMemoryTabularStore("synthetic", x, y, public=sigma == 0)
    return fit_through_gate(
        store, model, model.query(), LoopSettings(iterations, batch_size, sigma), seed=seed
    )


# --------------------------------------------------------------------------------------------------------
# Recovery at sigma = 0.


def test_direct_solution_recovers_the_weights(
    data: tuple[np.ndarray, np.ndarray, np.ndarray], reference: tuple[np.ndarray, np.ndarray]
) -> None:
    """Sanity of the reference: with N = 20,000 the posterior sd per weight is ~0.09 (observed), so the mean
    is within ~0.3 of |w| = 10 (observed cosine 0.9996)."""
    _, _, w = data
    assert cosine(reference[0], w) > 0.99
    assert np.all(np.abs(np.exp(reference[1]) - 0.094) < 0.01)


@pytest.mark.slow
def test_sigma_zero_recovers_the_weights_and_the_direct_solution(
    data: tuple[np.ndarray, np.ndarray, np.ndarray], reference: tuple[np.ndarray, np.ndarray]
) -> None:
    """Public data, sigma = 0, S = 1000, T = 2000, 4 draws, AdaGrad eta = 0.5, c = 1 (fixed seeds).

    Observed: cosine with the true weights 0.9993 (asked: > 0.95), mean within 2.0% of the direct mean-field
    optimum (asked: 5%; a gradient divided by N instead of S, or a missing prior term, is off by far more),
    and max_i |log_std_i - s*_i| = 0.105 (asked: 0.3, i.e. every posterior sd within a factor 1.35: the
    reparameterisation gradient of log_std is the noisiest part, and with a constant AdaGrad rate the
    iterate keeps fluctuating around the optimum by about this much)."""
    x, y, w = data
    model = DpviLogisticRegression(learning_rate=0.5, clip=1.0, draws=4, seed=0)
    state, ledger = fit(x, y, model, sigma=0.0, batch_size=1000, iterations=2000, seed=0)
    mean, log_std = reference
    assert cosine(state.mean, w) > 0.95
    assert relative_error(state.mean, mean) < 0.05
    assert np.max(np.abs(state.log_std - log_std)) < 0.3
    assert len(ledger.charges()) == 2000 and ledger.epsilon_spent() == math.inf


@pytest.mark.slow
def test_adult_auc_at_sigma_zero_is_within_001_of_vips_blr() -> None:
    """UCI Adult (train on adult.data, AUC on adult.test), both through the real gate at sigma = 0.

    Non-private VIPS-BLR in batch mode (S = N, T = 10, rho = 1/t, as bench/adult_blr.py): AUC 0.8997.
    DPVI with the model's defaults (prior variance 1, AdaGrad eta = 0.5, c = 1, one draw), S = 200,
    T = 2000 (~1 s): 0.8971 with seed 0 (0.8970-0.8972 over seeds 0-3); asked: within 0.01. Longer runs
    get closer (S = 500, T = 5000, eta = 1: 0.8987). A learning rate of 0.05 reaches only 0.8795 in
    T = 500 and 0.8908 in 5000: with ||x|| <= 1 the weights are O(10) and AdaGrad moves a coordinate by at
    most eta per step.
    """
    train, test = load_adult("train"), load_adult("test")
    n, d = train.features.shape
    store = InMemoryTabularStore("adult", train.features, train.labels, public=True)

    vips = BayesianLogisticRegression(laplace_from=0)
    blr = run_vips(
        Gate(store, InMemoryLedger(delta=1e-5), seed=0),
        LogisticRegressionQuery(),
        vips,
        LoopSettings(10, n, 0.0, 0.0, 1.0),
        job_id="vips",
        dimension=d,
        population=n,
    ).state
    vips_auc = roc_auc_score(test.labels, predict_proba(blr.mean, blr.covariance, test.features))

    model = DpviLogisticRegression(seed=0)
    state = run_vips(
        Gate(store, InMemoryLedger(delta=1e-5), seed=0),
        model.query(),
        model,
        LoopSettings(2000, 200, 0.0),
        job_id="dpvi",
        dimension=d,
        population=n,
    ).state
    document = model.posterior(state)
    mean, covariance = blr_parameters(document)  # the existing prediction path, unchanged
    dpvi_auc = roc_auc_score(test.labels, predict_proba(mean, covariance, test.features))
    assert vips_auc == pytest.approx(0.8997, abs=5e-5)
    assert abs(dpvi_auc - vips_auc) < 0.01, (dpvi_auc, vips_auc)


# --------------------------------------------------------------------------------------------------------
# Private fits.


@pytest.mark.slow
def test_private_fit_is_charged_per_iteration_and_cannot_be_seeded(
    data: tuple[np.ndarray, np.ndarray, np.ndarray],
) -> None:
    """sigma = 1 on a private store (S = 500 of N = 20,000, T = 300, c = 1): every iteration is charged once
    under its own (job, t), the ledger's epsilon is the accountant's, and the fit is still informative.

    Two fits with the same public seed (so the same eps every iteration) differ: sampling and noise come
    from the OS's CSPRNG, which neither the model's seed nor numpy's global seed reaches. Cosines to the
    truth over 100 such fits were 0.9973-0.9997 (observed); 0.95 is far outside that range."""
    x, y, w = data
    sigma, size, iterations = 1.0, 500, 300
    model = DpviLogisticRegression(clip=1.0, seed=0)
    store = InMemoryTabularStore("private", x, y)
    with pytest.raises(PrivacyError):
        Gate(store, InMemoryLedger(delta=1e-5), seed=0)
    states = []
    for _ in range(2):
        np.random.seed(0)
        state, ledger = fit(x, y, model, sigma=sigma, batch_size=size, iterations=iterations, seed=None)
        charges = ledger.charges()
        assert sorted((c.job_id, c.iteration, c.attempt) for c in charges) == [
            ("fit", t, 0) for t in range(1, iterations + 1)
        ]
        assert {c.event.noise_multiplier for c in charges} == {sigma}
        assert {(c.event.sample_size, c.event.population) for c in charges} == {(size, N)}
        assert ledger.epsilon_spent() == pytest.approx(epsilon(sigma, size, N, iterations, 1e-5), rel=1e-9)
        assert np.isfinite(state.mean).all() and np.isfinite(state.log_std).all()
        assert cosine(state.mean, w) > 0.95
        states.append(state)
    assert not np.array_equal(states[0].mean, states[1].mean)


def test_private_store_refuses_sigma_zero(data: tuple[np.ndarray, np.ndarray, np.ndarray]) -> None:
    x, y, _ = data
    store = InMemoryTabularStore("private", x[:100], y[:100])
    ledger = InMemoryLedger(delta=1e-5)
    model = DpviLogisticRegression()
    with pytest.raises(PrivacyError):
        run_vips(
            Gate(store, ledger),
            model.query(),
            model,
            LoopSettings(3, 10, 0.0),
            job_id="j",
            dimension=D,
            population=100,
        )
    assert ledger.charges() == []


# --------------------------------------------------------------------------------------------------------
# The public half.


def prior_and_entropy(mean: np.ndarray, log_std: np.ndarray, prior_variance: float) -> float:
    """E_q[log N(w; 0, v I)] + H[N(m, diag(exp(2 s)))], constants dropped, written from the densities."""
    variance = np.exp(2 * log_std)
    expected_log_prior = -float(np.sum(mean**2 + variance)) / (2 * prior_variance)
    entropy = float(np.sum(0.5 * np.log(2 * math.pi * math.e * variance)))
    return expected_log_prior + entropy - int(mean.shape[0]) * 0.5 * math.log(2 * math.pi * math.e)


def test_elbo_gradient_is_n_times_the_release_plus_the_prior_and_entropy_terms() -> None:
    """Against central differences of the closed-form prior + entropy terms (h = 1e-6 on O(1) values:
    error ~1e-9; atol 1e-6)."""
    rng = np.random.default_rng(10)
    model = DpviLogisticRegression(prior_variance=2.5)
    state = DpviState(rng.normal(size=4), rng.normal(scale=0.5, size=4), np.zeros(4), np.zeros(4), 0)
    released = rng.normal(size=8)
    grad_mean, grad_log_std = model.elbo_gradient(state, released, 300)
    h = 1e-6
    for i in range(4):
        step = np.eye(4)[i] * h
        d_mean = (
            prior_and_entropy(state.mean + step, state.log_std, 2.5)
            - prior_and_entropy(state.mean - step, state.log_std, 2.5)
        ) / (2 * h)
        d_log_std = (
            prior_and_entropy(state.mean, state.log_std + step, 2.5)
            - prior_and_entropy(state.mean, state.log_std - step, 2.5)
        ) / (2 * h)
        assert grad_mean[i] == pytest.approx(300 * released[i] + d_mean, abs=1e-6)
        assert grad_log_std[i] == pytest.approx(300 * released[4 + i] + d_log_std, abs=1e-6)
    with pytest.raises(ValueError):
        model.elbo_gradient(state, np.zeros(7), 300)


def test_adagrad_step_is_the_papers() -> None:
    """G_t = G_{t-1} + g^2, xi_t = xi_{t-1} + eta g / sqrt(G_t); a coordinate with G = 0 stays put."""
    theta, accumulator = np.array([1.0, 2.0, 3.0]), np.array([0.0, 9.0, 0.0])
    gradient = np.array([-2.0, 4.0, 0.0])
    new_theta, new_acc = adagrad_step(theta, accumulator, gradient, 0.1)
    np.testing.assert_allclose(new_acc, [4.0, 25.0, 0.0])
    np.testing.assert_allclose(new_theta, [1.0 - 0.1, 2.0 + 0.1 * 4 / 5, 3.0])


def test_m_step_takes_one_adagrad_step_and_ignores_rho() -> None:
    rng = np.random.default_rng(11)
    model = DpviLogisticRegression(learning_rate=0.3)
    state = model.initial_state(3)
    released = rng.normal(size=6)
    after = [model.m_step(state, {BLOCK: released}, 50, rho) for rho in (1.0, 0.1)]
    np.testing.assert_array_equal(after[0].mean, after[1].mean)
    np.testing.assert_array_equal(after[0].log_std, after[1].log_std)
    grad_mean, grad_log_std = model.elbo_gradient(state, released, 50)
    # The first AdaGrad step moves every coordinate by exactly eta in the direction of its gradient.
    np.testing.assert_allclose(after[0].mean, 0.3 * np.sign(grad_mean))
    np.testing.assert_allclose(after[0].log_std, 0.3 * np.sign(grad_log_std))
    assert after[0].iteration == 1
    np.testing.assert_array_equal(after[0].statistics[BLOCK], released)


def test_initial_state_is_the_prior_and_eps_is_public_and_pure() -> None:
    """eps depends only on (seed, t): the same state gives the same eps (a replayed job draws what it drew),
    iterations and seeds give different eps, and its entries are standard normal."""
    model = DpviLogisticRegression(prior_variance=4.0, draws=3, seed=5)
    state = model.initial_state(6)
    np.testing.assert_array_equal(state.mean, np.zeros(6))
    np.testing.assert_allclose(np.exp(state.log_std), 2.0)
    params = model.public_params(state)
    assert set(params) == {"mean", "log_std", "eps"} and params["eps"].shape == (3, 6)
    model.query().validate_params(params, 6)
    np.testing.assert_array_equal(params["eps"], model.public_params(state)["eps"])
    later = model.m_step(state, {BLOCK: np.ones(12)}, 10, 1.0)
    assert not np.array_equal(params["eps"], model.public_params(later)["eps"])
    other_seed = DpviLogisticRegression(prior_variance=4.0, draws=3, seed=6)
    assert not np.array_equal(params["eps"], other_seed.public_params(state)["eps"])
    # Standard normal: 200 iterations x 3 draws x 6 = 3600 values; mean within 5 sd (0.083), var within 15%
    # (the sd of a sample variance of 3600 normals is 0.024, so 15% is > 6 sd).
    values = np.concatenate(
        [
            model.noise(DpviState(state.mean, state.log_std, state.mean, state.mean, t)).ravel()
            for t in range(200)
        ]
    )
    assert abs(values.mean()) < 5 / math.sqrt(values.size)
    assert abs(values.var() - 1.0) < 0.15


def test_posterior_document_predicts_like_vips_blr() -> None:
    """The document carries mean and a diagonal covariance exp(2 log_std) that the BLR prediction path reads
    unchanged, round-trips through strict JSON, and its natural parameters agree with the moments."""
    rng = np.random.default_rng(12)
    model = DpviLogisticRegression()
    state = DpviState(rng.normal(size=4), rng.normal(scale=0.3, size=4), np.ones(4), np.ones(4), 7)
    state = model.m_step(state, {BLOCK: rng.normal(size=8)}, 100, 1.0)
    document = json.loads(json.dumps(model.posterior(state), allow_nan=False))
    mean, covariance = blr_parameters(document)
    np.testing.assert_allclose(mean, state.mean)
    np.testing.assert_allclose(covariance, np.diag(np.exp(2 * state.log_std)))
    features = rng.normal(size=(5, 4)) / 3
    np.testing.assert_allclose(
        predict_proba(mean, covariance, features), predict_proba(state.mean, state.covariance, features)
    )
    assert document["variational_parameters"] == {
        "mean": state.mean.tolist(),
        "log_std": state.log_std.tolist(),
        "noise_aware": True,
    }
    natural = document["natural_parameters"]
    precision = np.asarray(natural["precision"])
    np.testing.assert_allclose(precision @ covariance, np.eye(4), atol=1e-12)
    np.testing.assert_allclose(natural["precision_times_mean"], precision @ mean)
    np.testing.assert_allclose(document["sufficient_statistics"][BLOCK], state.statistics[BLOCK])


def test_model_builds_its_query_and_refuses_bad_options() -> None:
    query = DpviLogisticRegression(clip=2.5, draws=3).query()
    assert isinstance(query, DpviLogisticRegressionQuery)
    assert (query.clip, query.draws, query.name) == (2.5, 3, "dpvi")
    for options in (
        {"prior_variance": 0.0},
        {"prior_variance": math.inf},
        {"learning_rate": -1.0},
        {"learning_rate": math.nan},
        {"clip": 0.0},
        {"draws": 0},
        {"draws": 1.5},
        {"seed": -1},
    ):
        with pytest.raises(ValueError, match=next(iter(options))):
            DpviLogisticRegression(**options)


def test_noise_aware_posterior_is_the_weighted_average_of_the_trace() -> None:
    """The trace's online statistics equal the direct ones over the iterates m_1..m_T with weights t^3:
    mean sum w_t m_t / sum w_t, variances sum w_t exp(2 s_t) / sum w_t plus sum w_t (m_t - mean)^2 / sum w_t;
    noise_aware=False reports the last iterate q_T."""
    rng = np.random.default_rng(5)
    model = DpviLogisticRegression()
    state = model.initial_state(4)
    means, variances = [], []
    for _ in range(40):
        state = model.m_step(state, {BLOCK: rng.normal(scale=0.2, size=8)}, 500, 1.0)
        means.append(state.mean), variances.append(state.variance)
    weights = np.arange(1, 41, dtype=np.float64) ** 3
    weights /= weights.sum()
    average = weights @ np.asarray(means)
    spread = weights @ (np.asarray(means) - average) ** 2
    document = model.posterior(state)
    np.testing.assert_allclose(document["mean"], average, rtol=1e-12)
    np.testing.assert_allclose(np.diag(document["covariance"]), weights @ np.asarray(variances) + spread)
    assert not np.allclose(average, state.mean)  # the trace moved: the test tells the two apart
    paper = DpviLogisticRegression(noise_aware=False).posterior(state)
    np.testing.assert_allclose(paper["mean"], state.mean)
    np.testing.assert_allclose(np.diag(paper["covariance"]), state.variance)
    assert paper["variational_parameters"]["mean"] == document["variational_parameters"]["mean"]


@pytest.mark.slow
def test_the_services_schedule_at_epsilon_one_covers_the_true_weights() -> None:
    """Only epsilon 1 (the service's schedule: T 300 whole-batch releases, learning rate 1) on 15 datasets
    of bench.calibration's family (d 10 with an intercept, N 10,000, w ~ N(0, 9 I); seeds 500-514, apart from
    the tuning seeds 0-99 and the judging seeds 1000 and up): the noise-aware posterior's nominal 90%
    intervals cover 80-97% of the 150 true weights with slope 0.85-1.15 (issue 51), where the last iterate
    q_T's, read from the same fits, cover at least 0.15 less. Three runs of this computation: coverage
    0.920-0.947 (the iterates' spread, added whole, is conservative), slope 0.948-0.967, q_T 0.573-0.593.
    The noise is not seeded (private releases)."""
    truths, means, sds, last_means, last_sds = [], [], [], [], []
    for seed in range(500, 515):
        data = draw("blr", seed, 10_000)
        fitted = DPVILogisticRegression(epsilon=1.0).fit(data.train, data.y)
        assert fitted.state_.iteration == 300
        truths.append(data.weights)
        means.append(fitted.coef_), sds.append(np.sqrt(np.diag(fitted.covariance_)))
        last_means.append(fitted.state_.mean), last_sds.append(np.exp(fitted.state_.log_std))
    truth = np.concatenate(truths)

    def coverage(mean: list[np.ndarray], sd: list[np.ndarray]) -> float:
        return float(np.mean(np.abs(truth - np.concatenate(mean)) <= Z90 * np.concatenate(sd)))

    noise_aware, last = coverage(means, sds), coverage(last_means, last_sds)
    slope = float(truth @ np.concatenate(means) / (truth @ truth))
    print(f"coverage {noise_aware:.3f} (last iterate {last:.3f}), slope {slope:.3f}")
    assert 0.80 <= noise_aware <= 0.97, noise_aware
    assert 0.85 <= slope <= 1.15, slope
    assert noise_aware >= last + 0.15, (noise_aware, last)
