"""A public regression dataset that works offline, scaled to the bounds of Bayesian linear regression.

Source: scikit-learn's bundled diabetes data (`sklearn.datasets.load_diabetes`: 442 patients, 10 numeric
baseline variables, a disease-progression target in 25..346; shipped with scikit-learn, no download).
California housing (20,640 districts, 8 features) is used instead when asked for and already in
scikit-learn's data home; it is never downloaded (`download_if_missing=False`): `name="auto"` takes it
when cached and falls back to diabetes otherwise.

Split: a fixed-seed random permutation, `test_fraction` of the rows to the test split.

Scaling, so that every row has ||x|| <= 1 and every target |y| <= 1 (the ingestion bounds of
privacy_wall.queries.linreg):

- each raw feature j is mapped to [-1, 1] by (v - centre_j) / half_range_j, where centre_j and
  half_range_j are the mid-range and half-range of column j **in the training split**, and clipped to
  [-1, 1] (so test rows outside the training range are clipped);
- a constant intercept feature 1 is prepended, and every row is divided by sqrt(1 + #features), the
  largest norm such a row can have (a fixed constant, not a statistic of the rows);
- targets are mapped by (y - target_centre) / target_scale with the mid-range and half-range of the
  **training** targets, and clipped to [-1, 1].

The feature centres and half-ranges and the target centre and scale are computed from the training rows.
That is fine for this public dataset, and the constants are returned (`RegressionSplit.feature_centre`, ...)
so the scaling is documented and reproducible. In a private deployment they would leak information about
the rows: they must then be public bounds fixed without looking at the data (as vips.datasets.adult
does), e.g. published ranges of each measurement. (scikit-learn's diabetes features themselves were
centred and scaled by their standard deviation over all 442 rows before shipping; that is part of the
public dataset as distributed.)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import NDArray

__all__ = ["RegressionData", "RegressionSplit", "california_is_cached", "load_regression"]

Array = NDArray[np.float64]

DatasetName = Literal["auto", "diabetes", "california"]


@dataclass(frozen=True)
class RegressionData:
    """A design matrix (rows of norm <= 1, intercept first), real targets in [-1, 1], column names."""

    features: Array
    targets: Array
    feature_names: list[str]

    def __post_init__(self) -> None:
        if self.features.ndim != 2 or self.targets.shape != (self.features.shape[0],):
            raise ValueError("features must be (N, d) and targets (N,)")
        if len(self.feature_names) != self.features.shape[1]:
            raise ValueError("one feature name per column is required")


@dataclass(frozen=True)
class RegressionSplit:
    """Train and test splits with the scaling constants (module docstring) and the source's name.

    A prediction p in scaled units is p * target_scale + target_centre in the source's units, and an RMSE
    in scaled units times target_scale is the RMSE in the source's units.
    """

    train: RegressionData
    test: RegressionData
    source: str
    feature_centre: Array
    feature_half_range: Array
    target_centre: float
    target_scale: float


def california_is_cached() -> bool:
    """Whether scikit-learn's California housing data is already in its data home (no download)."""
    from sklearn.datasets import fetch_california_housing

    try:
        fetch_california_housing(download_if_missing=False)
    except OSError:
        return False
    return True


def _raw(name: DatasetName) -> tuple[Array, Array, list[str], str]:
    from sklearn.datasets import fetch_california_housing, load_diabetes

    if name == "auto":
        name = "california" if california_is_cached() else "diabetes"
    if name == "california":
        bunch = fetch_california_housing(download_if_missing=False)
    elif name == "diabetes":
        bunch = load_diabetes()
    else:
        raise ValueError("name must be 'auto', 'diabetes' or 'california'")
    features = np.asarray(bunch.data, dtype=np.float64)
    targets = np.asarray(bunch.target, dtype=np.float64)
    return features, targets, list(bunch.feature_names), name


def _centre_and_half_range(values: Array) -> tuple[Array, Array]:
    low, high = values.min(axis=0), values.max(axis=0)
    half = (high - low) / 2.0
    return (high + low) / 2.0, np.where(half > 0, half, 1.0)


def load_regression(
    name: DatasetName = "auto", *, test_fraction: float = 0.2, seed: int = 0
) -> RegressionSplit:
    """Load, split and scale a public regression dataset (module docstring).

    Parameters
    ----------
    name
        "diabetes" (bundled with scikit-learn), "california" (only if cached; OSError otherwise) or "auto"
        (California when cached, else diabetes).
    test_fraction
        Fraction of rows in the test split, in (0, 1).
    seed
        Seed of the split's permutation.

    Returns
    -------
    RegressionSplit
        Features (N, 1 + p) with an intercept column first and ||x|| <= 1; targets in [-1, 1].
    """
    if not 0 < test_fraction < 1:
        raise ValueError("test_fraction must be in (0, 1)")
    raw_x, raw_y, names, source = _raw(name)
    n = raw_x.shape[0]
    order = np.random.default_rng(seed).permutation(n)
    n_test = max(1, round(test_fraction * n))
    test_rows, train_rows = order[:n_test], order[n_test:]

    centre, half = _centre_and_half_range(raw_x[train_rows])
    y_centre, y_half = _centre_and_half_range(raw_y[train_rows, None])
    target_centre, target_scale = float(y_centre[0]), float(y_half[0])
    # A hair above sqrt(1 + p) so that rounding can never push a norm above 1.
    divisor = math.sqrt(1 + raw_x.shape[1]) * (1.0 + 1e-12)

    def scale(rows: NDArray[np.intp]) -> RegressionData:
        columns = np.clip((raw_x[rows] - centre) / half, -1.0, 1.0)
        features = np.hstack([np.ones((rows.shape[0], 1)), columns]) / divisor
        targets = np.clip((raw_y[rows] - target_centre) / target_scale, -1.0, 1.0)
        return RegressionData(features, targets, ["intercept", *names])

    return RegressionSplit(
        train=scale(train_rows),
        test=scale(test_rows),
        source=source,
        feature_centre=centre,
        feature_half_range=half,
        target_centre=target_centre,
        target_scale=target_scale,
    )
