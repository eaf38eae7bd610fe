"""The bundled credit scoring dataset (vips.datasets.credit): shapes, the fixed public split, row norms,
labels and one encoded row checked by hand against the file; the shared loader (vips.datasets.bundled)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from vips.datasets.bundled import read_csv_gz
from vips.datasets.credit import BINARY, CATEGORICAL, NUMERIC_BOUNDS, feature_names, load_credit

DIVISOR = math.sqrt(14) * (1 + 1e-12)


def test_split_sizes_norms_and_labels() -> None:
    train, test = load_credit("train"), load_credit("test")
    d = 1 + len(NUMERIC_BOUNDS) + len(BINARY) + sum(map(len, CATEGORICAL.values()))
    assert train.features.shape == (3118, d) and test.features.shape == (1336, d)
    assert len(feature_names()) == d == 26
    for part in (train, test):
        assert np.linalg.norm(part.features, axis=1).max() <= 1.0
        assert part.features.min() >= 0.0
        assert set(np.unique(part.labels)) == {0.0, 1.0}
    rows = read_csv_gz("credit_data.csv.gz")
    assert len(rows) == 4454
    assert int(train.labels.sum() + test.labels.sum()) == sum(row["Status"] == "bad" for row in rows)


def test_the_split_is_fixed() -> None:
    first, second = load_credit("test"), load_credit("test")
    np.testing.assert_array_equal(first.features, second.features)
    np.testing.assert_array_equal(first.labels, second.labels)
    with pytest.raises(ValueError):
        load_credit("validation")  # type: ignore[arg-type]


def test_a_row_encodes_its_public_bounds() -> None:
    """The first applicant in the file: good, 9 years' seniority, renting, 60 months, 30 years old,
    married, no records, freelance, expenses 73, income 129, no assets or debt, amount 800, price 846."""
    names = feature_names()
    expected = np.zeros(len(names))
    log = math.log1p(100_000)
    values = {
        "intercept": 1.0,
        "Seniority": 9 / 50,
        "Time": 60 / 72,
        "Age": (30 - 18) / 82,
        "Expenses": math.log1p(73) / log,
        "Income": math.log1p(129) / log,
        "Amount": math.log1p(800) / log,
        "Price": math.log1p(846) / log,
        "Home=rent": 1.0,
        "Marital=married": 1.0,
        "Job=freelance": 1.0,
    }
    for name, value in values.items():
        expected[names.index(name)] = value
    expected /= DIVISOR
    train, test = load_credit("train"), load_credit("test")
    rows = np.vstack([train.features, test.features])
    labels = np.concatenate([train.labels, test.labels])
    found = np.flatnonzero(np.abs(rows - expected).max(axis=1) < 1e-12)
    assert found.shape == (1,) and labels[found[0]] == 0.0


def test_missing_values_count_as_zero() -> None:
    """Missing amounts are 0 and a missing level is all zeros in its one-hot block (the file has both)."""
    rows = read_csv_gz("credit_data.csv.gz")
    assert any(row["Income"] == "" for row in rows) and any(row["Home"] == "" for row in rows)
    train, test = load_credit("train"), load_credit("test")
    features = np.vstack([train.features, test.features])
    home = [names for names in feature_names() if names.startswith("Home=")]
    block = features[:, [feature_names().index(n) for n in home]]
    assert int(np.sum(block.sum(axis=1) == 0.0)) == sum(row["Home"] == "" for row in rows)
