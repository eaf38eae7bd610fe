"""data_norm (issue 24.7): a public bound on the rows' norm; rows / data_norm, the rest clipped to norm 1
with a warning counting them; predictions and posteriors in the input's units."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from privacy_wall.data.store import BoundViolation
from vips.estimators import VipsEstimator, VIPSLinearRegression, VIPSLogisticRegression
from vips.preprocessing import DataNormWarning, within_data_norm


@pytest.fixture(scope="module")
def data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    x = rng.normal(loc=3.0, scale=2.0, size=(300, 4))
    y = (x @ np.array([1.0, -1.0, 0.5, 0.0]) > 1.5).astype(int)
    return x, y


def test_rows_are_scaled_then_clipped_with_a_count() -> None:
    rows = np.array([[3.0, 4.0], [6.0, 8.0], [0.0, 1.0]])
    with pytest.warns(DataNormWarning, match="1 of 3 rows had an L2 norm above data_norm=5"):
        scaled = within_data_norm(rows, 5.0)
    assert np.allclose(scaled[0], [0.6, 0.8]) and np.allclose(scaled[2], [0.0, 0.2])
    assert np.linalg.norm(scaled[1]) <= 1.0 and np.allclose(scaled[1], [0.6, 0.8])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        within_data_norm(rows, 10.0)  # nothing clipped: no warning
    for bad in (0.0, -1.0, float("inf"), True):
        with pytest.raises(ValueError, match="data_norm"):
            within_data_norm(rows, bad)


def test_a_standard_scaler_pipeline_fits_with_data_norm(data: tuple[np.ndarray, np.ndarray]) -> None:
    x, y = data
    with pytest.raises(BoundViolation):
        make_pipeline(StandardScaler(), VIPSLogisticRegression(epsilon=1.0, iterations=3)).fit(x, y)
    pipeline = make_pipeline(
        StandardScaler(), VIPSLogisticRegression(epsilon=1.0, iterations=3, data_norm=3.0)
    )
    with pytest.warns(DataNormWarning, match=r"\d+ of 300 rows"):
        pipeline.fit(x, y)
    assert pipeline.predict(x).shape == (300,)
    assert pipeline[-1].posterior_["data_norm"] == 3.0


def test_predictions_are_in_the_inputs_units(data: tuple[np.ndarray, np.ndarray]) -> None:
    x, y = data
    rows = StandardScaler().fit_transform(x)
    norm = float(np.linalg.norm(rows, axis=1).max()) + 1.0  # (a test's shortcut: a real bound is public)
    bounded = VIPSLogisticRegression(sigma=0.0, random_state=0, iterations=3, data_norm=norm).fit(rows, y)
    plain = VIPSLogisticRegression(sigma=0.0, random_state=0, iterations=3).fit(rows / norm, y)
    assert np.allclose(bounded.predict_proba(rows), plain.predict_proba(rows / norm))
    assert np.allclose(bounded.coef_ * norm, plain.coef_)
    back = VipsEstimator.from_posterior(bounded.posterior_)
    assert back.data_norm == norm
    assert np.allclose(back.predict_proba(rows), bounded.predict_proba(rows))


def test_linear_regression_takes_data_norm_too() -> None:
    rng = np.random.default_rng(2)
    x = rng.normal(size=(200, 3)) * 4.0
    y = np.clip(x @ np.array([0.05, -0.05, 0.02]), -1.0, 1.0)
    with pytest.warns(DataNormWarning):
        model = VIPSLinearRegression(sigma=0.0, random_state=0, iterations=3, data_norm=8.0).fit(x, y)
    assert model.score(x, y) > 0.5
