"""In-process entry point for researchers: scikit-learn style estimators over the same gate and accountant.

    model = VIPSLogisticRegression(epsilon=1.0, delta=1e-5, iterations=5).fit(X, y)
    model.predict_proba(X_test)[:, 1], model.epsilon_, model.posterior_
    lda = VIPSLatentDirichletAllocation(topics=20, sigma=1.24, batch_size=2000).fit(counts)   # CSR D x V
    sbn = VIPSSigmoidBeliefNetwork(hidden=20, epsilon=2.0, batch_size=400).fit(images)      # 0/1 rows

The wall checks the bounds its sensitivities assume (it does not rescale): BLR rows of L2 norm <= 1 and
labels in {0, 1}; LDA whole non-negative counts; SBN 0/1 values. sigma = 0 is a non-private fit (epsilon
infinite) and is the only kind that accepts random_state: private releases always draw sampling and noise
from the OS's CSPRNG.
"""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Self

import numpy as np
import scipy.sparse as sp
from numpy.typing import ArrayLike

from privacy_wall.accounting import SubsampledGaussianEvent, calibrate_sigma, epsilon, get_accountant
from privacy_wall.gate import Gate, PrivacyError
from privacy_wall.ledger import InMemoryLedger
from privacy_wall.store import InMemoryBinaryStore, InMemoryBowStore, InMemoryTabularStore, RowStore
from worker.models.base import Array
from worker.models.blr import predict_proba
from worker.models.lda import completion_perplexity, document_topics, perplexity_bound, split_documents
from worker.models.linreg import predict as linreg_predict
from worker.models.registry import model_setup
from worker.models.sbn import reconstruct_proba, reconstruction_metrics
from worker.posterior import (
    Privacy,
    blr_parameters,
    build_posterior,
    lda_parameters,
    linreg_parameters,
    sbn_parameters,
)
from worker.runner import LoopSettings, run_vips

Sampling = Literal["uniform", "passes"]


@dataclass(kw_only=True, eq=False)
class VipsEstimator:
    """What every estimator shares: the privacy schedule, the loop over the gate, the posterior.

    Give either epsilon (sigma is calibrated for it at delta) or sigma. batch_size None means S = N.
    sampling "uniform" (always with noise: S distinct rows drawn uniformly per iteration, what the
    accountant analyses) or "passes" (sigma = 0 only: shuffled passes over the data, as scikit-learn and
    gensim do; T iterations of S rows are T S / N passes). tau0, kappa: step sizes rho_t = (tau0 + t)^-kappa.
    accountant: "pld" (default; exact for S = N), "rdp" or "paper" (privacy_wall.accounting).
    Subclasses name their model and algorithm and add their options (DESIGN section 6) as fields; an
    option left None takes the model's default (worker.models).
    """

    model_name: ClassVar[str]
    algorithm: ClassVar[str] = "vips"
    option_names: ClassVar[tuple[str, ...]] = ()

    epsilon: float | None = None
    delta: float = 1e-5
    sigma: float | None = None
    batch_size: int | None = None
    iterations: int = 10
    tau0: float = 0.0
    kappa: float = 1.0
    random_state: int | None = None
    sampling: Sampling = "uniform"
    accountant: str = "pld"

    def model_options(self) -> dict[str, float]:
        """The model's options that are set (None means the model's default)."""
        values = {name: getattr(self, name) for name in self.option_names}
        return {name: float(value) for name, value in values.items() if value is not None}

    def _resolve_sigma(self, batch_size: int, population: int) -> float:
        if (self.epsilon is None) == (self.sigma is None):
            raise ValueError("give exactly one of epsilon and sigma")
        if self.sigma is not None:
            if not self.sigma >= 0:
                raise ValueError("sigma must be >= 0")
            return float(self.sigma)
        assert self.epsilon is not None
        return calibrate_sigma(
            self.epsilon, batch_size, population, self.iterations, self.delta, accountant=self.accountant
        )

    def _fit_store(self, make_store: Any, population: int, dataset: str) -> dict[str, Any]:
        """Run the loop on the store `make_store(public)` builds; set the fitted attributes and return
        the posterior document."""
        batch_size = population if self.batch_size is None else int(self.batch_size)
        sigma = self._resolve_sigma(batch_size, max(population, 1))
        settings = LoopSettings(self.iterations, batch_size, sigma, self.tau0, self.kappa)
        public = sigma == 0
        if self.random_state is not None and not public:
            raise PrivacyError(
                "random_state is only accepted with sigma = 0: private releases cannot be seeded"
            )
        if self.sampling not in ("uniform", "passes"):
            raise ValueError("sampling must be 'uniform' or 'passes'")
        passes = self.sampling == "passes"
        if passes and not public:
            raise PrivacyError("sampling='passes' is only for sigma = 0: private fits sample uniformly")
        setup = model_setup(self.model_name, self.model_options(), sigma=sigma, algorithm=self.algorithm)
        store: RowStore = make_store(public)
        accountant = get_accountant(self.accountant)
        ledger = InMemoryLedger(delta=self.delta, epsilon_budget=self.epsilon, accountant=accountant)
        gate = Gate(store, ledger, seed=self.random_state, passes=passes)
        job_id = uuid.uuid4().hex
        ledger.reserve(job_id, SubsampledGaussianEvent(sigma, batch_size, population), self.iterations)
        try:
            result = run_vips(
                gate,
                setup.query,
                setup.model,
                settings,
                job_id=job_id,
                dimension=store.info.dimension,
                population=population,
            )
        finally:
            ledger.refund(job_id)
        self.state_ = result.state
        self.sigma_ = sigma
        self.epsilon_ = ledger.epsilon_spent() if sigma > 0 else math.inf
        self.delta_ = self.delta
        self.posterior_: dict[str, Any] = build_posterior(
            model=self.model_name,
            algorithm=self.algorithm,
            dataset=dataset,
            job_id=job_id,
            privacy=Privacy(
                epsilon=self.epsilon_,
                delta=self.delta,
                sigma=sigma,
                iterations=self.iterations,
                batch_size=batch_size,
                population=population,
                accountant=accountant.version,
                sampling="shuffled_passes" if passes else "without_replacement",
            ),
            parameters=setup.model.posterior(result.state),
        )
        return self.posterior_


