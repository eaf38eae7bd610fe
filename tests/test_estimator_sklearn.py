"""The in-process estimators (vips.estimators): the progress hook and the scikit-learn contract.

Public fits (sigma = 0, random_state 0) carry the property assertions: they are the only reproducible ones.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
from typing import Any

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.base import clone
from sklearn.model_selection import GridSearchCV, cross_val_score
from sklearn.pipeline import Pipeline, make_pipeline
from sklearn.preprocessing import FunctionTransformer
from sklearn.utils.estimator_checks import check_estimator

from vips import fit_loop
from vips.estimators import (
    DPSEPLinearRegression,
    DPSEPLogisticRegression,
    DPVILogisticRegression,
    VipsEstimator,
    VIPSLatentDirichletAllocation,
    VIPSLinearRegression,
    VIPSLogisticRegression,
    VIPSSigmoidBeliefNetwork,
)
from vips.posterior import PosteriorError

ESTIMATOR_CLASSES: list[type[VipsEstimator]] = [
    VIPSLogisticRegression,
    DPVILogisticRegression,
    DPSEPLogisticRegression,
    VIPSLinearRegression,
    DPSEPLinearRegression,
    VIPSLatentDirichletAllocation,
    VIPSSigmoidBeliefNetwork,
]


def _tabular(n: int = 120, d: int = 3, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Rows of norm <= 1 and 0/1 labels from a planted logistic model."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    X /= np.maximum(1.0, np.linalg.norm(X, axis=1))[:, None]
    y = (rng.random(n) < 1 / (1 + np.exp(-4 * X[:, 0]))).astype(np.float64)
    return X, y


def _strings(y: np.ndarray) -> np.ndarray:
    return np.where(y == 1, "yes", "no")


def _public(cls: type[VipsEstimator], **options: Any) -> Any:
    return cls(sigma=0.0, random_state=0, **options)


def test_progress_is_called_after_each_iteration_with_the_epsilon_spent_so_far(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(fit_loop, "PRICE_INTERVAL", 0.0)  # re-priced at every iteration
    X, y = _tabular()
    calls: list[tuple[int, int, float]] = []
    model = VIPSLogisticRegression(epsilon=1.0, iterations=4, batch_size=40)
    model.fit(X, y, progress=lambda done, total, spent: calls.append((done, total, spent)))
    assert [(done, total) for done, total, _ in calls] == [(1, 4), (2, 4), (3, 4), (4, 4)]
    spent = [eps for _, _, eps in calls]
    assert all(0 < a < b for a, b in itertools.pairwise(spent))
    assert spent[-1] == pytest.approx(model.epsilon_) and model.epsilon_ <= 1.0 + 1e-9


def test_progress_reprices_at_most_every_interval_and_after_the_last_iteration(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Between two prices the hook repeats the last one (a price takes milliseconds; 1,000 of them were
    most of a DPVI fit); the first and the last iteration are always priced."""
    monkeypatch.setattr(fit_loop, "PRICE_INTERVAL", 1e9)
    X, y = _tabular()
    calls: list[float] = []
    model = VIPSLogisticRegression(epsilon=1.0, iterations=4, batch_size=40)
    model.fit(X, y, progress=lambda done, total, spent: calls.append(spent))
    assert calls[0] == calls[1] == calls[2] < calls[3] == pytest.approx(model.epsilon_)


def test_progress_of_a_public_fit_reports_infinite_epsilon() -> None:
    X, y = _tabular()
    calls: list[float] = []
    VIPSLogisticRegression(sigma=0.0, iterations=3, random_state=0).fit(
        X, y, progress=lambda done, total, spent: calls.append(spent)
    )
    assert calls == [math.inf] * 3


@pytest.mark.parametrize("cls", ESTIMATOR_CLASSES, ids=lambda cls: cls.__name__)
def test_params_are_the_constructor_arguments_and_clone_keeps_them(cls: type[VipsEstimator]) -> None:
    names = {field.name for field in dataclasses.fields(cls)}
    estimator = cls(epsilon=0.5, iterations=7)
    assert set(estimator.get_params()) == names
    copy = clone(estimator.set_params(delta=1e-6))
    assert copy is not estimator and copy.get_params() == estimator.get_params()
    assert copy.delta == 1e-6 and copy.iterations == 7


