"""A job submitted over HTTP is what the worker runs: submit through the API, run the queued job id with
the worker's job runner (in process, no broker), then read progress, releases and the posterior over HTTP.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from control.jobs.queue import RecordingQueue
from control.settings import ServiceSettings
from control.store.keys import create_key
from control.store.models import posteriors, releases
from privacy_wall.accounting.calibration import epsilon
from privacy_wall.data.ingest import ingest
from privacy_wall.ledger import database as ledger_db
from privacy_wall.sqlengine import create_db_engine
from service.app import create_app
from tests.dbservers import fresh_database
from tests.privacy_wall.data.test_ingest_store import tabular_data, write_tabular
from worker.jobs import execute_job

DELTA = 1e-5


def test_an_api_job_runs_in_the_worker_and_its_results_are_served(tmp_path: Path) -> None:
    with (
        fresh_database("sqlite", tmp_path, "control") as control_url,
        fresh_database("sqlite", tmp_path, "sensitive") as sensitive_url,
    ):
        control, sensitive = create_db_engine(control_url), create_db_engine(sensitive_url)
        try:
            custodian_id, custodian = create_key(control, "custodian", "t")
            _, analyst = create_key(control, "analyst", all_datasets=True)
            _, client_key = create_key(control, "client", "t")
            x, y = tabular_data(n=300, d=3, seed=5)
            ingest(
                control=control,
                sensitive=sensitive,
                name="t",
                kind="tabular",
                path=write_tabular(tmp_path / "t.csv", x, y),
                label="label",
                owner=custodian_id,
            )
            queue = RecordingQueue()
            settings = ServiceSettings(home=tmp_path, control_database_url=control_url)
            with TestClient(create_app(settings, queue=queue)) as http:
                as_custodian = {"Authorization": f"Bearer {custodian}"}
                as_analyst = {"Authorization": f"Bearer {analyst}"}
                budget = {"epsilon": 10.0, "delta": DELTA}
                assert http.put("/v1/datasets/t/budget", json=budget, headers=as_custodian).status_code == 200
                spec = {
                    "dataset": "t",
                    "model": "blr",
                    "iterations": 4,
                    "batch_size": 60,
                    "sigma": 3.0,
                    "options": {"a0": 1.0, "b0": 1.0, "tau0": 1.0, "kappa": 0.6},
                }
                r = http.post("/v1/jobs", json=spec, headers=as_analyst)
                assert r.status_code == 202, r.text
                job_id = r.json()["id"]
                assert queue.sent == [job_id]
                estimated = r.json()["stored_bytes"]  # counted against the key's storage cap while it runs

                assert execute_job(job_id, control, sensitive) == "succeeded"

                job = http.get(f"/v1/jobs/{job_id}", headers=as_analyst).json()
                assert (job["status"], job["iteration"]) == ("succeeded", 4)
                assert job["epsilon_spent"] == pytest.approx(epsilon(3.0, 60, 300, 4, DELTA))
                assert job["epsilon_spent"] == pytest.approx(job["epsilon_job"])
                assert job["started_at"] is not None and job["finished_at"] is not None
                released = http.get(f"/v1/jobs/{job_id}/releases", headers=as_analyst).json()
                assert [r["iteration"] for r in released] == [1, 2, 3, 4]
                posterior = http.get(
                    f"/v1/jobs/{job_id}/posterior", headers={"Authorization": f"Bearer {client_key}"}
                ).json()
                assert (posterior["job_id"], posterior["model"], posterior["dataset"]) == (job_id, "blr", "t")
                assert posterior["privacy"]["epsilon"] == pytest.approx(job["epsilon_spent"])
                # the dataset's public column names, by which `vips predict` matches an input's columns
                assert (posterior["columns"], posterior["label"]) == (["x0", "x1", "x2"], "label")
                # Ended, it counts what it stored: its releases and its posterior's text, within the estimate.
                with control.connect() as conn:
                    released_bytes = conn.execute(select(func.sum(releases.c.stored_bytes))).scalar_one()
                    text_bytes = conn.execute(select(posteriors.c.stored_bytes)).scalar_one()
                assert job["stored_bytes"] == released_bytes + text_bytes <= estimated
                ledger = http.get("/v1/datasets/t/ledger", headers=as_custodian).json()
                assert len(ledger["entries"]) == 4
                status = ledger_db.budget_status(control, "t")
                assert status.epsilon_reserved == pytest.approx(status.epsilon_spent)
        finally:
            control.dispose()
            sensitive.dispose()