class _LogisticRegressionFit(VipsEstimator):
    """fit / predict_proba / predict of the logistic-regression estimators (any algorithm)."""

    model_name = "blr"

    def fit(self, X: ArrayLike, y: ArrayLike, *, dataset: str = "local") -> Self:
        features = np.asarray(X, dtype=np.float64)
        labels = np.asarray(y, dtype=np.float64)
        population = int(features.shape[0]) if features.ndim == 2 else 0
        self._fit_store(
            lambda public: InMemoryTabularStore(dataset, features, labels, public=public), population, dataset
        )
        self.coef_, self.covariance_ = blr_parameters(self.posterior_)
        return self

    def predict_proba(self, X: ArrayLike) -> Array:
        """Columns P(y=0|x), P(y=1|x), as in scikit-learn."""
        mean, covariance = blr_parameters(self.posterior_)
        p1 = predict_proba(mean, covariance, np.asarray(X, dtype=np.float64))
        return np.column_stack([1 - p1, p1])

    def predict(self, X: ArrayLike) -> Array:
        return (self.predict_proba(X)[:, 1] >= 0.5).astype(np.float64)


@dataclass(kw_only=True, eq=False)
class VIPSLogisticRegression(_LogisticRegressionFit):
    """Private Bayesian logistic regression by VIPS (Park et al. 2020, Alg. 5); a0, b0: the Gamma prior
    on the weights' precision."""

    option_names = ("a0", "b0")

    a0: float = 1.0
    b0: float = 1.0


@dataclass(kw_only=True, eq=False)
class DPVILogisticRegression(_LogisticRegressionFit):
    """Private Bayesian logistic regression by DPVI (Jalko, Dikmen, Honkela 2017): a mean-field Gaussian
    fitted by AdaGrad on clipped, noised per-example ELBO gradients, charged on the same accountant.

    iterations are AdaGrad steps (DPVI needs many more than VIPS: hundreds or thousands, not tens; the
    step sizes tau0, kappa do not apply); clip bounds each example's gradient, learning_rate is AdaGrad's,
    draws the Monte Carlo samples per step.
    """

    algorithm = "dpvi"
    option_names = ("clip", "learning_rate", "draws", "prior_variance")

    iterations: int = 1000
    clip: float | None = None
    learning_rate: float | None = None
    draws: int | None = None
    prior_variance: float | None = None


@dataclass(kw_only=True, eq=False)
class DPSEPLogisticRegression(_LogisticRegressionFit):
    """Private Bayesian logistic regression by DP-SEP (private stochastic expectation propagation): one
    shared Gaussian site moment-matched per datapoint behind the wall, clipped to norm `clip`, noised, and
    mixed in with damping x rho_t (kappa = 0 is the paper's constant damping)."""

    algorithm = "dpsep"
    option_names = ("clip", "damping", "prior_variance")

    clip: float | None = None
    damping: float | None = None
    prior_variance: float | None = None


class _LinearRegressionFit(VipsEstimator):
    """fit / predict of the linear-regression estimators (rows of norm <= 1, targets |y| <= 1)."""

    model_name = "linreg"

    def fit(self, X: ArrayLike, y: ArrayLike, *, dataset: str = "local") -> Self:
        features = np.asarray(X, dtype=np.float64)
        targets = np.asarray(y, dtype=np.float64)
        population = int(features.shape[0]) if features.ndim == 2 else 0
        self._fit_store(
            lambda public: InMemoryTabularStore(dataset, features, targets, public=public, kind="regression"),
            population,
            dataset,
        )
        self.coef_, self.covariance_, self.noise_variance_ = linreg_parameters(self.posterior_)
        return self

    def predict(self, X: ArrayLike, *, return_std: bool = False) -> Array | tuple[Array, Array]:
        """The predictive mean of y (and its standard deviation, noise included, with return_std)."""
        mean, variance = linreg_predict(
            self.coef_, self.covariance_, self.noise_variance_, np.asarray(X, dtype=np.float64)
        )
        return (mean, np.sqrt(variance)) if return_std else mean