def test_classifier_takes_any_two_labels_and_predicts_them() -> None:
    X, y = _tabular(200)
    labels = _strings(y)
    model = _public(VIPSLogisticRegression, iterations=5).fit(X, labels)
    assert list(model.classes_) == ["no", "yes"]
    assert set(model.predict(X)) <= {"no", "yes"}
    proba = model.predict_proba(X)
    assert np.allclose(proba.sum(axis=1), 1)
    assert np.array_equal(model.predict(X), np.where(proba[:, 1] >= 0.5, "yes", "no"))
    accuracy = model.score(X, labels)
    assert isinstance(accuracy, float) and accuracy == np.mean(model.predict(X) == labels) and accuracy > 0.7
    # the same fit on 0/1 labels gives the same probabilities: "yes" (sorted last) is the model's 1
    assert np.allclose(_public(VIPSLogisticRegression, iterations=5).fit(X, y).predict_proba(X), proba)


def test_classifier_refuses_other_than_two_classes() -> None:
    X, _ = _tabular(30)
    with pytest.raises(ValueError, match=r"Only binary classification is supported.*got 3 classes"):
        _public(VIPSLogisticRegression).fit(X, np.arange(30) % 3)
    with pytest.raises(ValueError, match=r"got 1 class$"):
        _public(VIPSLogisticRegression).fit(X, np.ones(30))


def test_cross_val_score_with_string_labels_and_roc_auc() -> None:
    X, y = _tabular(300)
    scores = cross_val_score(
        _public(VIPSLogisticRegression, iterations=5), X, _strings(y), cv=3, scoring="roc_auc"
    )
    assert scores.shape == (3,) and (scores > 0.75).all()
    private = cross_val_score(
        VIPSLogisticRegression(epsilon=1.0, iterations=5), X, _strings(y), cv=3, scoring="roc_auc"
    )
    assert private.shape == (3,) and np.isfinite(private).all()


@pytest.mark.parametrize(
    ("cls", "options"),
    [
        (DPVILogisticRegression, {"iterations": 200}),
        (DPSEPLogisticRegression, {"iterations": 5}),
    ],
    ids=["dpvi", "dpsep"],
)
def test_every_classifier_cross_validates_on_string_labels(
    cls: type[VipsEstimator], options: dict[str, Any]
) -> None:
    X, y = _tabular(300)
    scores = cross_val_score(_public(cls, **options), X, _strings(y), cv=3, scoring="roc_auc")
    assert scores.shape == (3,) and (scores > 0.75).all()


@pytest.mark.parametrize(
    ("estimator", "data"),
    [
        (_public(DPSEPLinearRegression, iterations=3), "regression"),
        (_public(VIPSLatentDirichletAllocation, topics=2, iterations=3, doc_length=0), "counts"),
        (_public(VIPSSigmoidBeliefNetwork, hidden=2, iterations=2), "binary"),
    ],
    ids=["dpsep-linreg", "lda", "sbn"],
)
def test_the_other_estimators_cross_validate_on_their_score(estimator: VipsEstimator, data: str) -> None:
    rng = np.random.default_rng(3)
    rows = rng.uniform(-0.5, 0.5, size=(90, 3))
    inputs: Any = {
        "regression": rows,
        "counts": _documents(),
        "binary": (rng.random((90, 6)) < 0.3).astype(np.float64),
    }[data]
    targets = np.clip(rows @ np.array([0.8, -0.4, 0.2]), -1, 1) if data == "regression" else None
    scores = cross_val_score(estimator, inputs, targets, cv=3)
    assert scores.shape == (3,) and np.isfinite(scores).all()
    if data == "regression":
        assert (scores > 0.5).all()  # R^2


def test_grid_search_and_pipeline() -> None:
    X, y = _tabular(240)
    search = GridSearchCV(
        _public(VIPSLogisticRegression, iterations=5), {"b0": [0.01, 1.0, 100.0]}, cv=3, scoring="roc_auc"
    ).fit(X, _strings(y))
    assert search.best_params_["b0"] in (0.01, 1.0, 100.0) and search.best_score_ > 0.75
    # rows scaled into the unit ball by a per-row map (no statistic of the data: nothing to privatise)
    pipeline = make_pipeline(
        FunctionTransformer(lambda rows: rows / np.maximum(1, np.linalg.norm(rows, axis=1))[:, None]),
        _public(VIPSLogisticRegression, iterations=5),
    )
    score = pipeline.fit(3 * X, _strings(y)).score(3 * X, _strings(y))
    assert isinstance(score, float) and score > 0.7


