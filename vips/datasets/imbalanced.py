"""Synthetic imbalanced logistic data shaped like MLC churn (public, generated; issue 35's tuning stand-in
for held-out data with few positives): an intercept, 11 Beta(4, 4) features (mean 1/2), two rare 0/1
flags (10% and 27%) and a 3-level one-hot, divided by sqrt(15) (norm <= 1); weights mostly positive on the
numeric features (as usage drives churn), the offset set for ~14% positives. Nonnegative features with
nonzero means make z = sum (y - 1/2) x mostly (share - 1/2) N mean(x) (vips/models/blr/model.py, the
intercept step)."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray
from scipy.special import expit

from vips.datasets.adult import TabularData

__all__ = ["imbalanced_split"]


def _draw(
    rng: np.random.Generator, n: int, weights: NDArray[np.float64], offset: float
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    numeric = rng.beta(4.0, 4.0, size=(n, 11))
    flags = (rng.random((n, 2)) < np.array([0.1, 0.27])).astype(np.float64)
    levels = np.eye(3)[rng.integers(0, 3, n)]
    raw = np.hstack([numeric, flags, levels])
    labels = (rng.random(n) < expit(offset + raw @ weights)).astype(np.float64)
    features: NDArray[np.float64] = np.hstack([np.ones((n, 1)), raw]) / np.sqrt(15.0)
    return features, labels


def imbalanced_split(
    train_rows: int = 3500, test_rows: int = 20_000, seed: int = 35
) -> tuple[TabularData, TabularData]:
    """(train, test) drawn alike from one fixed model (seed: the weights and the rows)."""
    rng = np.random.default_rng(seed)
    weights = np.zeros(16)
    weights[:11] = np.abs(rng.normal(0.0, 2.0, 11)) * np.where(rng.random(11) < 0.8, 1.0, -1.0)
    weights[11:13] = [2.0, -0.7]
    offset = -2.3 - float(np.sum(weights[:11]) / 2)  # ~14% positives
    names = ["intercept", *(f"x{j}" for j in range(1, 12)), "flag1", "flag2", "level=a", "level=b", "level=c"]
    train = TabularData(*_draw(rng, train_rows, weights, offset), names)
    test = TabularData(*_draw(rng, test_rows, weights, offset), names)
    return train, test