@dataclass(kw_only=True, eq=False)
class VIPSLinearRegression(_LinearRegressionFit):
    """Private conjugate Bayesian linear regression by VIPS (Normal-Gamma: w | tau ~ N(0, (tau
    prior_precision)^-1 I), tau ~ Gamma(a0, b0))."""

    option_names = ("prior_precision", "a0", "b0")

    prior_precision: float | None = None
    a0: float | None = None
    b0: float | None = None


@dataclass(kw_only=True, eq=False)
class DPSEPLinearRegression(_LinearRegressionFit):
    """Private Bayesian linear regression by DP-SEP with a known noise variance (clip None bounds each
    site by the ingestion bounds, so nothing is clipped)."""

    algorithm = "dpsep"
    option_names = ("clip", "damping", "prior_variance", "noise_variance")

    clip: float | None = None
    damping: float | None = None
    prior_variance: float | None = None
    noise_variance: float | None = None


@dataclass(kw_only=True, eq=False)
class VIPSLatentDirichletAllocation(VipsEstimator):
    """Private LDA by VIPS (Park et al. 2020, Alg. 3) on a documents x words count matrix (anything
    scipy.sparse.csr_array accepts).

    doc_length N_w: documents are resampled to N_w tokens inside the wall (0 keeps them: sigma 0 only);
    clip a: each document's contribution is clipped to a N_w.
    """

    model_name = "lda"
    option_names = ("topics", "alpha", "eta", "doc_length", "clip")

    topics: int = 10
    alpha: float | None = None
    eta: float | None = None
    doc_length: int = 500
    clip: float = 0.1

    def fit(self, counts: Any, *, dataset: str = "local") -> VIPSLatentDirichletAllocation:
        matrix = sp.csr_array(counts)
        population = int(matrix.shape[0])
        self._fit_store(lambda public: InMemoryBowStore(dataset, matrix, public=public), population, dataset)
        fitted = lda_parameters(self.posterior_)
        self.components_, self.doc_topic_prior_ = fitted.lam, fitted.alpha
        return self

    def transform(self, counts: Any) -> Array:
        """Topic proportions E[theta_d] of each document (rows sum to 1)."""
        return document_topics(self.components_, sp.csr_array(counts), self.doc_topic_prior_)

    def perplexity(self, counts: Any, *, seed: int = 0) -> dict[str, float]:
        """Held-out perplexity: document completion (half of each document's tokens fit its topic
        proportions, the other half is scored) and the paper's bound on all tokens."""
        matrix = sp.csr_array(counts)
        observed, held_out = split_documents(matrix, seed=seed)
        return {
            "perplexity": completion_perplexity(self.components_, observed, held_out, self.doc_topic_prior_),
            "perplexity_bound": perplexity_bound(self.components_, matrix, self.doc_topic_prior_),
        }


@dataclass(kw_only=True, eq=False)
class VIPSSigmoidBeliefNetwork(VipsEstimator):
    """Private sigmoid belief network by VIPS (Park et al. 2020, Alg. 6) on 0/1 rows."""

    model_name = "sbn"
    option_names = ("hidden",)

    hidden: int = 50

    def fit(self, Y: ArrayLike, *, dataset: str = "local") -> VIPSSigmoidBeliefNetwork:
        rows = np.asarray(Y, dtype=np.float64)
        population = int(rows.shape[0]) if rows.ndim == 2 else 0
        self._fit_store(lambda public: InMemoryBinaryStore(dataset, rows, public=public), population, dataset)
        fitted = sbn_parameters(self.posterior_)
        self.W_, self.b_, self.c_ = fitted.W, fitted.b, fitted.c
        return self

    def reconstruct_proba(self, Y: ArrayLike) -> Array:
        """p(y_nj = 1 | <z_n>) for each row (n x J): the reconstruction of each image."""
        return reconstruct_proba(np.asarray(Y, dtype=np.float64), self.W_, self.b_, self.c_)

    def score(self, Y: ArrayLike) -> dict[str, float]:
        """Reconstruction pixel accuracy and negative log-likelihood (nats per row)."""
        return reconstruction_metrics(np.asarray(Y, dtype=np.float64), self.W_, self.b_, self.c_)


def quoted_epsilon(
    sigma: float, batch_size: int, population: int, iterations: int, delta: float, accountant: str = "pld"
) -> float:
    """The accountant's quote for a schedule (re-exported for researchers)."""
    return epsilon(sigma, batch_size, population, iterations, delta, accountant)
