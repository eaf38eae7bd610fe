"""The alternative algorithms over real HTTP (PostgreSQL + Redis + a real Celery worker): each fits BLR on
one private dataset's budget, is charged on its ledger iteration by iteration, and its posterior predicts
through the same `vips evaluate` path as VIPS's."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from privacy_wall.accounting import SubsampledGaussianEvent, rdp_curve
from service.client import VipsClient
from tests.e2e import production_service, synthetic_csv

DELTA = 1e-5
N = 2000


def test_algorithms_share_one_budget_over_http(tmp_path: Path) -> None:
    train, test = tmp_path / "train.csv", tmp_path / "test.csv"
    weights = synthetic_csv(train, n=N, seed=1)
    synthetic_csv(test, seed=2)
    with production_service(tmp_path) as service:
        service.vips(
            "data", "ingest", "synth", "--kind", "tabular", "--input", str(train), "--label", "label"
        )
        custodian, analyst = service.key("custodian", "synth"), service.key("analyst")
        service.vips("budget", "set", "synth", "--epsilon", "5", "--delta", str(DELTA), key=custodian)
        jobs: list[dict[str, Any]] = []
        for algorithm, iterations, batch, extra in (
            ("vips", 5, N, []),
            ("dpvi", 200, 200, ["--option", "learning_rate=0.5"]),
        ):
            posterior = tmp_path / f"{algorithm}.json"
            done = service.vips(
                "fit", "--dataset", "synth", "--model", "blr", "--algorithm", algorithm, "--iterations",
                str(iterations), "--batch-size", str(batch), "--epsilon", "2", *extra, "--wait", "-o",
                str(posterior), key=analyst,
            )  # fmt: skip
            job = json.loads(done.stdout.strip().splitlines()[-1])
            assert job["status"] == "succeeded" and job["algorithm"] == algorithm, job
            assert 0 < job["epsilon_spent"] <= 2.0
            # Every iteration was charged: the job's epsilon is exactly T releases of its event.
            event = SubsampledGaussianEvent(job["sigma"], batch, N)
            assert job["epsilon_spent"] == pytest.approx(rdp_curve(event).scaled(iterations).epsilon(DELTA))
            document = json.loads(posterior.read_text())
            assert document["algorithm"] == algorithm and document["model"] == "blr"
            mean = np.asarray(document["mean"])
            # Observed in-process at this schedule: cosine 0.99-0.999 for both algorithms.
            assert mean @ weights / np.linalg.norm(mean) / np.linalg.norm(weights) > 0.95
            metrics = json.loads(
                service.vips("evaluate", "--posterior", str(posterior), "--input", str(test)).stdout
            )
            assert metrics["auc"] > 0.75
            jobs.append(job)
        with VipsClient(service.url, custodian) as api:
            ledger = api.ledger("synth")
        # The two jobs' charges compose on the dataset's one ledger.
        assert len(ledger["entries"]) == 5 + 200
        curve = rdp_curve(SubsampledGaussianEvent(jobs[0]["sigma"], N, N)).scaled(5) + rdp_curve(
            SubsampledGaussianEvent(jobs[1]["sigma"], 200, N)
        ).scaled(200)
        assert ledger["budget"]["epsilon_spent"] == pytest.approx(curve.epsilon(DELTA), rel=1e-9)
        assert ledger["budget"]["epsilon_spent"] <= 5.0
