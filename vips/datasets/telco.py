"""IBM Telco customer churn (7,043 customers) with public, data-independent preprocessing.

A second tabular dataset for the BLR comparison, never used to choose a method or a default (issue 12):
label 1 means the customer left ("churn" = "Yes", 26.5%). Every constant below is a category list of the
published data dictionary or a fixed round bound chosen without looking at the rows:

- the 6 yes/no columns are 0/1 features; the 10 categorical columns are one-hot over their listed levels;
- tenure (months) over [0, 72], monthly charges (USD) over [0, 120], total charges (USD) on a log scale
  over [0, 10,000]; values outside are clipped; a missing total charge (new customers) counts as 0;
- a constant intercept 1 first; each row divided by the fixed maximum norm sqrt(1 + 3 + 6 + 10).

There is no official test split: `load_telco` splits by a fixed public permutation (seed 0), 70% / 30%.
Source and licence: vips/datasets/data/README.md.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from numpy.typing import NDArray

from vips.datasets.adult import TabularData
from vips.datasets.bundled import encode_tabular, load_split, tabular_feature_names

__all__ = ["BINARY", "CATEGORICAL", "NUMERIC_BOUNDS", "feature_names", "load_telco"]

BINARY: tuple[str, ...] = (
    "female",
    "senior_citizen",
    "partner",
    "dependents",
    "phone_service",
    "paperless_billing",
)
"""Columns already coded 0/1 in the file."""

_NO_INTERNET = ("No", "No internet service", "Yes")
CATEGORICAL: dict[str, tuple[str, ...]] = {
    "multiple_lines": ("No", "No phone service", "Yes"),
    "internet_service": ("DSL", "Fiber optic", "No"),
    "online_security": _NO_INTERNET,
    "online_backup": _NO_INTERNET,
    "device_protection": _NO_INTERNET,
    "tech_support": _NO_INTERNET,
    "streaming_tv": _NO_INTERNET,
    "streaming_movies": _NO_INTERNET,
    "contract": ("Month-to-month", "One year", "Two year"),
    "payment_method": (
        "Bank transfer (automatic)",
        "Credit card (automatic)",
        "Electronic check",
        "Mailed check",
    ),
}
"""Levels from the data dictionary."""

NUMERIC_BOUNDS: dict[str, tuple[float, float, bool]] = {
    "tenure": (0.0, 72.0, False),
    "monthly_charges": (0.0, 120.0, False),
    "total_charges": (0.0, 10_000.0, True),
}
"""Fixed public (low, high, log scale) per numeric column: six years of tenure, round price bounds."""

_FILE = "telco_churn.csv.gz"


def feature_names() -> list[str]:
    """Intercept, numeric columns, 0/1 columns, then one-hot levels, in the order of the features."""
    return tabular_feature_names(NUMERIC_BOUNDS, BINARY, CATEGORICAL)


def _encode(rows: list[dict[str, str]]) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    features = encode_tabular(rows, NUMERIC_BOUNDS, BINARY, CATEGORICAL, yes="1")
    return features, np.array([1.0 if row["churn"] == "Yes" else 0.0 for row in rows])


def load_telco(split: Literal["train", "test"]) -> TabularData:
    """The bundled Telco churn data, encoded (||x|| <= 1), split 70/30 by a fixed public permutation."""
    return load_split(_FILE, _encode, feature_names(), split)
