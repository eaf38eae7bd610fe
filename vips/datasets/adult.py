"""UCI Adult (Census Income) with public, data-independent preprocessing.

Every constant below comes from the public description (adult.names) or is a fixed public bound chosen
without looking at the rows, so the preprocessing itself spends no privacy budget:

- categorical columns are one-hot encoded over the category lists of adult.names plus a "missing"
  category for '?' (rows with missing values are kept, N = 32,561 train / 16,281 test);
- numeric columns are mapped to [0, 1] by fixed bounds (log scale for fnlwgt and the capital columns),
  values outside the bounds are clipped;
- a constant intercept feature 1 is prepended;
- every row is divided by the fixed maximum possible norm sqrt(1 + #numeric + #categorical), so that
  ||x|| <= 1 without any row-dependent statistic.

Label 1 means income '>50K'. Source and licence: vips/datasets/data/README.md.
"""

from __future__ import annotations

import csv
import gzip
import math
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Literal

import numpy as np
from numpy.typing import NDArray

__all__ = [
    "CATEGORICAL",
    "COLUMNS",
    "MAX_SQUARED_NORM",
    "MISSING",
    "NUMERIC_BOUNDS",
    "TabularData",
    "encode_rows",
    "feature_names",
    "load_adult",
    "write_tabular_csv",
]

COLUMNS: tuple[str, ...] = (
    "age",
    "workclass",
    "fnlwgt",
    "education",
    "education-num",
    "marital-status",
    "occupation",
    "relationship",
    "race",
    "sex",
    "capital-gain",
    "capital-loss",
    "hours-per-week",
    "native-country",
)
"""Attribute order of adult.data / adult.test (the label follows)."""

MISSING = "missing"
"""Name of the extra category that stands for '?' in every categorical column."""

CATEGORICAL: dict[str, tuple[str, ...]] = {
    "workclass": (
        "Private",
        "Self-emp-not-inc",
        "Self-emp-inc",
        "Federal-gov",
        "Local-gov",
        "State-gov",
        "Without-pay",
        "Never-worked",
    ),
    "education": (
        "Bachelors",
        "Some-college",
        "11th",
        "HS-grad",
        "Prof-school",
        "Assoc-acdm",
        "Assoc-voc",
        "9th",
        "7th-8th",
        "12th",
        "Masters",
        "1st-4th",
        "10th",
        "Doctorate",
        "5th-6th",
        "Preschool",
    ),
    "marital-status": (
        "Married-civ-spouse",
        "Divorced",
        "Never-married",
        "Separated",
        "Widowed",
        "Married-spouse-absent",
        "Married-AF-spouse",
    ),
    "occupation": (
        "Tech-support",
        "Craft-repair",
        "Other-service",
        "Sales",
        "Exec-managerial",
        "Prof-specialty",
        "Handlers-cleaners",
        "Machine-op-inspct",
        "Adm-clerical",
        "Farming-fishing",
        "Transport-moving",
        "Priv-house-serv",
        "Protective-serv",
        "Armed-Forces",
    ),
    "relationship": ("Wife", "Own-child", "Husband", "Not-in-family", "Other-relative", "Unmarried"),
    "race": ("White", "Asian-Pac-Islander", "Amer-Indian-Eskimo", "Other", "Black"),
    "sex": ("Female", "Male"),
    "native-country": (
        "United-States",
        "Cambodia",
        "England",
        "Puerto-Rico",
        "Canada",
        "Germany",
        "Outlying-US(Guam-USVI-etc)",
        "India",
        "Japan",
        "Greece",
        "South",
        "China",
        "Cuba",
        "Iran",
        "Honduras",
        "Philippines",
        "Italy",
        "Poland",
        "Jamaica",
        "Vietnam",
        "Mexico",
        "Portugal",
        "Ireland",
        "France",
        "Dominican-Republic",
        "Laos",
        "Ecuador",
        "Taiwan",
        "Haiti",
        "Columbia",
        "Hungary",
        "Guatemala",
        "Nicaragua",
        "Scotland",
        "Thailand",
        "Yugoslavia",
        "El-Salvador",
        "Trinadad&Tobago",
        "Peru",
        "Hong",
        "Holand-Netherlands",
    ),
}
"""Category lists copied from adult.names (public); each column also gets the MISSING category."""

NUMERIC_BOUNDS: dict[str, tuple[float, float, bool]] = {
    "age": (17.0, 90.0, False),
    "fnlwgt": (1e4, 10**6.5, True),
    "education-num": (1.0, 16.0, False),
    "capital-gain": (0.0, 99_999.0, True),
    "capital-loss": (0.0, 10_000.0, True),
    "hours-per-week": (1.0, 99.0, False),
}
"""Fixed public (low, high, log scale) per numeric column; log scale maps v to log1p(v) first.

Age 17-90 and hours 1-99 are the census top/bottom codes, education-num counts the 16 education levels,
capital-gain is top-coded at 99,999; the capital-loss and fnlwgt bounds are round public guesses.
"""

MAX_SQUARED_NORM = 1 + len(NUMERIC_BOUNDS) + len(CATEGORICAL)
"""Largest squared norm before scaling: intercept 1, each numeric <= 1, one 1 per categorical column."""