def test_regressor_score_is_r2_and_from_posterior_predicts_the_same() -> None:
    rng = np.random.default_rng(1)
    X = rng.uniform(-0.5, 0.5, size=(200, 3))
    y = np.clip(X @ np.array([0.8, -0.4, 0.2]) + 0.05 * rng.normal(size=200), -1, 1)
    model = _public(VIPSLinearRegression, iterations=3).fit(X, y)
    r2 = model.score(X, y)
    assert isinstance(r2, float) and 0.8 < r2 <= 1
    copy = VIPSLinearRegression.from_posterior(json.loads(json.dumps(model.posterior_)))
    assert np.allclose(copy.predict(X), model.predict(X)) and copy.score(X, y) == pytest.approx(r2)


def test_from_posterior_picks_the_estimator_and_keeps_the_label_set() -> None:
    X, y = _tabular(150)
    model = VIPSLogisticRegression(epsilon=1.0, iterations=3).fit(X, _strings(y))
    document = json.loads(json.dumps(model.posterior_))
    copy = VipsEstimator.from_posterior(document, classes=["yes", "no"])
    assert type(copy) is VIPSLogisticRegression and list(copy.classes_) == ["no", "yes"]
    assert np.array_equal(copy.predict(X), model.predict(X))
    assert copy.epsilon_ == pytest.approx(model.epsilon_) and copy.sigma == model.sigma_
    assert list(VIPSLogisticRegression.from_posterior(document).classes_) == [0, 1]
    with pytest.raises(PosteriorError, match="makes a VIPSLogisticRegression, not a VIPSLinearRegression"):
        VIPSLinearRegression.from_posterior(document)
    with pytest.raises(PosteriorError, match="no estimator for a blr/gibbs posterior"):
        VipsEstimator.from_posterior({**document, "algorithm": "gibbs"})


def _documents(seed: int = 0) -> sp.csr_array:
    """60 documents over 12 words from 2 planted topics (words 0-5 and 6-11)."""
    rng = np.random.default_rng(seed)
    topic = rng.integers(0, 2, size=60)
    counts = np.zeros((60, 12))
    for d, k in enumerate(topic):
        counts[d] = rng.multinomial(40, np.r_[np.full(6, 0.15), np.full(6, 0.1 / 6)][:: 1 - 2 * k])
    return sp.csr_array(counts)


def test_lda_is_a_transformer_with_a_log_likelihood_score() -> None:
    counts = _documents()
    model = _public(VIPSLatentDirichletAllocation, topics=2, iterations=5, doc_length=0)
    topics = model.fit_transform(counts)
    assert topics.shape == (60, 2) and np.allclose(topics.sum(axis=1), 1)
    score = model.score(counts)
    bound = model.perplexity(counts)["perplexity_bound"]
    assert isinstance(score, float) and score == pytest.approx(-math.log(bound) * counts.sum())
    assert Pipeline([("lda", clone(model))]).fit(counts).score(counts) == pytest.approx(score)
    copy = VIPSLatentDirichletAllocation.from_posterior(model.posterior_)
    assert np.allclose(copy.transform(counts), topics) and copy.topics == 2


def test_sbn_score_is_the_per_image_log_likelihood() -> None:
    rng = np.random.default_rng(2)
    images = (rng.random((80, 10)) < np.r_[np.full(5, 0.9), np.full(5, 0.1)]).astype(np.float64)
    model = _public(VIPSSigmoidBeliefNetwork, hidden=2, iterations=3).fit(images)
    score = model.score(images)
    assert isinstance(score, float) and score == -model.reconstruction_metrics(images)["nll"]
    copy = VipsEstimator.from_posterior(json.loads(json.dumps(model.posterior_)))
    assert isinstance(copy, VIPSSigmoidBeliefNetwork) and copy.hidden == 2 and copy.score(images) == score
    # better than coin flips on every pixel
    assert score > -10 * math.log(2)
    # the held-out likelihood sums z out instead of reading it from each row: exact at 2 units, and lower
    heldout = model.heldout_nll(images)
    assert heldout["method"] == "exact" and -10 * math.log(2) < -heldout["nll"] < score


