"""In-process entry point for researchers: scikit-learn estimators over the same gate and accountant
(imported as `from vips import VIPSLogisticRegression, PrivacyBudget`; the loop is vips.fit_loop's).

    model = VIPSLogisticRegression(epsilon=1.0, delta=1e-5, iterations=5).fit(X, y)   # y: any two labels
    model.predict(X_test), model.predict_proba(X_test)[:, 1], model.epsilon_, model.posterior_
    lda = VIPSLatentDirichletAllocation(topics=20, sigma=1.24, batch_size=2000).fit(counts)   # CSR D x V
    sbn = VIPSSigmoidBeliefNetwork(hidden=20, epsilon=2.0, batch_size=400).fit(images)      # 0/1 rows

The wall checks the bounds its sensitivities assume (it does not rescale): BLR rows of L2 norm <= 1 (the
estimator encodes the two labels as 0, 1; data_norm, a public bound, divides and clips rows to that);
linear regression also targets |y| <= 1; LDA whole non-negative counts; SBN 0/1 values. sigma = 0 is a
non-private fit (epsilon infinite) and is the only kind that accepts random_state: private releases always
draw sampling and noise from the OS's CSPRNG.

They are scikit-learn estimators (BaseEstimator and its mixins): get_params / set_params / clone,
cross_val_score, GridSearchCV and Pipeline work. Classifiers take any two labels (strings too); the label
set (`classes_`) is part of the dataset's public schema, not a private release, so it is read from y
without noise; more than two classes are refused. `from_posterior(document)` turns a posterior document
(vips.posterior; e.g. downloaded with `vips posterior`) into an estimator that predicts and scores.

scikit-learn's estimator checks (sklearn.utils.estimator_checks.check_estimator) all pass at sigma = 0 with
random_state 0 once the checks' data are mapped row by row into the wall's bounds
(tests/test_estimator_sklearn.py). What does not apply, and why:
- Bounds: the checks fit on unbounded real data; the wall refuses (BoundViolation, never rescales) rows of
  norm > 1 (BLR, linreg), targets |y| > 1, counts that are not whole numbers (LDA) and values other than 0/1
  (SBN), so without that mapping every check that fits fails with a clear refusal.
- Seeding: the checks set random_state = 0, which private fits (sigma > 0) refuse by design.
- Reproducibility: unseeded, private fits differ from run to run, so check_fit_idempotent,
  check_pipeline_consistency, check_transformer_general, check_transformer_data_not_an_array,
  check_supervised_y_2d and check_regressors_int (which compare two fits) do not hold for them, nor
  check_regressors_train's accuracy threshold at the checks' small sizes (measured at epsilon 1).
"""

from __future__ import annotations

import math
import sys
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Self

import numpy as np
import scipy.sparse as sp
from numpy.typing import ArrayLike
from sklearn.base import BaseEstimator, ClassifierMixin, DensityMixin, RegressorMixin, TransformerMixin
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted, check_non_negative, validate_data

from privacy_wall.accounting.names import DEFAULT_ACCOUNTANT
from privacy_wall.data.store import (
    BoundViolation,
    InMemoryBinaryStore,
    InMemoryBowStore,
    InMemoryTabularStore,
    RowStore,
)
from vips.budget import PrivacyBudget
from vips.estimator_columns import validated_by_name
from vips.fit_loop import Progress, Schedule, fit_store
from vips.models.base import Array
from vips.models.blr.model import predict_proba
from vips.models.lda.model import completion_perplexity, document_topics, perplexity_bound, split_documents
from vips.models.linreg.model import predict as linreg_predict
from vips.models.sbn.model import heldout_nll, reconstruct_proba, reconstruction_metrics
from vips.posterior import (
    PosteriorError,
    blr_parameters,
    data_norm,
    lda_parameters,
    linreg_parameters,
    sbn_parameters,
)
from vips.preprocessing import within_data_norm

Sampling = Literal["uniform", "passes"]