# A hair above sqrt(MAX_SQUARED_NORM) so that rounding can never push a norm above 1.
_NORM_DIVISOR = math.sqrt(MAX_SQUARED_NORM) * (1.0 + 1e-12)

_LABELS = {"<=50K": 0.0, ">50K": 1.0}

_FILES: dict[str, str] = {"train": "adult.data.gz", "test": "adult.test.gz"}


@dataclass(frozen=True)
class TabularData:
    """A design matrix (rows of norm <= 1), labels in {0, 1} and the column names of the features."""

    features: NDArray[np.float64]
    labels: NDArray[np.float64]
    feature_names: list[str]

    def __post_init__(self) -> None:
        if self.features.ndim != 2 or self.labels.shape != (self.features.shape[0],):
            raise ValueError("features must be (N, d) and labels (N,)")
        if len(self.feature_names) != self.features.shape[1]:
            raise ValueError("one feature name per column is required")


def feature_names() -> list[str]:
    """Names of the encoded columns, in order: intercept, numeric columns, then one-hot categories."""
    names = ["intercept", *NUMERIC_BOUNDS]
    for column, categories in CATEGORICAL.items():
        names.extend(f"{column}={category}" for category in (*categories, MISSING))
    return names


def _scale_numeric(values: NDArray[np.float64], low: float, high: float, log: bool) -> NDArray[np.float64]:
    if log:
        values, low, high = np.log1p(values), math.log1p(low), math.log1p(high)
    return np.clip((values - low) / (high - low), 0.0, 1.0)


def encode_rows(rows: Sequence[Sequence[str]]) -> NDArray[np.float64]:
    """Encode raw Adult attribute rows (14 strings each, label excluded) to the scaled feature matrix.

    Raises ValueError on a category that adult.names does not list (values are not echoed).
    """
    n = len(rows)
    if any(len(row) != len(COLUMNS) for row in rows):
        raise ValueError(f"every row needs exactly {len(COLUMNS)} attributes")
    index = {column: i for i, column in enumerate(COLUMNS)}
    blocks: list[NDArray[np.float64]] = [np.ones((n, 1))]
    for column, (low, high, log) in NUMERIC_BOUNDS.items():
        raw = np.array([float(row[index[column]]) for row in rows], dtype=np.float64)
        if not np.all(np.isfinite(raw)):
            raise ValueError(f"non-finite value in numeric column {column!r}")
        blocks.append(_scale_numeric(raw, low, high, log)[:, None])
    for column, categories in CATEGORICAL.items():
        lookup = {category: j for j, category in enumerate(categories)}
        lookup["?"] = len(categories)
        codes = np.empty(n, dtype=np.intp)
        for i, row in enumerate(rows):
            code = lookup.get(row[index[column]])
            if code is None:
                raise ValueError(f"unknown category in column {column!r} (row {i})")
            codes[i] = code
        onehot = np.zeros((n, len(categories) + 1))
        onehot[np.arange(n), codes] = 1.0
        blocks.append(onehot)
    features = np.hstack(blocks) / _NORM_DIVISOR
    if n:
        max_norm = float(np.max(np.linalg.norm(features, axis=1)))
        assert max_norm <= 1.0, f"row norm {max_norm} exceeds 1"
    return features


def _read_split(split: Literal["train", "test"]) -> list[list[str]]:
    resource = resources.files("vips.datasets").joinpath("data").joinpath(_FILES[split])
    with resource.open("rb") as raw, gzip.open(raw, "rt", encoding="ascii", newline="") as text:
        reader = csv.reader(text, skipinitialspace=True)
        return [row for row in reader if row and not row[0].startswith("|")]


def load_adult(split: Literal["train", "test"]) -> TabularData:
    """Load the bundled Adult train (32,561 rows) or official test split (16,281 rows), encoded.

    Parameters
    ----------
    split
        "train" (adult.data) or "test" (adult.test).

    Returns
    -------
    TabularData
        Features with ||x|| <= 1 (intercept included), labels 1 for '>50K' and 0 for '<=50K'.
    """
    if split not in _FILES:
        raise ValueError("split must be 'train' or 'test'")
    rows = _read_split(split)
    try:
        labels = np.array([_LABELS[row[-1].rstrip(".")] for row in rows], dtype=np.float64)
    except KeyError as error:
        raise ValueError("unknown label in Adult data") from error
    features = encode_rows([row[:-1] for row in rows])
    return TabularData(features, labels, feature_names())


def write_tabular_csv(data: TabularData, path: str | Path, label: str = "label") -> None:
    """Write features and labels as CSV: a header of feature names plus `label`, labels as 0/1.

    Suitable for ``vips fit --local --kind tabular --input FILE --label label``.
    """
    if label in data.feature_names:
        raise ValueError(f"label column name {label!r} collides with a feature name")
    matrix = np.column_stack([data.features, data.labels])
    formats = ["%.17g"] * data.features.shape[1] + ["%d"]
    with Path(path).open("w", encoding="utf-8", newline="") as handle:
        csv.writer(handle, lineterminator="\n").writerow([*data.feature_names, label])
        np.savetxt(handle, matrix, fmt=formats, delimiter=",")
