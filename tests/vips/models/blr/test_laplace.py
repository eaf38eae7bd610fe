"""VIPS-BLR's Laplace releases (vips.models.blr.model, privacy_wall.queries.blr Laplace mode): without noise
the steps reach the maximum a posteriori and its Laplace covariance; with the service's schedule at
epsilon 1 the posterior covers the true weights (issue 51)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scipy.special import expit
from sqlalchemy import create_engine, insert, select

from bench.calibration import Z90, draw
from privacy_wall.data.store import InMemoryTabularStore
from privacy_wall.queries.blr import LogisticRegressionQuery
from tests.fitting import fit_through_gate
from vips.estimators import DPSEPLogisticRegression, VIPSLogisticRegression
from vips.models.blr.model import BayesianLogisticRegression, widened_covariance
from vips.runner import LoopSettings


def synthetic(seed: int, rows: int, dimension: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, dimension))
    x *= (rng.uniform(size=(rows, 1)) ** 0.5) / np.linalg.norm(x, axis=1, keepdims=True)
    y = (rng.uniform(size=rows) < expit(x @ rng.normal(0.0, 3.0, dimension))).astype(np.float64)
    return x, y


def test_laplace_steps_without_noise_reach_the_map_and_its_laplace_covariance() -> None:
    """At sigma 0 on the whole batch, release 1 (Polya-Gamma) and Newton steps from release 2 on converge
    (quadratically, then as fast as q(alpha) settles) to the mode of the log-likelihood plus the prior
    N(0, a^-1 I) at the prior precision a the last step used, with covariance (a I + X^T diag(p (1 - p)) X)^-1
    at that mode: the Laplace approximation."""
    x, y = synthetic(1, 4000, 5)
    store = InMemoryTabularStore("synthetic", x, y, public=True)
    model = BayesianLogisticRegression(intercept=None)
    state, _ = fit_through_gate(store, model, LogisticRegressionQuery(), LoopSettings(40, 4000, 0.0))
    a, mean = state.prior_term, state.mean
    p = expit(x @ mean)
    gradient = x.T @ (y - p) - a * mean
    assert np.linalg.norm(gradient) < 1e-8 * np.linalg.norm(x.T @ (y - 0.5))
    laplace = np.linalg.inv(a * np.eye(5) + (x * (p * (1 - p))[:, None]).T @ x)
    np.testing.assert_allclose(state.covariance, laplace, rtol=1e-6, atol=1e-12)
    paper = BayesianLogisticRegression(intercept=None, laplace_from=0)
    mean_field, _ = fit_through_gate(store, paper, LogisticRegressionQuery(), LoopSettings(40, 4000, 0.0))
    # The Polya-Gamma fixed point's variances are smaller (Jaakkola-Jordan curvature is too large for
    # well-classified rows): the reason for the Laplace releases.
    assert np.all(np.diag(mean_field.covariance) < np.diag(laplace))


def test_the_widening_adds_what_q_does_not_explain_along_the_last_step_only() -> None:
    """widened_covariance: along u = s / |s| the variance grows by the excess |s|^2 - 2 tr Sigma (the
    step's squared length less what two draws with q's spread would show); directions orthogonal to u keep
    theirs; a step the noise explains (|s|^2 <= 2 tr Sigma), no step and a non-finite one leave Sigma as
    it is."""
    rng = np.random.default_rng(0)
    a = rng.normal(size=(4, 4))
    sigma = a @ a.T / 4 + 0.1 * np.eye(4)
    step = 5.0 * rng.normal(size=4)
    u = step / np.linalg.norm(step)
    widened = widened_covariance(sigma, step)
    assert step @ step > 2 * np.trace(sigma)
    assert u @ widened @ u == pytest.approx(u @ sigma @ u + step @ step - 2 * np.trace(sigma), rel=1e-12)
    v = rng.normal(size=4)
    v -= (v @ u) * u
    assert v @ widened @ v == pytest.approx(v @ sigma @ v, rel=1e-12)
    np.testing.assert_allclose(widened, widened.T, rtol=0, atol=0)
    assert widened_covariance(sigma, u * np.sqrt(2 * np.trace(sigma))) is sigma
    assert widened_covariance(sigma, np.zeros(4)) is sigma
    assert widened_covariance(sigma, np.full(4, 1e200)) is sigma  # |s|^2 overflows: nothing to add


@pytest.mark.parametrize(
    "estimator",
    [
        lambda t: VIPSLogisticRegression(
            sigma=0.0, iterations=t, random_state=0, laplace_from=1, pool_from=2
        ),
        lambda t: DPSEPLogisticRegression(sigma=0.0, iterations=t, random_state=0),
    ],
    ids=["vips", "dpsep"],
)
def test_a_fit_that_stopped_short_says_so_and_a_converged_one_is_not_widened(estimator: Any) -> None:
    """Two Newton steps from w = 0 (no noise, so the fits are exact and repeatable) stop short of the mode:
    on bench.calibration's datasets 0-19 q's own 90% intervals held 0.47 (VIPS) and 0.57 (DP-SEP) of the
    true weights, the document's, widened along the last step, 0.995 and 0.985. After ten steps the
    iteration has converged and the document's covariance is q's."""
    truths, means, own, reported = [], [], [], []
    for seed in range(20):
        data = draw("blr", seed, 10_000)
        short, converged = (estimator(t).fit(data.train, data.y) for t in (2, 10))
        truths.append(data.weights)
        means.append(short.coef_)
        own.append(np.sqrt(np.diag(short.state_.covariance)))
        reported.append(np.sqrt(np.diag(short.covariance_)))
        np.testing.assert_allclose(converged.covariance_, converged.state_.covariance, rtol=1e-6, atol=1e-12)
        kept = short.posterior_["variational_parameters"]  # q's own, and the step it was widened along
        np.testing.assert_array_equal(kept["covariance"], short.state_.covariance)
        np.testing.assert_array_equal(kept["last_step"], short.state_.last_step)
    truth, mean, sd_q, sd = (np.concatenate(v) for v in (truths, means, own, reported))
    assert np.mean(np.abs(truth - mean) <= Z90 * sd_q) < 0.7
    assert np.mean(np.abs(truth - mean) <= Z90 * sd) >= 0.9


@pytest.mark.slow
def test_the_services_schedule_at_epsilon_one_covers_the_true_weights() -> None:
    """Only epsilon 1 (the service's schedule: five whole-batch releases, Laplace from the second, gradient
    bound 0.35) on 150 datasets of bench.calibration's family (d 10 with an intercept, N 10,000,
    w ~ N(0, 9 I); seeds 500-649, apart from the tuning seeds 0-99 and the judging seeds 1000 and up): the
    nominal 90% intervals cover 80-97% of the 1,500 true weights and the means' slope on the truth is
    0.85-1.15 (issue 51). Three runs of this computation gave coverage 0.867-0.882 and slope 0.961-0.974
    (q unwidened, vips.models.blr.model "The last step", four runs: 0.847-0.877, standard deviation about
    0.014; without the bound too: 0.838-0.878, slope 0.935-0.951): 0.80 is about five of them below. The
    noise is not seeded (private releases)."""
    truths, means, sds = [], [], []
    for seed in range(500, 650):
        data = draw("blr", seed, 10_000)
        fitted = VIPSLogisticRegression(epsilon=1.0).fit(data.train, data.y)
        assert fitted.state_.releases == 5
        truths.append(data.weights)
        means.append(fitted.coef_)
        sds.append(np.sqrt(np.diag(fitted.covariance_)))
    truth, mean, sd = (np.concatenate(v) for v in (truths, means, sds))
    coverage = float(np.mean(np.abs(truth - mean) <= Z90 * sd))
    slope = float(truth @ mean / (truth @ truth))
    assert 0.80 <= coverage <= 0.97, coverage
    assert 0.85 <= slope <= 1.15, slope


def test_migration_0013_keeps_earlier_vips_blr_jobs_on_the_polya_gamma_e_step(tmp_path: Path) -> None:
    """A VIPS-BLR job stored before the option existed reads its releases as it made them (laplace_from 0)
    after the upgrade; a DPVI-BLR job and a job that already names the option are left as they were."""
    from alembic import command

    from control.store.models import jobs
    from vips.migrate import alembic_config, upgrade

    url = f"sqlite:///{tmp_path / 'control.db'}"
    command.upgrade(alembic_config("control", url), "0012")
    engine = create_engine(url)
    rows = {
        "old": ("blr", "vips", {"a0": 1.0}),
        "dpvi": ("blr", "dpvi", {"clip": 5.0}),
        "named": ("blr", "vips", {"laplace_from": 3}),
    }
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
        upgrade("control", url)
        with engine.connect() as conn:
            stored = dict(conn.execute(select(jobs.c.id, jobs.c.options)).all())
        assert stored == {
            "old": {"a0": 1.0, "laplace_from": 0},
            "dpvi": {"clip": 5.0},
            "named": {"laplace_from": 3},
        }
    finally:
        engine.dispose()
