"""Scaling rows to the unit ball from public bounds, as the models' sensitivities require (||x|| <= 1,
|y| <= 1 for regression targets).

The bounds must be public (a codebook, a questionnaire's range, a physical limit), never read from the
data: a bound computed from the rows would itself leak them. Values outside their bounds are clipped.

    x_j -> clip(2 (x_j - lower_j) / (upper_j - lower_j) - 1, -1, 1),  then the row / sqrt(d [+ 1])

so every coordinate is in [-1, 1] and every row, with the optional intercept column of 1s, has norm <= 1.
The estimators' data_norm (within_data_norm) is the per-row way: rows / data_norm, clipped to norm 1.
"""

from __future__ import annotations

import math
import warnings
from numbers import Real
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray
from sklearn.base import BaseEstimator, TransformerMixin
from sklearn.utils.validation import check_is_fitted, validate_data

# A hair above the exact divisor so that rounding never pushes a norm above 1.
_ROUNDING_MARGIN = 1.0 + 1e-12


def _bounds(lower: ArrayLike, upper: ArrayLike) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    low = np.atleast_1d(np.asarray(lower, dtype=np.float64))
    high = np.atleast_1d(np.asarray(upper, dtype=np.float64))
    if low.shape != high.shape or low.ndim != 1:
        raise ValueError("lower and upper need one bound per column")
    if not (np.all(np.isfinite(low)) and np.all(np.isfinite(high))):
        raise ValueError("the bounds must be finite numbers")
    if np.any(high <= low):
        raise ValueError(
            f"every upper bound must exceed its lower bound (column {int(np.argmax(high <= low))})"
        )
    return low, high


def to_unit_interval(values: ArrayLike, lower: ArrayLike, upper: ArrayLike) -> NDArray[np.float64]:
    """Each column mapped affinely from [lower, upper] onto [-1, 1], values outside clipped."""
    low, high = _bounds(lower, upper)
    return np.clip(2.0 * (np.asarray(values, dtype=np.float64) - low) / (high - low) - 1.0, -1.0, 1.0)


def from_unit_interval(values: ArrayLike, lower: float, upper: float) -> NDArray[np.float64]:
    """The inverse of to_unit_interval for one column: a regression posterior's predictions (fitted on
    targets scaled to [-1, 1]) back in the target's units."""
    low, high = _bounds(lower, upper)
    return np.asarray(low[0] + (np.asarray(values, dtype=np.float64) + 1.0) * (high[0] - low[0]) / 2.0)


class DataNormWarning(UserWarning):
    """Rows had an L2 norm above the estimator's public data_norm and were clipped to it."""


def within_data_norm(rows: ArrayLike, data_norm: float) -> NDArray[np.float64]:
    """Rows divided by the public bound data_norm (diffprivlib's meaning: the largest L2 norm of a row), any
    still above norm 1 clipped to norm 1 with a DataNormWarning counting them; the bound must be public,
    never computed from the rows (see the module docstring)."""
    if isinstance(data_norm, bool) or not isinstance(data_norm, Real) or not 0 < data_norm < math.inf:
        raise ValueError(
            f"data_norm must be a finite number > 0 (a public bound on the rows' norm), not {data_norm!r}"
        )
    scaled = np.asarray(rows, dtype=np.float64) / float(data_norm)
    norms = np.linalg.norm(scaled, axis=1)
    over = norms > 1.0
    if over.any():
        scaled[over] /= norms[over, np.newaxis] * _ROUNDING_MARGIN
        warnings.warn(
            clipping_advice(int(over.sum()), scaled.shape[0], scaled.shape[1], data_norm),
            DataNormWarning,
            stacklevel=2,
        )
    return scaled


def clipping_advice(count: int, rows: int, columns: int, data_norm: float) -> str:
    """The DataNormWarning: how many rows were clipped and what to do about it. It names no row and no
    norm of the rows: the suggested bound comes from the number of columns only (a public fact)."""
    typical = math.sqrt(columns)
    share = count / rows if rows else 0.0
    message = (
        f"{count} of {rows} rows had an L2 norm above data_norm={data_norm:g} and were clipped to it "
        f"({share:.0%} of the rows)"
    )
    if share < 0.05:
        return f"{message} (see the README, 'Unbounded rows')"
    return (
        f"{message}; clipping that many rows biases the fit (it may score below the majority class). "
        "data_norm must be a public bound on the rows' norm, never computed from them: standardised "
        "features (StandardScaler: each column mean 0, variance 1) have norms around sqrt(d) = "
        f"{typical:.3g} for these d = {columns} columns, so they need a data_norm of a few times that (e.g. "
        f"{3 * typical:.3g} = 3 sqrt(d)), at the price of more noise per row; or map each column onto the "
        "unit ball from public bounds with PublicBoundsScaler instead of StandardScaler (README, 'Unbounded "
        "rows')"
    )


class PublicBoundsScaler(TransformerMixin, BaseEstimator):  # type: ignore[misc]
    """Rows to norm <= 1 from public per-column bounds (module docstring); `intercept` prepends a column
    of 1s (scaled like the rest) so that a linear model has its offset. `fit` reads nothing of X but its
    width: it can precede a private estimator in a Pipeline without spending privacy."""

    def __init__(self, lower: Any = None, upper: Any = None, intercept: bool = True) -> None:
        self.lower = lower
        self.upper = upper
        self.intercept = intercept

    def fit(self, X: ArrayLike, y: object = None) -> PublicBoundsScaler:
        if self.lower is None or self.upper is None:
            raise ValueError("PublicBoundsScaler needs public bounds: lower=[...] and upper=[...]")
        rows: NDArray[np.float64] = validate_data(self, X, reset=True)
        low, high = _bounds(self.lower, self.upper)
        if low.shape[0] != rows.shape[1]:
            raise ValueError(f"{low.shape[0]} bounds for {rows.shape[1]} columns")
        self.lower_, self.upper_ = low, high
        self.divisor_ = math.sqrt(rows.shape[1] + int(self.intercept)) * _ROUNDING_MARGIN
        return self

    def transform(self, X: ArrayLike) -> NDArray[np.float64]:
        check_is_fitted(self, "divisor_")
        columns = to_unit_interval(validate_data(self, X, reset=False), self.lower_, self.upper_)
        if self.intercept:
            columns = np.hstack([np.ones((columns.shape[0], 1)), columns])
        return np.asarray(columns / self.divisor_)

    def get_feature_names_out(self, input_features: Any = None) -> NDArray[np.object_]:
        check_is_fitted(self, "divisor_")
        names = (
            list(input_features)
            if input_features is not None
            else list(getattr(self, "feature_names_in_", [f"x{j}" for j in range(self.n_features_in_)]))
        )
        return np.asarray((["intercept"] if self.intercept else []) + names, dtype=object)
