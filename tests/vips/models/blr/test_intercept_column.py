"""VIPS-BLR's intercept step finds the intercept by its public name wherever the column is: the registry
reads the features' names (`intercept_column`), and every way a fit is set up passes them: the worker's
jobs (the dataset's schema), `vips fit --local` (the CSV's header) and the estimators (a DataFrame's
columns). The step itself is tested in tests/vips/models/blr/test_intercept.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from fastapi.testclient import TestClient

import vips.fit_loop
import worker.jobs
from control.jobs.queue import RecordingQueue
from control.settings import ServiceSettings
from control.store.keys import create_key
from privacy_wall.data.ingest import ingest
from privacy_wall.sqlengine import create_db_engine
from service.app import create_app
from tests.dbservers import fresh_database
from tests.vips.models.blr.test_intercept import imbalanced_arrays
from vips.cli import main
from vips.estimators import VIPSLogisticRegression
from vips.models.blr.model import BayesianLogisticRegression
from vips.models.blr.setup import intercept_column
from vips.models.registry import ModelSetup, model_setup

INTERCEPT_LAST = ["x1", "x2", "intercept"]


def test_the_intercept_is_the_column_of_that_name_else_column_0() -> None:
    assert intercept_column(INTERCEPT_LAST) == 2
    assert intercept_column(np.array(["intercept", "x1"], dtype=object)) == 0
    assert intercept_column(["num__x1", "num__intercept"]) == 1  # a ColumnTransformer's names
    assert intercept_column(["x1", "x2"]) == 0 and intercept_column(None) == 0
    model = model_setup("blr", {}, sigma=1.0, columns=INTERCEPT_LAST).model
    assert isinstance(model, BayesianLogisticRegression) and model.intercept == 2
    assert model_setup("blr", {"noise_aware": 0}, sigma=1.0, columns=INTERCEPT_LAST).model.intercept == 2


def test_the_step_gives_the_same_posterior_wherever_the_intercept_column_is() -> None:
    """The same noisy release with the intercept column moved from first to last: told where it is, the
    M-step's posterior is the first one's, permuted; left at column 0 (what the registry did before it read
    the names), it is not."""
    x, y, _, _ = imbalanced_arrays()  # column 0 is the intercept
    rng = np.random.default_rng(0)
    n, d = x.shape
    noise_1, noise_2 = 1e-3, 1e-3
    s1 = x.T @ (y - 0.5) / n + rng.normal(0.0, noise_1, d)
    e = rng.normal(0.0, noise_2, (d, d))
    s2 = 0.25 * x.T @ x / n + (e + e.T) / np.sqrt(2)
    order = [*range(1, d), 0]  # the intercept last

    def posterior_mean(model: BayesianLogisticRegression, columns: list[int]) -> np.ndarray:
        statistics = {"s1": s1[columns], "s2": s2[np.ix_(columns, columns)]}
        state = model.m_step(model.initial_state(d), statistics, n, 1.0, {"s1": noise_1, "s2": noise_2})
        return np.asarray(state.mean)

    first = posterior_mean(BayesianLogisticRegression(intercept=0, laplace_from=0), list(range(d)))
    last = posterior_mean(BayesianLogisticRegression(intercept=d - 1, laplace_from=0), order)
    np.testing.assert_allclose(last, first[order], rtol=1e-9, atol=1e-12)
    unaware = posterior_mean(BayesianLogisticRegression(intercept=0, laplace_from=0), order)
    assert np.abs(unaware - first[order]).max() > 0.1


@pytest.fixture
def spy(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The `columns` each model_setup call of the fit loop and of the worker's jobs was given."""
    seen: list[Any] = []

    def recording(*args: Any, **kwargs: Any) -> ModelSetup:
        seen.append(kwargs.get("columns"))
        return model_setup(*args, **kwargs)

    monkeypatch.setattr(vips.fit_loop, "model_setup", recording)
    monkeypatch.setattr(worker.jobs, "model_setup", recording)
    return seen


def _csv(path: Path, rows: int = 200) -> Path:
    rng = np.random.default_rng(1)
    x = rng.uniform(0.0, 0.5, (rows, 2))
    y = (rng.random(rows) < 0.3).astype(int)
    table = pd.DataFrame({"x1": x[:, 0], "x2": x[:, 1], "intercept": 0.5, "label": y})
    table.to_csv(path, index=False)
    return path


def test_a_local_fit_passes_the_csv_header(
    spy: list[Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = _csv(tmp_path / "rows.csv")
    argv = ["fit", "--local", "--kind", "tabular", "--input", str(data), "--label", "label", "--model", "blr",
            "--epsilon", "1", "--delta", "1e-5"]  # fmt: skip
    assert main(argv) == 0, capsys.readouterr().err
    assert [list(columns) for columns in spy] == [INTERCEPT_LAST]


def test_an_estimator_passes_a_dataframes_columns(spy: list[Any]) -> None:
    rng = np.random.default_rng(2)
    x = pd.DataFrame({"x1": rng.uniform(0, 0.5, 300), "x2": rng.uniform(0, 0.5, 300), "intercept": 0.5})
    y = (rng.random(300) < 0.3).astype(int)
    VIPSLogisticRegression(epsilon=1.0, delta=1e-5).fit(x, y)
    VIPSLogisticRegression(epsilon=1.0, delta=1e-5).fit(x.to_numpy(), y)  # no names: column 0
    assert [None if columns is None else list(columns) for columns in spy] == [INTERCEPT_LAST, None]


def test_a_job_passes_the_datasets_feature_names(spy: list[Any], tmp_path: Path) -> None:
    with (
        fresh_database("sqlite", tmp_path, "control") as control_url,
        fresh_database("sqlite", tmp_path, "sensitive") as sensitive_url,
    ):
        control, sensitive = create_db_engine(control_url), create_db_engine(sensitive_url)
        try:
            custodian_id, custodian = create_key(control, "custodian", "rows")
            _, analyst = create_key(control, "analyst", all_datasets=True)
            ingest(control=control, sensitive=sensitive, name="rows", kind="tabular",
                   path=_csv(tmp_path / "rows.csv"), label="label", owner=custodian_id)  # fmt: skip
            settings = ServiceSettings(home=tmp_path, control_database_url=control_url)
            with TestClient(create_app(settings, queue=RecordingQueue())) as http:
                budget = {"epsilon": 5.0, "delta": 1e-5}
                put = http.put("/v1/datasets/rows/budget", json=budget,
                               headers={"Authorization": f"Bearer {custodian}"})  # fmt: skip
                assert put.status_code == 200, put.text
                spec = {"dataset": "rows", "model": "blr", "epsilon": 1.0}
                r = http.post("/v1/jobs", json=spec, headers={"Authorization": f"Bearer {analyst}"})
                assert r.status_code == 202, r.text
                assert worker.jobs.execute_job(r.json()["id"], control, sensitive) == "succeeded"
            assert [list(columns) for columns in spy] == [INTERCEPT_LAST]
        finally:
            control.dispose()
            sensitive.dispose()
