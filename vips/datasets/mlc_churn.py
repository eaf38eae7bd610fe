"""MLC telecom churn (5,000 customers) with public, data-independent preprocessing.

The held-out tabular dataset of issue 35: no method, default or schedule was chosen on it (Adult, Telco
and the synthetic data are the tuning sets). Label 1 means the customer left ("churn" = "yes"). Every
constant below was fixed from the data dictionary (the column names and their units, the category levels)
before any fit on the rows:

- international_plan and voice_mail_plan (yes/no) are 0/1 features; area_code is one-hot over its three
  levels; state (51 levels) is left out (a one-hot block four times the size of the rest);
- the *_charge columns are left out: the data dictionary defines each as the tariff times the minutes of
  the same period, a duplicate of a kept column;
- the counts and minutes are scaled by fixed round bounds and clipped: account length [0, 250] days,
  voice-mail messages [0, 60], day/evening/night minutes [0, 400] and calls [0, 200], international
  minutes and calls [0, 25], customer service calls [0, 10];
- a constant intercept 1 first; each row divided by the fixed maximum norm sqrt(1 + 11 + 2 + 1).

There is no official test split: `load_mlc_churn` splits by a fixed public permutation (seed 0),
70% / 30%. Source and licence: vips/datasets/data/README.md.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from numpy.typing import NDArray

from vips.datasets.adult import TabularData
from vips.datasets.bundled import encode_tabular, load_split, tabular_feature_names

__all__ = ["BINARY", "CATEGORICAL", "NUMERIC_BOUNDS", "feature_names", "load_mlc_churn"]

NUMERIC_BOUNDS: dict[str, float] = {
    "account_length": 250.0,
    "number_vmail_messages": 60.0,
    "total_day_minutes": 400.0,
    "total_day_calls": 200.0,
    "total_eve_minutes": 400.0,
    "total_eve_calls": 200.0,
    "total_night_minutes": 400.0,
    "total_night_calls": 200.0,
    "total_intl_minutes": 25.0,
    "total_intl_calls": 25.0,
    "number_customer_service_calls": 10.0,
}
"""Fixed public upper bounds (the lower bound is 0) per numeric column."""

BINARY: tuple[str, ...] = ("international_plan", "voice_mail_plan")
"""yes/no columns."""

CATEGORICAL: dict[str, tuple[str, ...]] = {
    "area_code": ("area_code_408", "area_code_415", "area_code_510"),
}
"""Levels from the data dictionary."""

_FILE = "mlc_churn.csv.gz"


def feature_names() -> list[str]:
    """Intercept, numeric columns, 0/1 columns, then one-hot levels, in the order of the features."""
    return tabular_feature_names(NUMERIC_BOUNDS, BINARY, CATEGORICAL)


def _encode(rows: list[dict[str, str]]) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    features = encode_tabular(
        rows,
        {column: (0.0, high, False) for column, high in NUMERIC_BOUNDS.items()},
        BINARY,
        CATEGORICAL,
        yes="yes",
    )
    return features, np.array([1.0 if row["churn"] == "yes" else 0.0 for row in rows])


def load_mlc_churn(split: Literal["train", "test"]) -> TabularData:
    """The bundled MLC churn data, encoded (||x|| <= 1), split 70/30 by a fixed public permutation."""
    return load_split(_FILE, _encode, feature_names(), split)
