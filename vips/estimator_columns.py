"""The estimators' prediction input, validated, its columns matched to the fitted ones by name."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
from sklearn.utils.validation import validate_data

from vips.columns import by_name
from vips.models.base import Array
from vips.posterior import feature_columns


def expected_columns(estimator: Any) -> tuple[str, ...] | None:
    """The feature columns' names a fitted estimator knows: its posterior's `columns`, else the names
    scikit-learn kept from a DataFrame at fit (feature_names_in_); None when neither names them."""
    names = feature_columns(estimator.posterior_, int(estimator.n_features_in_))
    if names is None and hasattr(estimator, "feature_names_in_"):
        names = tuple(str(name) for name in estimator.feature_names_in_)
    return names


def validated_by_name(estimator: Any, X: Any) -> Array:
    """X validated for prediction by a fitted estimator, its columns matched to the fitted ones by name when
    X names them (a DataFrame-like `columns`, a structured array); plain arrays are positional. A
    ColumnMismatch (a ValueError) names every missing and unexpected column."""
    ordered = by_name(X, expected_columns(estimator), source=f"{type(estimator).__name__}: X")
    with warnings.catch_warnings():
        if ordered is not X:  # matched by name already: scikit-learn's check of names would only warn
            warnings.filterwarnings("ignore", message="X does not have valid feature names")
        return np.asarray(validate_data(estimator, ordered, dtype=np.float64, reset=False))
