"""In-process entry point for researchers: a scikit-learn style estimator over the same gate and accountant.

    model = VIPSLogisticRegression(epsilon=1.0, delta=1e-5, iterations=5).fit(X, y)
    model.predict_proba(X_test)[:, 1], model.epsilon_, model.posterior_

Rows must already have L2 norm <= 1 and labels in {0, 1} (the wall checks, it does not rescale).
sigma = 0 is a non-private fit (epsilon infinite) and is the only kind that accepts random_state: private
releases always draw sampling and noise from the OS's CSPRNG.
"""

from __future__ import annotations

import math
import uuid
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from privacy_wall.accounting import ACCOUNTANT_VERSION, SubsampledGaussianEvent, calibrate_sigma, epsilon
from privacy_wall.gate import Gate, PrivacyError
from privacy_wall.ledger import InMemoryLedger
from privacy_wall.queries.blr import LogisticRegressionQuery
from privacy_wall.store import InMemoryTabularStore
from worker.models.base import Array
from worker.models.blr import BayesianLogisticRegression, BlrState, predict_proba
from worker.posterior import Privacy, blr_parameters, build_posterior
from worker.runner import LoopSettings, run_vips


class VIPSLogisticRegression:
    """Private Bayesian logistic regression by VIPS (Park et al. 2020, Alg. 5).

    Give either epsilon (sigma is calibrated for it) or sigma. batch_size None means S = N (batch mode).
    """

    def __init__(
        self,
        *,
        epsilon: float | None = None,
        delta: float = 1e-5,
        sigma: float | None = None,
        batch_size: int | None = None,
        iterations: int = 10,
        tau0: float = 0.0,
        kappa: float = 1.0,
        a0: float = 1.0,
        b0: float = 1.0,
        random_state: int | None = None,
    ) -> None:
        self.epsilon = epsilon
        self.delta = delta
        self.sigma = sigma
        self.batch_size = batch_size
        self.iterations = iterations
        self.tau0 = tau0
        self.kappa = kappa
        self.a0 = a0
        self.b0 = b0
        self.random_state = random_state

    def _resolve_sigma(self, batch_size: int, population: int) -> float:
        if (self.epsilon is None) == (self.sigma is None):
            raise ValueError("give exactly one of epsilon and sigma")
        if self.sigma is not None:
            if not self.sigma >= 0:
                raise ValueError("sigma must be >= 0")
            return float(self.sigma)
        assert self.epsilon is not None
        return calibrate_sigma(self.epsilon, batch_size, population, self.iterations, self.delta)

    def fit(self, X: ArrayLike, y: ArrayLike, *, dataset: str = "local") -> VIPSLogisticRegression:
        features = np.asarray(X, dtype=np.float64)
        labels = np.asarray(y, dtype=np.float64)
        population = int(features.shape[0]) if features.ndim == 2 else 0
        batch_size = population if self.batch_size is None else int(self.batch_size)
        sigma = self._resolve_sigma(batch_size, max(population, 1))
        settings = LoopSettings(self.iterations, batch_size, sigma, self.tau0, self.kappa)
        public = sigma == 0
        if self.random_state is not None and not public:
            raise PrivacyError(
                "random_state is only accepted with sigma = 0: private releases cannot be seeded"
            )
        store = InMemoryTabularStore(dataset, features, labels, public=public)
        ledger = InMemoryLedger(delta=self.delta, epsilon_budget=self.epsilon)
        gate = Gate(store, ledger, seed=self.random_state)
        job_id = uuid.uuid4().hex
        ledger.reserve(job_id, SubsampledGaussianEvent(sigma, batch_size, population), self.iterations)
        model = BayesianLogisticRegression(self.a0, self.b0)
        try:
            result = run_vips(
                gate,
                LogisticRegressionQuery(),
                model,
                settings,
                job_id=job_id,
                dimension=store.info.dimension,
                population=population,
            )
        finally:
            ledger.refund(job_id)
        self.state_: BlrState = result.state
        self.sigma_ = sigma
        self.epsilon_ = ledger.epsilon_spent() if sigma > 0 else math.inf
        self.delta_ = self.delta
        self.coef_ = result.state.mean
        self.covariance_ = result.state.covariance
        self.posterior_: dict[str, Any] = build_posterior(
            model="blr",
            algorithm="vips",
            dataset=dataset,
            job_id=job_id,
            privacy=Privacy(
                epsilon=self.epsilon_,
                delta=self.delta,
                sigma=sigma,
                iterations=self.iterations,
                batch_size=batch_size,
                population=population,
                accountant=ACCOUNTANT_VERSION,
            ),
            parameters=model.posterior(result.state),
        )
        return self

    def predict_proba(self, X: ArrayLike) -> Array:
        """Columns P(y=0|x), P(y=1|x), as in scikit-learn."""
        mean, covariance = blr_parameters(self.posterior_)
        p1 = predict_proba(mean, covariance, np.asarray(X, dtype=np.float64))
        return np.column_stack([1 - p1, p1])

    def predict(self, X: ArrayLike) -> Array:
        return (self.predict_proba(X)[:, 1] >= 0.5).astype(np.float64)


def quoted_epsilon(sigma: float, batch_size: int, population: int, iterations: int, delta: float) -> float:
    """The accountant's quote for a schedule (re-exported for researchers)."""
    return epsilon(sigma, batch_size, population, iterations, delta)