def _into_bounds(kind: str, X: Any) -> Any:
    """scikit-learn's check data mapped row by row into the wall's bounds (test only: the estimators
    refuse rows out of bounds, they never rescale them). Data a check sends to provoke an error (NaN,
    complex, negative counts or pixels, 1-d, objects) pass through unchanged."""
    if sp.issparse(X):
        matrix = sp.csr_array(X, dtype=np.float64)
        if kind != "counts" or (matrix.data < 0).any():
            return X
        matrix.data = np.rint(matrix.data)
        return matrix
    raw = np.asarray(X)
    try:
        rows = raw.astype(np.float64) if raw.dtype.kind != "c" else raw
    except (TypeError, ValueError):
        return X
    if rows.ndim != 2 or rows.dtype.kind == "c" or rows.size == 0 or not np.isfinite(rows).all():
        return X
    if kind == "ball":
        return rows / np.maximum(1.0, np.linalg.norm(rows, axis=1))[:, None]
    if (rows < 0).any():
        return X
    return np.rint(rows) if kind == "counts" else (rows > np.median(rows)).astype(np.float64)


def _targets_into_bounds(y: Any) -> Any:
    raw = np.asarray(y)
    try:
        targets = raw.astype(np.float64) if raw.dtype.kind != "c" else raw
    except (TypeError, ValueError):
        return y
    if targets.dtype.kind == "c" or targets.size == 0 or not np.isfinite(targets).all():
        return y
    return targets / max(1.0, float(np.abs(targets).max()))


@dataclasses.dataclass(kw_only=True, eq=False, repr=False)
class _CheckedClassifier(VIPSLogisticRegression):
    def fit(self, X: Any, y: Any, **options: Any) -> Any:
        return super().fit(_into_bounds("ball", X), y, **options)


@dataclasses.dataclass(kw_only=True, eq=False, repr=False)
class _CheckedRegressor(VIPSLinearRegression):
    def fit(self, X: Any, y: Any, **options: Any) -> Any:
        return super().fit(_into_bounds("ball", X), _targets_into_bounds(y), **options)


@dataclasses.dataclass(kw_only=True, eq=False, repr=False)
class _CheckedDpvi(DPVILogisticRegression):
    def fit(self, X: Any, y: Any, **options: Any) -> Any:
        return super().fit(_into_bounds("ball", X), y, **options)


@dataclasses.dataclass(kw_only=True, eq=False, repr=False)
class _CheckedDpsep(DPSEPLogisticRegression):
    def fit(self, X: Any, y: Any, **options: Any) -> Any:
        return super().fit(_into_bounds("ball", X), y, **options)


@dataclasses.dataclass(kw_only=True, eq=False, repr=False)
class _CheckedDpsepRegressor(DPSEPLinearRegression):
    def fit(self, X: Any, y: Any, **options: Any) -> Any:
        return super().fit(_into_bounds("ball", X), _targets_into_bounds(y), **options)


@dataclasses.dataclass(kw_only=True, eq=False, repr=False)
class _CheckedLda(VIPSLatentDirichletAllocation):
    def fit(self, counts: Any, y: object = None, **options: Any) -> Any:
        return super().fit(_into_bounds("counts", counts), y, **options)


@dataclasses.dataclass(kw_only=True, eq=False, repr=False)
class _CheckedSbn(VIPSSigmoidBeliefNetwork):
    def fit(self, Y: Any, y: object = None, **options: Any) -> Any:
        return super().fit(_into_bounds("binary", Y), y, **options)


@pytest.mark.parametrize(
    "estimator",
    [
        _CheckedClassifier(sigma=0.0, random_state=0, iterations=3),
        _CheckedRegressor(sigma=0.0, random_state=0, iterations=3),
        _CheckedDpvi(sigma=0.0, random_state=0, iterations=50),
        _CheckedDpsep(sigma=0.0, random_state=0, iterations=3),
        _CheckedDpsepRegressor(sigma=0.0, random_state=0, iterations=3),
        _CheckedLda(sigma=0.0, random_state=0, iterations=2, topics=3, doc_length=0),
        _CheckedSbn(sigma=0.0, random_state=0, iterations=2, hidden=3),
    ],
    ids=lambda estimator: type(estimator).__name__,
)
def test_scikit_learn_estimator_checks_pass_on_data_within_the_bounds(estimator: VipsEstimator) -> None:
    results = check_estimator(estimator, on_fail=None)
    failed = [f"{r['check_name']}: {r['exception']}" for r in results if r["status"] == "failed"]
    assert failed == []
    # none skipped either: the DataFrame checks need pandas, which the dev extra installs (issue 37)
    skipped = [f"{r['check_name']}: {r['exception']}" for r in results if r["status"] == "skipped"]
    assert skipped == []
    assert sum(r["status"] == "passed" for r in results) >= 35
