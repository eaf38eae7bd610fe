"""Credit scoring (4,454 loan applicants; modeldata's credit_data) with public, data-independent
preprocessing.

The second held-out tabular dataset of issue 35 (after MLC churn, which was spent once): no method,
default or schedule was chosen on it. Label 1 means a bad credit ("Status" = "bad"). Every constant below
was fixed from the data dictionary (the column names, their units where stated, the category levels)
before any fit on the rows:

- Records (yes/no) is a 0/1 feature; Home, Marital and Job are one-hot over their levels (a missing level
  is all zeros);
- Seniority (years in the job) over [0, 50], Time (the loan's term, months) over [0, 72] and Age (years)
  over [18, 100], linearly; the six money amounts (Expenses, Income, Assets, Debt, Amount, Price; the
  dictionary gives no unit) on a log scale log(1 + x) over [0, 100,000]; values outside are clipped and a
  missing amount counts as 0;
- a constant intercept 1 first; each row divided by the fixed maximum norm sqrt(1 + 9 + 1 + 3).

There is no official test split: `load_credit` splits by a fixed public permutation (seed 0), 70% / 30%
(vips.datasets.bundled). Source and licence: vips/datasets/data/README.md.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from numpy.typing import NDArray

from vips.datasets.adult import TabularData
from vips.datasets.bundled import encode_tabular, load_split, tabular_feature_names

__all__ = ["BINARY", "CATEGORICAL", "NUMERIC_BOUNDS", "feature_names", "load_credit"]

NUMERIC_BOUNDS: dict[str, tuple[float, float, bool]] = {
    "Seniority": (0.0, 50.0, False),
    "Time": (0.0, 72.0, False),
    "Age": (18.0, 100.0, False),
    "Expenses": (0.0, 100_000.0, True),
    "Income": (0.0, 100_000.0, True),
    "Assets": (0.0, 100_000.0, True),
    "Debt": (0.0, 100_000.0, True),
    "Amount": (0.0, 100_000.0, True),
    "Price": (0.0, 100_000.0, True),
}
"""Fixed public (low, high, log scale) per numeric column."""

BINARY: tuple[str, ...] = ("Records",)
"""yes/no columns."""

CATEGORICAL: dict[str, tuple[str, ...]] = {
    "Home": ("ignore", "other", "owner", "parents", "priv", "rent"),
    "Marital": ("divorced", "married", "separated", "single", "widow"),
    "Job": ("fixed", "freelance", "others", "partime"),
}
"""Levels from the data dictionary."""

_FILE = "credit_data.csv.gz"


def feature_names() -> list[str]:
    """Intercept, numeric columns, 0/1 columns, then one-hot levels, in the order of the features."""
    return tabular_feature_names(NUMERIC_BOUNDS, BINARY, CATEGORICAL)


def _encode(rows: list[dict[str, str]]) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    features = encode_tabular(rows, NUMERIC_BOUNDS, BINARY, CATEGORICAL, yes="yes")
    return features, np.array([1.0 if row["Status"] == "bad" else 0.0 for row in rows])


def load_credit(split: Literal["train", "test"]) -> TabularData:
    """The bundled credit data, encoded (||x|| <= 1), split 70/30 by a fixed public permutation."""
    return load_split(_FILE, _encode, feature_names(), split)
