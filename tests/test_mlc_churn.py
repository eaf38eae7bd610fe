"""The bundled MLC churn dataset (vips.datasets.mlc_churn): shapes, the fixed public split, row norms,
labels and one encoded row checked by hand against the file."""

from __future__ import annotations

import math

import numpy as np
import pytest

from vips.datasets.mlc_churn import BINARY, CATEGORICAL, NUMERIC_BOUNDS, feature_names, load_mlc_churn


def test_split_sizes_norms_and_labels() -> None:
    train, test = load_mlc_churn("train"), load_mlc_churn("test")
    d = 1 + len(NUMERIC_BOUNDS) + len(BINARY) + sum(map(len, CATEGORICAL.values()))
    assert train.features.shape == (3500, d) and test.features.shape == (1500, d)
    assert len(feature_names()) == d == 17
    for part in (train, test):
        assert np.linalg.norm(part.features, axis=1).max() <= 1.0
        assert set(np.unique(part.labels)) == {0.0, 1.0}
        onehots = part.features[:, 1 + len(NUMERIC_BOUNDS) + len(BINARY) :]
        assert np.allclose(onehots.sum(axis=1), 1.0 / math.sqrt(15) / (1 + 1e-12))
    # 707 of the 5,000 customers churned (14.1%)
    assert int(train.labels.sum() + test.labels.sum()) == 707


def test_the_split_is_fixed() -> None:
    first, second = load_mlc_churn("test"), load_mlc_churn("test")
    np.testing.assert_array_equal(first.features, second.features)
    np.testing.assert_array_equal(first.labels, second.labels)
    with pytest.raises(ValueError):
        load_mlc_churn("validation")  # type: ignore[arg-type]


def test_a_row_encodes_its_public_bounds() -> None:
    """The first customer in the file (KS, 128 days, area code 415, voice mail, 25 messages, ...)."""
    names = feature_names()
    expected = np.zeros(len(names))
    values = {
        "intercept": 1.0,
        "account_length": 128 / 250,
        "number_vmail_messages": 25 / 60,
        "total_day_minutes": 265.1 / 400,
        "total_day_calls": 110 / 200,
        "total_eve_minutes": 197.4 / 400,
        "total_eve_calls": 99 / 200,
        "total_night_minutes": 244.7 / 400,
        "total_night_calls": 91 / 200,
        "total_intl_minutes": 10.0 / 25,
        "total_intl_calls": 3 / 25,
        "number_customer_service_calls": 1 / 10,
        "voice_mail_plan": 1.0,
        "area_code=area_code_415": 1.0,
    }
    for name, value in values.items():
        expected[names.index(name)] = value
    expected /= math.sqrt(15) * (1 + 1e-12)
    train, test = load_mlc_churn("train"), load_mlc_churn("test")
    rows = np.vstack([train.features, test.features])
    labels = np.concatenate([train.labels, test.labels])
    found = np.flatnonzero(np.abs(rows - expected).max(axis=1) < 1e-12)
    assert found.shape == (1,) and labels[found[0]] == 0.0