@dataclass(kw_only=True, eq=False, repr=False)
class VipsEstimator(BaseEstimator):  # type: ignore[misc]
    """What every estimator shares: the privacy schedule, the loop over the gate, the posterior.

    Give either epsilon (sigma is calibrated for it at delta) or sigma. iterations and batch_size left None
    are chosen as the service chooses them (control.planning.schedules: from the model, the algorithm, N and
    epsilon alone; with sigma, T 10 and S = N for VIPS); given values win.
    sampling "uniform" (always with noise: S distinct rows drawn uniformly per iteration, what the
    accountant analyses) or "passes" (sigma = 0 only: shuffled passes over the data, as scikit-learn and
    gensim do; T iterations of S rows are T S / N passes). tau0, kappa: step sizes rho_t = (tau0 + t)^-kappa.
    accountant: "filter" (default: the budget's rule, valid however fits adapt to each other), "pld" (one
    fit alone; exact for S = N), "rdp" or "paper" (privacy_wall.accounting.accountants).
    budget: a PrivacyBudget (vips.budget) every fit is charged to and refused by once it would exceed it;
    shared by
    clone, not copied (fits in joblib worker processes are refused: use threads).
    Subclasses name their model and algorithm and add their options (docs/design.md section 6) as fields; an
    option left None takes the model's default (vips.models).
    """

    model_name: ClassVar[str]
    algorithm: ClassVar[str] = "vips"
    option_names: ClassVar[tuple[str, ...]] = ()

    epsilon: float | None = None
    delta: float = 1e-5
    sigma: float | None = None
    batch_size: int | None = None
    iterations: int | None = None
    tau0: float = 0.0
    kappa: float = 1.0
    random_state: int | None = None
    sampling: Sampling = "uniform"
    accountant: str = DEFAULT_ACCOUNTANT
    budget: PrivacyBudget | None = None

    def model_options(self) -> dict[str, float]:
        """The model's options that are set (None means the model's default)."""
        values = {name: getattr(self, name) for name in self.option_names}
        return {name: float(value) for name, value in values.items() if value is not None}

    def _schedule(self) -> Schedule:
        """The constructor's privacy schedule and step sizes, for vips.fit_loop."""
        return Schedule(
            epsilon=self.epsilon,
            delta=self.delta,
            sigma=self.sigma,
            batch_size=self.batch_size,
            iterations=self.iterations,
            tau0=self.tau0,
            kappa=self.kappa,
            random_state=self.random_state,
            sampling=self.sampling,
            accountant=self.accountant,
        )

    def _fit_store(
        self,
        make_store: Callable[[bool], RowStore],
        population: int,
        dataset: str,
        progress: Progress | None = None,
        extra: dict[str, Any] | None = None,
        dimension: int | None = None,
        vocabulary: Sequence[str] | None = None,
    ) -> dict[str, Any]:
        """Run the loop on the store `make_store(public)` builds (vips.fit_loop; charged to `budget` when
        set), calling `progress` after each iteration; set the fitted attributes and return the posterior
        document. Column names of a DataFrame X (feature_names_in_) are the features' public names."""
        if self.budget is not None and not isinstance(self.budget, PrivacyBudget):
            raise TypeError(f"budget must be a PrivacyBudget, not {type(self.budget).__name__}")
        if self.budget is not None:
            _warn_of_stratified_folds()
        fitted = fit_store(
            self.model_name,
            self.algorithm,
            self.model_options(),
            self._schedule(),
            make_store,
            population,
            dataset,
            progress=progress,
            budget=self.budget,
            extra=extra,
            dimension=dimension,
            vocabulary=vocabulary,
            columns=getattr(self, "feature_names_in_", None),
        )
        self.state_ = fitted.state
        self._set_posterior(fitted.document)
        return fitted.document

    def _set_posterior(self, document: dict[str, Any]) -> None:
        """Set posterior_, the privacy attributes and the model's fitted attributes from a document."""
        privacy = document.get("privacy")
        if not isinstance(privacy, Mapping):
            raise PosteriorError("a posterior needs a 'privacy' object")
        try:
            self.sigma_ = float(privacy["sigma"])
            self.epsilon_ = float(privacy["epsilon"]) if self.sigma_ > 0 else math.inf
            self.delta_ = float(privacy["delta"])
        except (KeyError, TypeError, ValueError) as exc:
            raise PosteriorError("a posterior's 'privacy' needs numeric sigma, epsilon and delta") from exc
        self.posterior_: dict[str, Any] = document
        self._set_parameters(document)

    def _set_parameters(self, document: dict[str, Any]) -> None:
        """The model's fitted attributes (coef_, components_, ...) from a validated posterior."""
        raise NotImplementedError

    @classmethod
    def from_posterior(cls, document: Mapping[str, Any], *, classes: ArrayLike | None = None) -> Self:
        """An estimator that predicts from a posterior document (vips.posterior's format, e.g. from
        `vips posterior`), without refitting: its constructor arguments are the document's schedule
        (sigma, delta, iterations, batch_size) and shape (LDA topics and alpha, SBN hidden), its fitted
        attributes the document's parameters.

        Called on VipsEstimator it picks the estimator of the document's model and algorithm; called on
        an estimator class it refuses another model's posterior. `classes` is what a document does not
        hold: a classifier's label set, part of the public schema (default [0, 1]).
        """
        model, algorithm = document.get("model"), document.get("algorithm", "vips")
        target = ESTIMATORS.get((str(model), str(algorithm)))
        if target is None:
            known = ", ".join(f"{m}/{a}" for m, a in ESTIMATORS)
            raise PosteriorError(f"no estimator for a {model}/{algorithm} posterior; expected one of {known}")
        if not issubclass(target, cls):
            raise PosteriorError(
                f"a {model}/{algorithm} posterior makes a {target.__name__}, not a {cls.__name__}"
            )
        privacy = document.get("privacy")
        if not isinstance(privacy, Mapping):
            raise PosteriorError("a posterior needs a 'privacy' object")
        try:
            estimator = target(
                sigma=float(privacy["sigma"]),
                delta=float(privacy["delta"]),
                iterations=int(privacy["iterations"]),
                batch_size=int(privacy["batch_size"]),
                **target._options_from(document),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise PosteriorError(
                "a posterior's 'privacy' needs sigma, delta, iterations and batch_size"
            ) from exc
        estimator._set_classes(classes)
        estimator._set_posterior(dict(document))
        return estimator

    @classmethod
    def _options_from(cls, document: Mapping[str, Any]) -> dict[str, Any]:
        """The constructor arguments a posterior document determines besides its schedule."""
        return {}

    def _set_classes(self, classes: ArrayLike | None) -> None:
        if classes is not None:
            raise TypeError(f"{type(self).__name__} is not a classifier: it takes no classes")


class StratifiedFoldsWarning(UserWarning):
    """A fit charged to a PrivacyBudget runs in a cross-validation whose folds are chosen by the labels."""


#: The names under which scikit-learn's cross_validate and BaseSearchCV.fit hold their checked splitter.
_SPLITTER_NAMES = ("cv", "cv_orig")


def _warn_of_stratified_folds() -> None:
    """Warn when a caller up the stack (cross_val_score, cross_validate, GridSearchCV: scikit-learn's
    model_selection, running the fits in this thread) splits by label: `cv=3` on a classifier becomes
    StratifiedKFold, whose folds move when one record's label changes, which the budget's per-fit charge
    does not cover (README, "One budget for several fits")."""
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_globals.get("__name__", "").startswith("sklearn.model_selection"):
            for name in _SPLITTER_NAMES:
                splitter = frame.f_locals.get(name)
                if splitter is not None and "Stratified" in type(splitter).__name__:
                    warnings.warn(
                        f"this fit is charged to a PrivacyBudget inside a cross-validation that splits by "
                        f"label ({type(splitter).__name__}; cv=k on a classifier picks it): its folds move "
                        "when one record's label changes, which the per-fit charge does not cover. Split by "
                        "index instead: cv=KFold(k) (README, 'One budget for several fits')",
                        StratifiedFoldsWarning,
                        stacklevel=3,
                    )
                    return
        frame = frame.f_back  # type: ignore[assignment]


@dataclass(kw_only=True, eq=False, repr=False)
class _BoundedRows(VipsEstimator):
    """data_norm: a public bound on the rows' L2 norm (diffprivlib's name and meaning; never computed from
    the data): rows are divided by it and any still above norm 1 clipped to norm 1 (a DataNormWarning
    counts them), and the posterior records it so that predictions divide rows by it too. None: rows must
    already have norm <= 1 (PublicBoundsScaler maps columns there from public per-column bounds)."""

    data_norm: float | None = None

    def _within_norm(self, features: Array) -> tuple[Array, dict[str, Any]]:
        """The rows the wall is given, and what the posterior records of data_norm."""
        if self.data_norm is None:
            return features, {}
        return within_data_norm(features, self.data_norm), {"data_norm": float(self.data_norm)}

    def _fit_store(self, make_store: Callable[[bool], RowStore], *args: Any, **kwargs: Any) -> dict[str, Any]:
        """VipsEstimator's, with the way out of a refusal of rows above norm 1 when no data_norm is given:
        data_norm, or PublicBoundsScaler (the message still names no value of the rows)."""
        try:
            return super()._fit_store(make_store, *args, **kwargs)
        except BoundViolation as exc:
            if self.data_norm is not None or "L2 norm above 1" not in str(exc):
                raise
            raise BoundViolation(
                f"{exc}: give {type(self).__name__} data_norm=B, a public bound on the rows' L2 norm (rows "
                "are divided by it, any still above clipped; standardised features have norms around sqrt(d) "
                "for d columns, so B a few times sqrt(d)), or map each column onto the unit ball from public "
                "bounds with PublicBoundsScaler (README, 'Unbounded rows')"
            ) from None

    @classmethod
    def _options_from(cls, document: Mapping[str, Any]) -> dict[str, Any]:
        return {"data_norm": data_norm(dict(document))} if "data_norm" in document else {}


class _LogisticRegressionFit(ClassifierMixin, _BoundedRows):  # type: ignore[misc]
    """fit / predict_proba / predict / score (accuracy) of the logistic-regression estimators (any
    algorithm). y holds any two labels: classes_ (sorted) is the public label set, classes_[1] the one
    the model's "1" stands for."""

    model_name = "blr"

    def fit(
        self, X: ArrayLike, y: ArrayLike, *, dataset: str = "local", progress: Progress | None = None
    ) -> Self:
        features, labels = validate_data(self, X, y, dtype=np.float64)
        check_classification_targets(labels)
        classes = np.unique(labels)
        if classes.shape[0] != 2:
            count = classes.shape[0]
            raise ValueError(
                f"Only binary classification is supported: {type(self).__name__} needs exactly two "
                f"classes in y, got {count} class{'' if count == 1 else 'es'}"
            )
        self.classes_ = classes
        ones = (labels == classes[1]).astype(np.float64)
        population = int(features.shape[0])
        rows, extra = self._within_norm(features)
        self._fit_store(
            lambda public: InMemoryTabularStore(dataset, rows, ones, public=public),
            population,
            dataset,
            progress,
            extra,
            dimension=int(features.shape[1]),  # the rule reads VIPS-BLR's scale at d (public: X's width)
        )
        return self

    def _set_classes(self, classes: ArrayLike | None) -> None:
        labels = np.asarray([0, 1] if classes is None else classes)
        if labels.shape != (2,) or labels[0] == labels[1]:
            raise ValueError("classes must be two distinct labels")
        self.classes_ = np.sort(labels)

    def _set_parameters(self, document: dict[str, Any]) -> None:
        self.coef_, self.covariance_ = blr_parameters(document)
        self.n_features_in_ = int(self.coef_.shape[0])

    def predict_proba(self, X: ArrayLike) -> Array:
        """Columns P(y = classes_[0] | x), P(y = classes_[1] | x), as in scikit-learn."""
        check_is_fitted(self, "posterior_")
        features = validated_by_name(self, X)
        p1 = predict_proba(self.coef_, self.covariance_, features)
        return np.column_stack([1 - p1, p1])

    def decision_function(self, X: ArrayLike) -> Array:
        """The log-odds of classes_[1] under the predictive distribution."""
        p = np.clip(self.predict_proba(X)[:, 1], 1e-300, 1 - 1e-16)
        return np.asarray(np.log(p) - np.log1p(-p))

    def predict(self, X: ArrayLike) -> Array:
        """The more probable label of classes_ for each row."""
        ones = self.predict_proba(X)[:, 1] >= 0.5
        return np.asarray(self.classes_[ones.astype(np.intp)])

    def __sklearn_tags__(self) -> Any:
        tags = super().__sklearn_tags__()
        tags.classifier_tags.multi_class = False
        return tags


@dataclass(kw_only=True, eq=False, repr=False)
class VIPSLogisticRegression(_LogisticRegressionFit):
    """Private Bayesian logistic regression by VIPS (Park et al. 2020, Alg. 5); a0, b0: the Gamma prior
    on the weights' precision; noise_aware: the M-step that accounts for the noise on s1 (False: the
    paper's update; vips.models.blr.model); laplace_from: the first release taken as the log-likelihood's
    gradient and curvature at the current mean, a Newton step whose posterior is the Laplace
    approximation's (0: the paper's Polya-Gamma E-step throughout; None: the service's rule with epsilon,
    else 2); pool_from: the first Laplace release whose curvature is pooled (None: the rule's, else
    laplace_from); gradient_bound: the wall's bound on each record's gradient term (None: the rule's, else
    1/2, which clips nothing)."""

    option_names = ("a0", "b0", "noise_aware", "laplace_from", "pool_from", "gradient_bound")

    a0: float = 1.0
    b0: float = 1.0
    noise_aware: bool = True
    laplace_from: int | None = None
    pool_from: int | None = None
    gradient_bound: float | None = None


@dataclass(kw_only=True, eq=False, repr=False)
class DPVILogisticRegression(_LogisticRegressionFit):
    """Private Bayesian logistic regression by DPVI (Jalko, Dikmen, Honkela 2017): a mean-field Gaussian
    fitted by AdaGrad on clipped, noised per-example ELBO gradients, charged on the same accountant.

    iterations are AdaGrad steps (DPVI needs many more than VIPS: hundreds or thousands, not tens; the
    step sizes tau0, kappa do not apply); clip bounds each example's gradient, learning_rate is AdaGrad's,
    draws the Monte Carlo samples per step; noise_aware: the posterior from the iterates' trace, whose
    intervals carry the noise of the steps (vips.models.blr.dpvi; False: the last iterate, as the paper).
    """

    algorithm = "dpvi"
    option_names = ("clip", "learning_rate", "draws", "prior_variance", "noise_aware")

    clip: float | None = None
    learning_rate: float | None = None
    draws: int | None = None
    prior_variance: float | None = None
    noise_aware: bool | None = None


@dataclass(kw_only=True, eq=False, repr=False)
class DPSEPLogisticRegression(_LogisticRegressionFit):
    """Private Bayesian logistic regression by DP-SEP (private stochastic expectation propagation): one
    shared Gaussian site moment-matched per datapoint behind the wall, clipped to norm `clip`, noised, and
    mixed in with damping x rho_t (kappa = 0 is the paper's constant damping); noise_aware: each site
    released centred at the current mean and read by a noise-aware Newton step, whose intervals carry the
    release noise (vips.models.blr.dpsep; False: the paper's damped average; None: the service's rule)."""

    algorithm = "dpsep"
    option_names = ("clip", "damping", "prior_variance", "noise_aware")

    clip: float | None = None
    damping: float | None = None
    prior_variance: float | None = None
    noise_aware: bool | None = None


class _LinearRegressionFit(RegressorMixin, _BoundedRows):  # type: ignore[misc]
    """fit / predict / score (R^2) of the linear-regression estimators (rows of norm <= 1, targets
    |y| <= 1)."""

    model_name = "linreg"

    def fit(
        self, X: ArrayLike, y: ArrayLike, *, dataset: str = "local", progress: Progress | None = None
    ) -> Self:
        features, targets = validate_data(self, X, y, dtype=np.float64, y_numeric=True)
        population = int(features.shape[0])
        rows, extra = self._within_norm(features)
        self._fit_store(
            lambda public: InMemoryTabularStore(dataset, rows, targets, public=public, kind="regression"),
            population,
            dataset,
            progress,
            extra,
            dimension=int(features.shape[1]),
        )
        return self

    def _set_parameters(self, document: dict[str, Any]) -> None:
        self.coef_, self.covariance_, self.noise_variance_ = linreg_parameters(document)
        self.n_features_in_ = int(self.coef_.shape[0])

    def predict(self, X: ArrayLike, *, return_std: bool = False) -> Array | tuple[Array, Array]:
        """The predictive mean of y (and its standard deviation, noise included, with return_std)."""
        check_is_fitted(self, "posterior_")
        features = validated_by_name(self, X)
        mean, variance = linreg_predict(self.coef_, self.covariance_, self.noise_variance_, features)
        return (mean, np.sqrt(variance)) if return_std else mean


@dataclass(kw_only=True, eq=False, repr=False)
class VIPSLinearRegression(_LinearRegressionFit):
    """Private conjugate Bayesian linear regression by VIPS (Normal-Gamma: w | tau ~ N(0, (tau
    prior_precision)^-1 I), tau ~ Gamma(a0, b0))."""

    option_names = ("prior_precision", "a0", "b0")

    prior_precision: float | None = None
    a0: float | None = None
    b0: float | None = None


@dataclass(kw_only=True, eq=False, repr=False)
class DPSEPLinearRegression(_LinearRegressionFit):
    """Private Bayesian linear regression by DP-SEP (vips.models.linreg.dpsep): noise_aware True (default)
    learns the noise variance and carries the release noise into the intervals; False is the paper's model
    with a known noise_variance (1 unless given). None options: as the service chooses them with epsilon, else
    the model's default (clip: each site's bound under the ingestion bounds, so nothing is clipped)."""

    algorithm = "dpsep"
    option_names = ("clip", "damping", "prior_variance", "noise_variance", "noise_aware")

    clip: float | None = None
    damping: float | None = None
    prior_variance: float | None = None
    noise_variance: float | None = None
    noise_aware: bool | None = None


@dataclass(kw_only=True, eq=False, repr=False)
class VIPSLatentDirichletAllocation(TransformerMixin, VipsEstimator):  # type: ignore[misc]
    """Private LDA by VIPS (Park et al. 2020, Alg. 3) on a documents x words count matrix (anything
    scipy.sparse.csr_array accepts).

    doc_length N_w: documents are resampled to N_w tokens inside the wall (0 keeps them: sigma 0 only);
    clip a: each document's contribution is clipped to a N_w. unigram_share, unigram_clip: the unigram
    fallback (privacy_wall.queries.lda); None: as the service chooses them with epsilon
    (control.planning.schedules), else the model's default (none). vocabulary: the words of the columns
    (public), carried into the posterior; word_prior 1 (default) lets the fallback's unigram shrink towards
    public English word frequencies when the vocabulary is English (vips.models.lda.word_prior), 0 not.
    smoothing f: the M-step's pull of the topics towards the corpus's word frequencies (None: a job's
    default, vips.models.lda.model.default_smoothing: 0.2 with resampled documents, 0 with doc_length 0; 0 is
    the paper's M-step).
    """

    model_name = "lda"
    option_names = (
        "topics", "alpha", "eta", "smoothing", "doc_length", "clip", "unigram_share", "unigram_clip",
        "word_prior",
    )  # fmt: skip

    topics: int = 10
    alpha: float | None = None
    eta: float | None = None
    smoothing: float | None = None
    doc_length: int = 500
    clip: float = 0.1
    unigram_share: float | None = None
    unigram_clip: float | None = None
    word_prior: int | None = None
    vocabulary: Sequence[str] | None = None

    def fit(
        self, counts: Any, y: object = None, *, dataset: str = "local", progress: Progress | None = None
    ) -> Self:
        """Fit on a documents x words count matrix; y is ignored (there for Pipeline)."""
        matrix = sp.csr_array(validate_data(self, counts, accept_sparse="csr", dtype=np.float64))
        check_non_negative(matrix, f"{type(self).__name__}.fit")
        population = int(matrix.shape[0])
        vocabulary = None if self.vocabulary is None else [str(word) for word in self.vocabulary]
        if vocabulary is not None and len(vocabulary) != matrix.shape[1]:
            raise ValueError(f"vocabulary has {len(vocabulary)} words for {matrix.shape[1]} columns")
        self._fit_store(
            lambda public: InMemoryBowStore(dataset, matrix, public=public),
            population,
            dataset,
            progress,
            None if vocabulary is None else {"vocabulary": vocabulary},
            dimension=int(matrix.shape[1]),
            vocabulary=vocabulary,
        )
        return self

    @classmethod
    def _options_from(cls, document: Mapping[str, Any]) -> dict[str, Any]:
        fitted = lda_parameters(dict(document))
        return {"topics": int(fitted.lam.shape[0]), "alpha": fitted.alpha}

    def _set_parameters(self, document: dict[str, Any]) -> None:
        fitted = lda_parameters(document)
        self.components_, self.doc_topic_prior_ = fitted.lam, fitted.alpha
        self.n_features_in_ = int(self.components_.shape[1])

    def _counts(self, counts: Any) -> Any:
        check_is_fitted(self, "posterior_")
        return sp.csr_array(validate_data(self, counts, accept_sparse="csr", dtype=np.float64, reset=False))

    def transform(self, counts: Any) -> Array:
        """Topic proportions E[theta_d] of each document (rows sum to 1)."""
        return document_topics(self.components_, self._counts(counts), self.doc_topic_prior_)

    def score(self, counts: Any, y: object = None) -> float:
        """The approximate log-likelihood of the documents: the ELBO summed over documents (a lower bound,
        as scikit-learn's LatentDirichletAllocation.score), -log(perplexity bound) x tokens."""
        matrix = self._counts(counts)
        tokens = float(matrix.sum())
        return -math.log(perplexity_bound(self.components_, matrix, self.doc_topic_prior_)) * tokens

    def perplexity(self, counts: Any, *, seed: int = 0) -> dict[str, float]:
        """Held-out perplexity: document completion (half of each document's tokens fit its topic
        proportions, the other half is scored) and the paper's bound on all tokens."""
        matrix = self._counts(counts)
        observed, held_out = split_documents(matrix, seed=seed)
        return {
            "perplexity": completion_perplexity(self.components_, observed, held_out, self.doc_topic_prior_),
            "perplexity_bound": perplexity_bound(self.components_, matrix, self.doc_topic_prior_),
        }

    def __sklearn_tags__(self) -> Any:
        tags = super().__sklearn_tags__()
        tags.input_tags.positive_only = True
        tags.input_tags.sparse = True
        return tags


@dataclass(kw_only=True, eq=False, repr=False)
class VIPSSigmoidBeliefNetwork(DensityMixin, VipsEstimator):  # type: ignore[misc]
    """Private sigmoid belief network by VIPS (Park et al. 2020, Alg. 6) on 0/1 rows.

    frequency_copies: the copies of the pixel frequencies in each release (privacy_wall.queries.sbn);
    init_scale: the spread of the initial weights (vips.models.sbn.model); None: as the service chooses them
    with epsilon (control.planning.schedules), else the model's defaults.
    """

    model_name = "sbn"
    option_names = ("hidden", "frequency_copies", "init_scale")

    hidden: int = 50
    frequency_copies: int | None = None
    init_scale: float | None = None

    def fit(
        self, Y: ArrayLike, y: object = None, *, dataset: str = "local", progress: Progress | None = None
    ) -> Self:
        """Fit on 0/1 rows (images); y is ignored (there for Pipeline)."""
        rows = validate_data(self, Y, dtype=np.float64)
        check_non_negative(rows, f"{type(self).__name__}.fit")
        population = int(rows.shape[0])
        self._fit_store(
            lambda public: InMemoryBinaryStore(dataset, rows, public=public), population, dataset, progress
        )
        return self

    @classmethod
    def _options_from(cls, document: Mapping[str, Any]) -> dict[str, Any]:
        return {"hidden": int(sbn_parameters(dict(document)).b.shape[0])}

    def _set_parameters(self, document: dict[str, Any]) -> None:
        fitted = sbn_parameters(document)
        self.W_, self.b_, self.c_ = fitted.W, fitted.b, fitted.c
        self.n_features_in_ = int(self.W_.shape[0])

    def _rows(self, Y: ArrayLike) -> Array:
        check_is_fitted(self, "posterior_")
        return validated_by_name(self, Y)

    def reconstruct_proba(self, Y: ArrayLike) -> Array:
        """p(y_nj = 1 | <z_n>) for each row (n x J): the reconstruction of each image."""
        return reconstruct_proba(self._rows(Y), self.W_, self.b_, self.c_)

    def reconstruction_metrics(self, Y: ArrayLike) -> dict[str, float]:
        """Reconstruction pixel accuracy and negative log-likelihood (nats per row)."""
        return reconstruction_metrics(self._rows(Y), self.W_, self.b_, self.c_)

    def heldout_nll(self, Y: ArrayLike) -> dict[str, Any]:
        """The rows' held-out negative log-likelihood, mean -log p(y_n) in nats with z summed out (exactly up
        to 12 hidden units, else importance-sampled: an upper bound in expectation), with its "method" and
        "samples" (vips.models.sbn.model.heldout_nll; what `vips evaluate` reports as "nll")."""
        return heldout_nll(self._rows(Y), self.W_, self.b_, self.c_)

    def score(self, Y: ArrayLike, y: object = None) -> float:
        """The per-image log-likelihood of the rows' reconstructions, mean log p(y_n | <z_n>) in nats, with
        z read from each scored row (higher is better; fast, but it flatters a fit: heldout_nll is the
        likelihood of held-out rows; reconstruction_metrics has this one as "nll")."""
        return -self.reconstruction_metrics(Y)["nll"]

    def __sklearn_tags__(self) -> Any:
        tags = super().__sklearn_tags__()
        tags.input_tags.positive_only = True
        return tags


#: The estimator of each (model, algorithm): from_posterior and `vips fit --local` pick from it.
ESTIMATORS: dict[tuple[str, str], type[VipsEstimator]] = {
    ("blr", "vips"): VIPSLogisticRegression,
    ("blr", "dpvi"): DPVILogisticRegression,
    ("blr", "dpsep"): DPSEPLogisticRegression,
    ("linreg", "vips"): VIPSLinearRegression,
    ("linreg", "dpsep"): DPSEPLinearRegression,
    ("lda", "vips"): VIPSLatentDirichletAllocation,
    ("sbn", "vips"): VIPSSigmoidBeliefNetwork,
}
