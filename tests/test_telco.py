"""The bundled Telco churn dataset (vips.datasets.telco): shapes, the fixed public split, row norms, labels
and one encoded row checked by hand against the file."""

from __future__ import annotations

import math

import numpy as np

from vips.datasets.telco import BINARY, CATEGORICAL, NUMERIC_BOUNDS, feature_names, load_telco


def test_split_sizes_norms_and_labels() -> None:
    train, test = load_telco("train"), load_telco("test")
    assert train.features.shape == (4930, 41) and test.features.shape == (2113, 41)
    assert len(feature_names()) == 1 + len(NUMERIC_BOUNDS) + len(BINARY) + sum(map(len, CATEGORICAL.values()))
    for part in (train, test):
        assert np.linalg.norm(part.features, axis=1).max() <= 1.0
        assert set(np.unique(part.labels)) == {0.0, 1.0}
        # every one-hot group has exactly one level set (the data dictionary lists every level)
        scaled_one = 1.0 / math.sqrt(20) / (1 + 1e-12)
        onehots = part.features[:, 1 + len(NUMERIC_BOUNDS) + len(BINARY) :]
        assert np.allclose(onehots.sum(axis=1), len(CATEGORICAL) * scaled_one)
    # 1,869 of the 7,043 customers churned (26.5%)
    assert int(train.labels.sum() + test.labels.sum()) == 1869


def test_the_split_is_fixed() -> None:
    first, second = load_telco("train"), load_telco("train")
    np.testing.assert_array_equal(first.features, second.features)
    np.testing.assert_array_equal(first.labels, second.labels)


def test_a_row_encodes_its_public_bounds() -> None:
    """The first customer in the file (female, tenure 1, DSL, month-to-month, electronic check, 29.85 USD
    monthly and in total, no churn) is somewhere in one split: find it by its encoding."""
    divisor = math.sqrt(20) * (1 + 1e-12)
    names = feature_names()
    expected = np.zeros(len(names))
    expected[names.index("intercept")] = 1.0
    expected[names.index("tenure")] = 1 / 72
    expected[names.index("monthly_charges")] = 29.85 / 120
    expected[names.index("total_charges")] = math.log1p(29.85) / math.log1p(10_000)
    for name in ("female", "partner", "paperless_billing"):
        expected[names.index(name)] = 1.0
    for name in (
        "multiple_lines=No phone service",
        "internet_service=DSL",
        "online_security=No",
        "online_backup=Yes",
        "device_protection=No",
        "tech_support=No",
        "streaming_tv=No",
        "streaming_movies=No",
        "contract=Month-to-month",
        "payment_method=Electronic check",
    ):
        expected[names.index(name)] = 1.0
    expected /= divisor
    found = [
        label
        for part in (load_telco("train"), load_telco("test"))
        for row, label in zip(part.features, part.labels, strict=True)
        if np.allclose(row, expected, atol=1e-12)
    ]
    assert found == [0.0]
