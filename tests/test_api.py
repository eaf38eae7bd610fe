"""The HTTP API in process (TestClient) over a migrated SQLite control database and a recording queue.

Datasets are inserted straight into the control tables (their rows never matter here: the API never
sees them). Role boundaries, admission and refunds, validation (422 naming the field), probes.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, insert, select, update

from control.jobs.queue import RecordingQueue
from control.settings import ServiceSettings
from control.store.keys import create_key, revoke_key
from control.store.models import api_keys, jobs, releases
from control.store.posteriors import posterior_text, store_posterior
from control.store.release_arrays import encode_arrays
from privacy_wall.accounting.accountants import privacy_cost
from privacy_wall.accounting.calibration import epsilon
from privacy_wall.accounting.events import SubsampledGaussianEvent
from privacy_wall.ledger import database as ledger_db
from privacy_wall.ledger.base import Charge
from privacy_wall.ledger.schema import budgets, datasets, reservations
from privacy_wall.sqlengine import create_db_engine
from service.app import create_app
from service.http.auth import UNKNOWN_KEY
from service.http.client import ApiError, VipsClient
from tests.dbservers import fresh_database, migrate

DELTA = 1e-5
PRIVATE_BUDGET = 3.0
# One (sigma, S, N) for most submissions: the accountant caches its curve.
SIGMA, BATCH, N = 2.0, 100, 1000
MAX_ITERATIONS = 500


@dataclass
class Api:
    client: TestClient
    engine: Engine
    queue: RecordingQueue
    keys: dict[str, str]  # name -> key
    ids: dict[str, str]  # name -> key id

    def call(self, method: str, path: str, who: str | None = None, **kwargs: Any) -> Any:
        headers = {"Authorization": f"Bearer {self.keys[who]}"} if who else {}
        return self.client.request(method, path, headers=headers, **kwargs)

    def submit(self, who: str = "analyst", **spec: Any) -> Any:
        body = {"dataset": "priv", "model": "blr", "iterations": 5, "batch_size": BATCH, "sigma": SIGMA}
        body.update(spec)
        return self.call("POST", "/v1/jobs", who, json={k: v for k, v in body.items() if v is not None})


def add_dataset(
    engine: Engine,
    name: str,
    *,
    population: int = N,
    public: bool = False,
    owner: str | None = None,
    kind: str = "tabular",
) -> None:
    with engine.begin() as conn:
        conn.execute(
            insert(datasets).values(
                name=name,
                kind=kind,
                population=population,
                dimension=3,
                schema={"features": ["a", "b", "c"], "label": "label"},
                public=public,
                owner=owner,
                created_at=datetime.now(UTC),
            )
        )


def populate(engine: Engine) -> tuple[dict[str, str], dict[str, str]]:
    """Keys of every role and the datasets: priv (cust's scope and owned by it), other (cust2 by its key's
    scope),
    pub (public, no budget yet), nobudget (private, no budget), docs (bag of words)."""
    specs: dict[str, tuple[str, str | None]] = {
        "admin": ("admin", None),
        "cust": ("custodian", "priv"),
        "cust2": ("custodian", "other"),
        "analyst": ("analyst", None),
        "analyst2": ("analyst", None),
        "client": ("client", None),
        "client_other": ("client", "other"),
    }
    keys: dict[str, str] = {}
    ids: dict[str, str] = {}
    for name, (role, scope) in specs.items():
        everything = scope is None and role in ("analyst", "client")
        ids[name], keys[name] = create_key(engine, role, scope, all_datasets=everything)
    add_dataset(engine, "priv", owner=ids["cust"])
    add_dataset(engine, "other")
    add_dataset(engine, "pub", population=200, public=True)
    add_dataset(engine, "nobudget", owner=ids["cust"])
    add_dataset(engine, "docs", kind="bow", owner=ids["cust"])
    ledger_db.set_budget(engine, "priv", PRIVATE_BUDGET, DELTA)
    ledger_db.set_budget(engine, "other", PRIVATE_BUDGET, DELTA)
    ledger_db.set_budget(engine, "docs", PRIVATE_BUDGET, DELTA)
    return keys, ids


def make_api(url: str, tmp_path: Path, **settings_given: Any) -> Iterator[Api]:
    migrate("control", url)
    engine = create_db_engine(url)
    keys, ids = populate(engine)
    queue = RecordingQueue()
    settings = ServiceSettings(
        home=tmp_path, control_database_url=url, max_iterations=MAX_ITERATIONS, **settings_given
    )
    try:
        with TestClient(create_app(settings, queue=queue)) as client:
            yield Api(client, engine, queue, keys, ids)
    finally:
        engine.dispose()


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    with fresh_database("sqlite", tmp_path, "control") as url:
        yield from make_api(url, tmp_path)


def reserved(engine: Engine, dataset: str = "priv") -> float:
    return ledger_db.budget_status(engine, dataset).epsilon_reserved


def open_reservations(engine: Engine) -> int:
    with engine.connect() as conn:
        return len(conn.execute(select(reservations.c.job_id).where(reservations.c.open.is_(True))).all())


def job_count(engine: Engine) -> int:
    with engine.connect() as conn:
        return len(conn.execute(select(jobs.c.id)).all())


def finish(engine: Engine, job_id: str, document: dict[str, Any] | None = None) -> None:
    """Do what the worker does at the end of a successful job."""
    with engine.begin() as conn:
        conn.execute(
            update(jobs)
            .where(jobs.c.id == job_id)
            .values(status="succeeded", started_at=datetime.now(UTC), finished_at=datetime.now(UTC))
        )
        if document is not None:
            store_posterior(conn, job_id, json.dumps(document).encode(), datetime.now(UTC))
    ledger_db.refund(engine, job_id)


def store_release(
    engine: Engine, job_id: str, iteration: int, statistics: dict[str, Any], noise_std: dict[str, float]
) -> None:
    """Do what the worker does with one release: its arrays stored as .npz."""
    blob = encode_arrays({name: np.asarray(value, dtype=np.float64) for name, value in statistics.items()})
    with engine.begin() as conn:
        conn.execute(
            insert(releases).values(
                job_id=job_id,
                iteration=iteration,
                arrays=blob,
                stored_bytes=len(blob),
                noise_std=noise_std,
                created_at=datetime.now(UTC),
            )
        )


def charge(engine: Engine, job_id: str, iteration: int, sigma: float = SIGMA) -> None:
    event = SubsampledGaussianEvent(sigma, BATCH, N)
    ledger_db.commit_charge(engine, Charge("priv", job_id, iteration, event))


# ---- authentication and roles ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "authorization",
    [None, "Bearer vips_0123456789abcdef_wrong", "Bearer not-a-key", "Basic dXNlcjpwYXNz", "Bearer "],
)
def test_missing_or_invalid_key_is_401_with_bearer_challenge(api: Api, authorization: str | None) -> None:
    headers = {"Authorization": authorization} if authorization else {}
    for method, path in (("GET", "/v1/datasets"), ("POST", "/v1/jobs"), ("GET", "/v1/jobs/x")):
        r = api.client.request(method, path, headers=headers, json={})
        assert r.status_code == 401, (path, r.text)
        assert r.headers["www-authenticate"] == "Bearer"
        assert r.json()["detail"]


def test_a_tampered_or_revoked_key_is_401(api: Api) -> None:
    key = api.keys["analyst"]
    tampered = key[:-1] + ("A" if key[-1] != "A" else "B")
    r = api.client.get("/v1/jobs", headers={"Authorization": f"Bearer {tampered}"})
    assert r.status_code == 401
    assert revoke_key(api.engine, api.ids["analyst"])
    assert api.call("GET", "/v1/jobs", "analyst").status_code == 401


def test_a_key_unknown_here_is_told_so_and_nothing_more(tmp_path: Path, api: Api) -> None:
    """Issue 24.8: a key made against another store gets a 401 saying the key is unknown to this service,
    word for word the answer to a tampered one (nothing says whether it exists elsewhere). Issue 55: the
    holder of a revoked key (its whole secret) is told it was revoked; nobody without the secret is."""
    with fresh_database("sqlite", tmp_path) as url:
        migrate("control", url)
        other = create_db_engine(url)
        try:
            elsewhere = create_key(other, "analyst", all_datasets=True)[1]
        finally:
            other.dispose()
    key = api.keys["cust"]
    tampered = key[:-1] + ("A" if key[-1] != "A" else "B")
    assert revoke_key(api.engine, api.ids["analyst"])
    details = []
    revoked = api.keys["analyst"]
    tampered_revoked = revoked[:-1] + ("A" if revoked[-1] != "A" else "B")
    for presented in (elsewhere, tampered, tampered_revoked, revoked):
        r = api.client.get("/v1/jobs", headers={"Authorization": f"Bearer {presented}"})
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        details.append(r.json()["detail"])
    assert details[:3] == [UNKNOWN_KEY] * 3 and "unknown to this service" in UNKNOWN_KEY
    assert details[3].startswith("this API key was revoked: ask an admin of this service for a new one")


@pytest.mark.parametrize(
    ("who", "method", "path", "body"),
    [
        ("client", "POST", "/v1/jobs", {"dataset": "priv", "model": "blr", "iterations": 1, "sigma": 1}),
        ("cust", "POST", "/v1/jobs", {"dataset": "priv", "model": "blr", "iterations": 1, "sigma": 1}),
        ("admin", "POST", "/v1/jobs", {"dataset": "priv", "model": "blr", "iterations": 1, "sigma": 1}),
        ("analyst", "PUT", "/v1/datasets/priv/budget", {"epsilon": 9.0, "delta": DELTA}),
        ("client", "PUT", "/v1/datasets/priv/budget", {"epsilon": 9.0, "delta": DELTA}),
        ("analyst", "GET", "/v1/datasets/priv/ledger", None),
        ("analyst", "POST", "/v1/keys", {"role": "admin"}),
        ("cust", "POST", "/v1/keys", {"role": "admin"}),
        ("client", "POST", "/v1/keys", {"role": "admin"}),
        ("analyst", "GET", "/v1/datasets/priv/ledger/jobs", None),
        ("client", "GET", "/v1/datasets/priv/ledger/jobs", None),
        ("analyst", "GET", "/v1/keys", None),
        ("cust", "GET", "/v1/keys", None),
        ("client", "DELETE", "/v1/keys/abc", None),
        ("cust", "DELETE", "/v1/keys/abc", None),
        ("client", "POST", "/v1/jobs/abc/cancel", None),
        ("client", "GET", "/v1/jobs/abc/releases", None),
    ],
)
def test_wrong_role_is_403(api: Api, who: str, method: str, path: str, body: Any) -> None:
    r = api.call(method, path, who, json=body)
    assert r.status_code == 403, r.text
    assert "role" in r.json()["detail"]
    assert job_count(api.engine) == 0
    assert ledger_db.budget_status(api.engine, "priv").epsilon_budget == PRIVATE_BUDGET


def test_custodians_see_and_administer_only_their_datasets(api: Api) -> None:
    budget = {"epsilon": 5.0, "delta": DELTA}
    # cust2's key is scoped to "other": it owns it without being its datasets.owner
    assert api.call("PUT", "/v1/datasets/other/budget", "cust2", json=budget).status_code == 200
    assert api.call("GET", "/v1/datasets/other/ledger", "cust2").status_code == 200
    for method, path, body in (
        ("PUT", "/v1/datasets/priv/budget", budget),
        ("GET", "/v1/datasets/priv/ledger", None),
        ("GET", "/v1/datasets/priv", None),
    ):
        foreign = api.call(method, path, "cust2", json=body)
        missing = api.call(method, path.replace("priv", "nosuch"), "cust2", json=body)
        assert foreign.status_code == missing.status_code == 404
        assert foreign.json()["detail"] == missing.json()["detail"].replace("nosuch", "priv")
    assert ledger_db.budget_status(api.engine, "priv").epsilon_budget == PRIVATE_BUDGET
    assert [d["name"] for d in api.call("GET", "/v1/datasets", "cust").json()] == ["docs", "nobudget", "priv"]
    assert [d["name"] for d in api.call("GET", "/v1/datasets", "cust2").json()] == ["other"]
    assert [d["name"] for d in api.call("GET", "/v1/datasets", "client_other").json()] == ["other"]
    assert len(api.call("GET", "/v1/datasets", "analyst").json()) == 5
    # the admin may administer every dataset
    assert api.call("PUT", "/v1/datasets/priv/budget", "admin", json=budget).json()["epsilon"] == 5.0


def test_analysts_cannot_reach_each_others_jobs(api: Api) -> None:
    job_id = api.submit("analyst").json()["id"]
    for method, path in (
        ("GET", f"/v1/jobs/{job_id}"),
        ("POST", f"/v1/jobs/{job_id}/cancel"),
        ("GET", f"/v1/jobs/{job_id}/releases"),
        ("GET", f"/v1/jobs/{job_id}/posterior"),
    ):
        r = api.call(method, path, "analyst2")
        assert r.status_code == 404, path
        assert r.json()["detail"] == f"job {job_id} not found"
        assert api.call(method, path.replace(job_id, "f" * 32), "analyst2").status_code == 404
    assert api.call("GET", "/v1/jobs", "analyst2").json() == []
    assert [j["id"] for j in api.call("GET", "/v1/jobs", "analyst").json()] == [job_id]
    assert [j["id"] for j in api.call("GET", "/v1/jobs", "admin").json()] == [job_id]
    assert api.call("GET", f"/v1/jobs/{job_id}", "analyst").json()["status"] == "queued"


# ---- submission and admission ----------------------------------------------------------------------------


def test_submit_reserves_queues_and_answers_202(api: Api) -> None:
    r = api.submit(options={"a0": 2.0, "kappa": 0.7})
    assert r.status_code == 202, r.text
    job = r.json()
    assert api.queue.sent == [job["id"]]
    expected = epsilon(SIGMA, BATCH, N, 5, DELTA)
    assert job["status"] == "queued"
    assert job["sigma"] == SIGMA
    assert job["epsilon_target"] is None
    assert job["epsilon_job"] == pytest.approx(expected)
    assert job["epsilon_spent"] == 0.0
    assert job["delta"] == DELTA
    assert (job["iteration"], job["iterations"], job["batch_size"]) == (0, 5, BATCH)
    assert job["options"] == {"a0": 2.0, "kappa": 0.7}
    assert reserved(api.engine) == pytest.approx(expected)
    shown = api.call("GET", "/v1/datasets/priv", "analyst").json()
    assert shown["budget"]["epsilon_reserved"] == pytest.approx(expected)
    assert shown["budget"]["epsilon_remaining"] == pytest.approx(PRIVATE_BUDGET - expected)
    assert shown["schema"] == {"features": ["a", "b", "c"], "label": "label"}
    with api.engine.connect() as conn:
        assert conn.execute(select(jobs.c.owner)).scalar_one() == api.ids["analyst"]


def test_batch_size_defaults_to_the_population(api: Api) -> None:
    r = api.submit(dataset="pub", batch_size=None, sigma=1.0, iterations=1)
    assert r.status_code == 202, r.text
    assert r.json()["batch_size"] == 200


def test_epsilon_target_is_calibrated_to_a_sigma_that_meets_it(api: Api) -> None:
    # batch mode (S = N) keeps the accountant's search fast; subsampled calibration takes the same path
    target = 1.0
    r = api.submit(sigma=None, epsilon=target, iterations=10, batch_size=N)
    assert r.status_code == 202, r.text
    job = r.json()
    assert job["epsilon_target"] == target
    assert job["sigma"] > 0
    assert job["epsilon_job"] == pytest.approx(epsilon(job["sigma"], N, N, 10, DELTA))
    assert 0.99 * target <= job["epsilon_job"] <= target
    assert reserved(api.engine) <= target


def test_over_budget_is_409_with_the_numbers_and_reserves_nothing(api: Api) -> None:
    before = reserved(api.engine)
    r = api.submit(sigma=0.5, iterations=400)
    assert r.status_code == 409, r.text
    body = r.json()
    assert "epsilon" in body["detail"] and "priv" in body["detail"]
    assert body["epsilon_budget"] == PRIVATE_BUDGET
    assert body["epsilon_spent_or_reserved"] == pytest.approx(before)
    assert body["epsilon_requested_total"] > PRIVATE_BUDGET
    assert body["epsilon_remaining"] == pytest.approx(PRIVATE_BUDGET - before)
    assert reserved(api.engine) == before
    assert open_reservations(api.engine) == 0
    assert job_count(api.engine) == 0
    assert api.queue.sent == []


def test_quote_and_refusal_carry_the_largest_epsilon_that_fits(api: Api) -> None:
    """largest_epsilon: the job epsilon of the smallest sigma whose cost, composed with what is spent
    and reserved, stays within the cap; a job asking for it is admitted, 1% more is refused."""
    api.submit()
    quote = api.submit(dry_run=True).json()
    largest = quote["largest_epsilon"]
    assert epsilon(SIGMA, BATCH, N, 5, DELTA) < largest < PRIVATE_BUDGET
    refused = api.submit(sigma=None, epsilon=largest * 1.01)
    assert refused.status_code == 409, refused.text
    body = refused.json()
    assert body["largest_epsilon"] == pytest.approx(largest)
    assert f"epsilon remaining {body['epsilon_remaining']:.4g}" in body["detail"]
    assert f"at most epsilon {largest:.4g}" in body["detail"]
    admitted = api.submit(sigma=None, epsilon=largest)
    assert admitted.status_code == 202, admitted.text
    assert reserved(api.engine) <= PRIVATE_BUDGET
    assert api.submit(dataset="pub", sigma=1.0, dry_run=True).json()["largest_epsilon"] is None  # no cap


@pytest.fixture
def roomy_api(tmp_path: Path) -> Iterator[Api]:
    """The API with per-key limits above what a test's single key submits (fair queues: test_fair_queues)."""
    with fresh_database("sqlite", tmp_path, "control") as url:
        yield from make_api(url, tmp_path, max_queued_per_key=1000, pricing_burst_per_key=1000)


def test_budget_admits_jobs_until_it_is_spent(roomy_api: Api) -> None:
    api = roomy_api
    expected = 0  # RDP composes sub-additively: k jobs of T iterations cost what one job of k T costs
    while epsilon(SIGMA, BATCH, N, 5 * (expected + 1), DELTA) <= PRIVATE_BUDGET:
        expected += 1
    admitted = 0
    while (answer := api.submit(iterations=5)).status_code == 202:
        admitted += 1
    assert answer.status_code == 409  # the budget, not a per-key limit, stopped it
    assert admitted == expected > 1
    assert reserved(api.engine) <= PRIVATE_BUDGET
    assert len(api.queue.sent) == admitted == open_reservations(api.engine) == job_count(api.engine)


def test_dry_run_quotes_and_reserves_nothing(api: Api) -> None:
    r = api.submit(dry_run=True)
    assert r.status_code == 200, r.text
    quote = r.json()
    expected = epsilon(SIGMA, BATCH, N, 5, DELTA)
    assert quote["sigma"] == SIGMA
    assert quote["epsilon_job"] == pytest.approx(expected)
    assert quote["epsilon_spent"] == quote["epsilon_reserved"] == 0.0
    assert quote["epsilon_after"] == pytest.approx(expected)
    assert quote["epsilon_budget"] == quote["epsilon_remaining"] == PRIVATE_BUDGET
    assert quote["admissible"] is True
    assert (reserved(api.engine), job_count(api.engine), api.queue.sent) == (0.0, 0, [])
    api.submit()  # one job reserved: the next quote counts it
    quote = api.submit(dry_run=True).json()
    assert quote["epsilon_spent"] == 0.0
    assert quote["epsilon_reserved"] == pytest.approx(expected)
    assert quote["epsilon_after"] == pytest.approx(epsilon(SIGMA, BATCH, N, 10, DELTA))
    refused = api.submit(sigma=0.5, iterations=400, dry_run=True).json()
    assert refused["admissible"] is False
    assert reserved(api.engine) == pytest.approx(expected)
    assert job_count(api.engine) == len(api.queue.sent) == open_reservations(api.engine) == 1


def test_pricing_takes_a_bounded_number_of_request_threads(tmp_path: Path) -> None:
    """Accountant work holds at most `pricing_slots` threads; with every slot taken a quote waits
    `pricing_wait_seconds` and gets a 503 that says so, while reads go on; nothing is reserved."""
    from control.planning.pricing import pricing_slot

    with fresh_database("sqlite", tmp_path) as url:
        migrate("control", url)
        engine = create_db_engine(url)
        keys, _ = populate(engine)
        settings = ServiceSettings(
            home=tmp_path, control_database_url=url, pricing_slots=1, pricing_wait_seconds=0.2
        )
        try:
            with TestClient(create_app(settings, queue=RecordingQueue())) as client:
                api = Api(client, engine, RecordingQueue(), keys, {})
                with pricing_slot(settings):  # a slow quote elsewhere holds the only slot
                    busy = api.submit(dry_run=True)
                    assert busy.status_code == 503 and "accountant is busy" in busy.json()["detail"]
                    assert api.submit().status_code == 503
                    read = client.get("/v1/jobs", headers={"Authorization": f"Bearer {keys['analyst']}"})
                    assert read.status_code == 200
                assert api.submit(dry_run=True).status_code == 200  # the slot is free again
                assert (reserved(engine), job_count(engine)) == (0.0, 0)
        finally:
            engine.dispose()


def test_a_private_dataset_without_a_budget_is_409(api: Api) -> None:
    r = api.submit(dataset="nobudget")
    assert r.status_code == 409
    assert r.json()["detail"] == "the custodian has not set a budget for dataset nobudget"
    assert job_count(api.engine) == 0


def test_sigma_zero_runs_on_a_public_dataset_with_an_uncapped_budget(api: Api) -> None:
    r = api.submit(dataset="pub", sigma=0, batch_size=50)
    assert r.status_code == 202, r.text
    assert r.json()["epsilon_job"] is None
    status = ledger_db.budget_status(api.engine, "pub")
    assert (status.epsilon_budget, status.delta) == (None, 1e-5)
    listed = {d["name"]: d for d in api.call("GET", "/v1/datasets", "analyst").json()}
    assert listed["pub"]["budget"]["epsilon"] is None
    assert listed["pub"]["budget"]["epsilon_remaining"] is None
    assert listed["nobudget"]["budget"] is None
    quote = api.submit(dataset="pub", sigma=0, batch_size=50, dry_run=True).json()
    assert quote["epsilon_after"] is None
    assert quote["admissible"] is True


def test_unknown_dataset_is_404(api: Api) -> None:
    r = api.submit(dataset="nosuch")
    assert r.status_code == 404
    assert r.json()["detail"] == "dataset nosuch not found"
    assert api.call("GET", "/v1/datasets/nosuch", "analyst").status_code == 404


LDA_TOPICS = ["body", "options", "topics"]
LDA_DOC_LENGTH = ["body", "options", "doc_length"]


@pytest.mark.parametrize(
    ("spec", "field", "words"),
    [
        ({"iterations": -1}, ["body", "iterations"], "greater than or equal to 1"),
        ({"iterations": 0}, ["body", "iterations"], "greater than or equal to 1"),
        ({"iterations": MAX_ITERATIONS + 1}, ["body", "iterations"], "maximum"),
        ({"iterations": "many"}, ["body", "iterations"], "integer"),
        ({"batch_size": N + 1}, ["body", "batch_size"], "N = 1000"),
        ({"batch_size": 0}, ["body", "batch_size"], "greater than or equal to 1"),
        ({"epsilon": 1.0}, ["body", "epsilon"], "not both"),
        ({"sigma": None}, ["body", "sigma"], "exactly one"),
        ({"sigma": 0}, ["body", "sigma"], "public"),
        ({"sigma": -1}, ["body", "sigma"], "greater than or equal to 0"),
        ({"sigma": 1e-12}, ["body", "sigma"], "at least 0.001"),
        ({"sigma": None, "epsilon": 0}, ["body", "epsilon"], "greater than 0"),
        ({"options": {"alpha": 1.0}}, ["body", "options", "alpha"], "unknown option"),
        ({"options": {"kappa": 2.0}}, ["body", "options", "kappa"], "[0, 1]"),
        ({"options": {"a0": 0}}, ["body", "options", "a0"], "[1e-06, 1e+06]"),
        ({"options": {"tau0": 1e300}}, ["body", "options", "tau0"], "[0, 1e+09]"),
        ({"options": {"a0": "x"}}, ["body", "options", "a0"], "number"),
        ({"model": "foo"}, ["body", "model"], "'blr'"),
        ({"model": "lda"}, ["body", "model"], "needs a bow dataset"),
        ({"model": "sbn"}, ["body", "model"], "needs a binary dataset"),
        ({"model": "lda", "dataset": "docs", "options": {"topics": 2.5}}, LDA_TOPICS, "whole number"),
        ({"model": "lda", "dataset": "docs", "options": {"topics": 0}}, LDA_TOPICS, "[1, 1000]"),
        ({"model": "lda", "dataset": "docs", "options": {"clip": 0}}, ["body", "options", "clip"], "(0, 1]"),
        (
            {"model": "lda", "dataset": "docs", "options": {"unigram_clip": 1e-300}},
            ["body", "options", "unigram_clip"],
            "[1e-06, 1e+06]",
        ),
        ({"model": "lda", "dataset": "docs", "options": {"doc_length": 0}}, LDA_DOC_LENGTH, "sigma 0"),
        (
            {"model": "lda", "dataset": "docs", "options": {"hidden": 5}},
            ["body", "options", "hidden"],
            "unknown",
        ),
        ({"model": "lda", "dataset": "docs", "algorithm": "dpvi"}, ["body", "algorithm"], "fits model blr"),
        ({"algorithm": "dpvi", "options": {"a0": 1.0}}, ["body", "options", "a0"], "unknown option"),
        ({"algorithm": "dpvi", "options": {"learning_rate": 0}}, ["body", "options", "learning_rate"], "in"),
        ({"algorithm": "dpvi", "options": {"draws": 0.5}}, ["body", "options", "draws"], "whole number"),
        ({"algorithm": "dpsep", "options": {"damping": 1.5}}, ["body", "options", "damping"], "(0, 1]"),
        (
            {"algorithm": "dpsep", "options": {"noise_variance": 1}},
            ["body", "options", "noise_variance"],
            "unknown",
        ),
        ({"model": "linreg"}, ["body", "model"], "needs a regression dataset"),
        ({"dataset": "docs"}, ["body", "model"], "tabular"),
        ({"seed": 3}, ["body", "seed"], "not permitted"),
    ],
)
def test_invalid_specs_are_422_naming_the_field(
    api: Api, spec: dict[str, Any], field: list[str], words: str
) -> None:
    body = {"dataset": "priv", "model": "blr", "iterations": 5, "batch_size": BATCH, "sigma": SIGMA, **spec}
    r = api.call("POST", "/v1/jobs", "analyst", json={k: v for k, v in body.items() if v is not None})
    assert r.status_code == 422, r.text
    errors = r.json()["detail"]
    matching = [e for e in errors if e["loc"] == field]
    assert matching, errors
    assert words in matching[0]["msg"]
    assert job_count(api.engine) == 0
    assert open_reservations(api.engine) == 0


def test_non_finite_numbers_and_broken_json_are_422(api: Api) -> None:
    headers = {"Authorization": f"Bearer {api.keys['analyst']}", "Content-Type": "application/json"}
    for raw in (
        '{"dataset": "priv", "model": "blr", "iterations": 5, "sigma": NaN}',
        '{"dataset": "priv", "model": "blr", "iterations": 5, "sigma": Infinity}',
        '{"dataset": "priv", "model": "blr", "iterations": 5, "sigma": 1, "options": {"a0": Infinity}}',
        '{"dataset": "priv", ',
    ):
        r = api.client.post("/v1/jobs", content=raw, headers=headers)
        assert r.status_code == 422, raw
    assert job_count(api.engine) == 0


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", "/v1/jobs", []),
        ("POST", "/v1/jobs", "blr"),
        ("POST", "/v1/jobs", {"dataset": "priv", "model": "blr", "iterations": 10**30, "sigma": 1}),
        ("POST", "/v1/jobs", {"dataset": "x" * 500, "model": "blr", "iterations": 1, "sigma": 1}),
        ("POST", "/v1/jobs", {"dataset": "priv", "model": "blr", "iterations": 1, "sigma": 1e-300}),
        ("POST", "/v1/jobs", {"dataset": "priv", "model": "blr", "iterations": 1, "epsilon": 1e-300}),
        (
            "POST",
            "/v1/jobs",
            {"dataset": "priv", "model": "blr", "iterations": 3, "batch_size": 7, "sigma": 1e-9},
        ),
        ("POST", "/v1/jobs", {"dataset": "priv", "model": "blr", "iterations": 1, "options": []}),
        ("GET", "/v1/jobs?limit=0", None),
        ("GET", "/v1/jobs?status=sleeping", None),
        ("GET", "/v1/jobs?offset=-1", None),
        ("GET", "/v1/jobs/%00%ff", None),
        ("GET", "/v1/datasets/..%2F..%2Fetc", None),
        ("PUT", "/v1/datasets/priv/budget", {"epsilon": "lots", "delta": 0}),
        ("POST", "/v1/keys", None),
    ],
)
def test_bad_input_is_a_4xx_with_a_message(api: Api, method: str, path: str, body: Any) -> None:
    who = "cust" if method == "PUT" else "admin" if path.startswith("/v1/keys") else "analyst"
    r = api.call(method, path, who, json=body)
    assert 400 <= r.status_code < 500, r.text
    assert r.json()["detail"]
    assert open_reservations(api.engine) == 0


def test_a_failed_send_refunds_and_fails_the_job(api: Api) -> None:
    api.queue.fail = True
    r = api.submit()
    assert r.status_code == 503
    assert "refunded" in r.json()["detail"]
    assert reserved(api.engine) == 0.0
    assert open_reservations(api.engine) == 0
    with api.engine.connect() as conn:
        status, error = conn.execute(select(jobs.c.status, jobs.c.error)).one()
    assert status == "failed"
    assert "queue" in error


# ---- progress, cancel, posteriors, releases --------------------------------------------------------------


def test_epsilon_spent_follows_the_charges_of_the_job(api: Api) -> None:
    job_id = api.submit().json()["id"]
    charge(api.engine, job_id, 1)
    charge(api.engine, job_id, 2)
    job = api.call("GET", f"/v1/jobs/{job_id}", "analyst").json()
    assert job["epsilon_spent"] == pytest.approx(epsilon(SIGMA, BATCH, N, 2, DELTA))
    assert job["epsilon_spent"] < job["epsilon_job"]
    ledger = api.call("GET", "/v1/datasets/priv/ledger", "cust").json()
    assert [(e["job_id"], e["iteration"]) for e in ledger["entries"]] == [(job_id, 1), (job_id, 2)]
    assert ledger["entries"][0]["event"]["noise_multiplier"] == SIGMA
    assert ledger["budget"]["epsilon_spent"] == pytest.approx(job["epsilon_spent"])
    assert ledger["budget"]["epsilon_reserved"] == pytest.approx(job["epsilon_job"])
    # A charge the reservation does not cover (another event) is summed from the ledger's rows.
    charge(api.engine, job_id, 3, sigma=SIGMA * 2)
    uncovered = privacy_cost(SubsampledGaussianEvent(SIGMA, BATCH, N)).scaled(2) + privacy_cost(
        SubsampledGaussianEvent(SIGMA * 2, BATCH, N)
    )
    job = api.call("GET", f"/v1/jobs/{job_id}", "analyst").json()
    assert job["epsilon_spent"] == pytest.approx(uncovered.epsilon(DELTA))
    assert api.call("GET", "/v1/datasets/nobudget/ledger", "cust").json() == {
        "dataset": "nobudget",
        "budget": None,
        "entries": [],
        "next_cursor": None,
    }


def test_cancel_of_a_queued_job_refunds_its_reservation(api: Api) -> None:
    job_id = api.submit().json()["id"]
    assert reserved(api.engine) > 0
    r = api.call("POST", f"/v1/jobs/{job_id}/cancel", "analyst")
    assert r.status_code == 202
    assert r.json()["status"] == "cancelled"
    assert r.json()["cancel_requested"] is True
    assert r.json()["finished_at"] is not None
    assert ledger_db.budget_status(api.engine, "priv").epsilon_reserved == 0.0
    again = api.call("POST", f"/v1/jobs/{job_id}/cancel", "admin")
    assert again.status_code == 202
    assert again.json()["status"] == "cancelled"


def test_cancel_of_a_running_job_only_asks_it_to_stop(api: Api) -> None:
    job_id = api.submit().json()["id"]
    with api.engine.begin() as conn:
        conn.execute(
            update(jobs).where(jobs.c.id == job_id).values(status="running", started_at=datetime.now(UTC))
        )
    job = api.call("POST", f"/v1/jobs/{job_id}/cancel", "analyst").json()
    assert (job["status"], job["cancel_requested"]) == ("running", True)
    assert reserved(api.engine) > 0  # the worker refunds what it did not release when it stops


def test_cancel_of_a_finished_job_is_409(api: Api) -> None:
    job_id = api.submit().json()["id"]
    finish(api.engine, job_id, {"model": "blr"})
    r = api.call("POST", f"/v1/jobs/{job_id}/cancel", "analyst")
    assert r.status_code == 409
    assert r.json()["detail"] == f"job {job_id} has already succeeded"


def test_posterior_is_409_before_success_and_200_after(api: Api) -> None:
    job_id = api.submit().json()["id"]
    r = api.call("GET", f"/v1/jobs/{job_id}/posterior", "analyst")
    assert r.status_code == 409
    assert "queued" in r.json()["detail"]
    document = {"model": "blr", "job_id": job_id, "privacy": {"epsilon": 0.1}, "mean": [0.5, -1.0, 2.0]}
    finish(api.engine, job_id, document)
    for who in ("analyst", "client", "admin"):
        r = api.call("GET", f"/v1/jobs/{job_id}/posterior", who)
        assert r.status_code == 200, who
        assert r.json() == document
    assert api.call("GET", f"/v1/jobs/{job_id}/posterior", "client_other").status_code == 404
    assert [j["id"] for j in api.call("GET", "/v1/jobs", "client").json()] == [job_id]
    assert api.call("GET", "/v1/jobs", "client_other").json() == []
    assert api.call("GET", f"/v1/jobs/{job_id}", "client").json()["status"] == "succeeded"
    assert [j["id"] for j in api.call("GET", "/v1/jobs?status=succeeded", "analyst").json()] == [job_id]
    assert api.call("GET", "/v1/jobs?status=queued", "analyst").json() == []


@pytest.mark.parametrize("dialect", ["sqlite", "postgresql"])
def test_posterior_is_sent_as_stored_without_parsing(dialect: str, tmp_path: Path) -> None:
    """Issue 34: a 277 MB posterior took the API to 2.28 GB (parsed to Python floats, then written again).
    The route and the dashboard's download send the stored JSON text's bytes: the same document, byte for
    byte as stored (a parsed and re-written one has other separators: this failed before)."""
    document = {
        "model": "lda",
        "privacy": {"epsilon": 0.1},
        "lambda": [[0.1, 1e-300, -2.5e17, 3.0], [1 / 3, 2**-1074, 1.7976931348623157e308, 0.0]],
    }
    with fresh_database(dialect, tmp_path, "control") as url:
        for api in make_api(url, tmp_path):
            job_id = api.submit().json()["id"]
            document["job_id"] = job_id
            finish(api.engine, job_id, document)
            stored = posterior_text(api.engine, job_id)
            r = api.call("GET", f"/v1/jobs/{job_id}/posterior", "analyst")
            assert r.status_code == 200
            assert r.headers["content-type"] == "application/json"
            assert r.headers["content-length"] == str(len(stored))
            assert r.content == stored
            assert r.json() == document


def test_releases_are_listed_in_order(api: Api) -> None:
    job_id = api.submit().json()["id"]
    assert api.call("GET", f"/v1/jobs/{job_id}/releases", "analyst").json() == []
    for t in (2, 1, 3):
        statistics = {"s1": [0.1 * t, 0.2], "s2": [[1.0, 0.0], [0.0, 1.0]]}
        store_release(api.engine, job_id, t, statistics, {"s1": 0.01, "s2": 0.02})
    response = api.call("GET", f"/v1/jobs/{job_id}/releases", "analyst")
    assert response.headers["content-type"] == "application/json" and "link" not in response.headers
    listed = response.json()
    assert [r["iteration"] for r in listed] == [1, 2, 3]
    assert listed[0]["statistics"] == {"s1": [0.1, 0.2], "s2": [[1.0, 0.0], [0.0, 1.0]]}
    assert listed[2]["statistics"]["s1"] == [0.1 * 3, 0.2]  # float64 exactly as released
    assert listed[0]["noise_std"] == {"s1": 0.01, "s2": 0.02}
    assert listed[0]["created_at"].endswith(("Z", "+00:00"))
    later = api.call("GET", f"/v1/jobs/{job_id}/releases?after=1&limit=1", "admin").json()
    assert [r["iteration"] for r in later] == [2]


#: Releases of 13 values in three blocks: 774 bytes stored (104 of values, the blocks' headers, the end).
PAGED = {
    t: {"s1": np.full(4, 0.1 * t), "s2": np.full((2, 4), -t / 3), "c": np.array(float(t))}
    for t in range(1, 13)
}


@pytest.fixture
def paged_api(tmp_path: Path) -> Iterator[Api]:
    """The API with pages of 5.5 of the PAGED releases."""
    with fresh_database("sqlite", tmp_path, "control") as url:
        yield from make_api(url, tmp_path, releases_page_mb=5.5 * len(encode_arrays(PAGED[1])) / (1 << 20))


def test_releases_come_in_pages_bounded_in_bytes_linked_to_the_next(paged_api: Api) -> None:
    """Pages hold at most VIPS_RELEASES_PAGE_MB of stored releases (at least one, even a larger one); the
    Link header's rel="next" continues after the page, carrying what is left of `limit`; the client
    follows it to the end."""
    api = paged_api
    job_id = api.submit().json()["id"]
    for t, statistics in PAGED.items():
        store_release(api.engine, job_id, t, statistics, {"s1": 0.5})

    def page(query: str) -> tuple[list[int], str | None]:
        r = api.call("GET", f"/v1/jobs/{job_id}/releases{query}", "analyst")
        return [release["iteration"] for release in r.json()], r.headers.get("link")

    link = '<?after=%s>; rel="next"'
    assert page("") == ([1, 2, 3, 4, 5], link % 5)
    assert page("?after=5") == ([6, 7, 8, 9, 10], link % 10)
    assert page("?after=10") == ([11, 12], None)
    assert page("?after=1&limit=7") == ([2, 3, 4, 5, 6], link % "6&limit=2")
    assert page("?limit=5") == ([1, 2, 3, 4, 5], None)  # the limit is reached: no next page
    analyst = VipsClient("http://testserver", api.keys["analyst"], http=api.client)
    followed = analyst.releases(job_id, after=1, limit=7)
    assert [r["iteration"] for r in followed] == list(range(2, 9))
    for release in followed:
        expected = PAGED[release["iteration"]]
        assert release["statistics"] == {name: np.asarray(v).tolist() for name, v in expected.items()}
    assert [r["iteration"] for r in analyst.releases(job_id)] == list(range(1, 13))
    big = np.random.default_rng(7).normal(size=5000)  # 40 kB: alone on its page
    store_release(api.engine, job_id, 13, {"s": big}, {"s": 1.0})
    alone = api.call("GET", f"/v1/jobs/{job_id}/releases?after=12", "analyst").json()
    assert [r["iteration"] for r in alone] == [13] and alone[0]["statistics"]["s"] == big.tolist()


# ---- budgets ---------------------------------------------------------------------------------------------


def test_budget_updates_are_checked(api: Api) -> None:
    r = api.call("PUT", "/v1/datasets/nobudget/budget", "cust", json={"epsilon": 2.0, "delta": 1e-6})
    assert r.status_code == 200
    assert r.json() == {
        "epsilon": 2.0,
        "delta": 1e-6,
        "epsilon_spent": 0.0,
        "epsilon_reserved": 0.0,
        "epsilon_remaining": 2.0,
        "warning": None,  # set when the cap is at or below the spend (tests/test_ui_jobs.py)
    }
    for body, field in (
        ({"epsilon": None, "delta": DELTA}, "epsilon"),
        ({"epsilon": -1, "delta": DELTA}, "epsilon"),
        ({"epsilon": 1, "delta": 1.5}, "delta"),
        ({"epsilon": 1}, "delta"),
    ):
        r = api.call("PUT", "/v1/datasets/nobudget/budget", "cust", json=body)
        assert r.status_code == 422, body
        assert ["body", field] in [e["loc"] for e in r.json()["detail"]]
    r = api.call("PUT", "/v1/datasets/pub/budget", "admin", json={"epsilon": None, "delta": DELTA})
    assert r.status_code == 200
    assert r.json()["epsilon"] is None
    # delta is fixed once something was charged against it
    job_id = api.submit().json()["id"]
    charge(api.engine, job_id, 1)
    r = api.call("PUT", "/v1/datasets/priv/budget", "cust", json={"epsilon": 5.0, "delta": 1e-6})
    assert r.status_code == 409
    assert "delta" in r.json()["detail"]


# ---- keys ------------------------------------------------------------------------------------------------


def test_keys_are_created_by_admins_and_stored_hashed(api: Api) -> None:
    r = api.call("POST", "/v1/keys", "admin", json={"role": "client", "dataset": "priv"})
    assert r.status_code == 201, r.text
    created = r.json()
    key = created["key"]
    assert key.startswith(f"vips_{created['id']}_")
    assert (created["role"], created["dataset"]) == ("client", "priv")
    with api.engine.connect() as conn:
        rows = [tuple(row) for row in conn.execute(select(api_keys)).all()]
        stored = conn.execute(select(api_keys.c.key_hash).where(api_keys.c.id == created["id"])).scalar_one()
    assert stored == hashlib.sha256(key.encode()).hexdigest()
    secret = key.removeprefix(f"vips_{created['id']}_")  # the secret may itself hold "_" (URL-safe base64)
    assert len(secret) >= 20 and not any(secret in str(value) for row in rows for value in row)
    assert (
        api.client.get("/v1/datasets", headers={"Authorization": f"Bearer {key}"}).json()[0]["name"] == "priv"
    )
    for body, field in (({"role": "root"}, "role"), ({"role": "admin", "dataset": "priv"}, "dataset")):
        r = api.call("POST", "/v1/keys", "admin", json=body)
        assert r.status_code == 422
        assert ["body", field] in [e["loc"] for e in r.json()["detail"]]


# ---- probes and documentation ----------------------------------------------------------------------------


def test_health_readiness_and_docs(api: Api) -> None:
    assert api.client.get("/healthz").json() == {"status": "ok"}
    r = api.client.get("/readyz")
    assert r.status_code == 200
    assert r.json() == {"status": "ok", "checks": {"database": "ok", "broker": "ok", "worker": "ok"}}
    api.queue.fail = True
    r = api.client.get("/readyz")
    assert r.status_code == 503
    assert r.json()["checks"]["database"] == "ok"
    assert r.json()["checks"]["broker"] != "ok"
    assert api.client.get("/docs").status_code == 200
    spec = api.client.get("/openapi.json").json()
    assert {"/v1/jobs", "/v1/datasets/{name}/budget", "/v1/jobs/{job_id}/posterior"} <= set(spec["paths"])


def test_readyz_is_503_when_the_database_is_unreachable(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'missing' / 'dir' / 'control.db'}"
    settings = ServiceSettings(home=tmp_path, control_database_url=url)
    with TestClient(create_app(settings, queue=RecordingQueue())) as client:
        assert client.get("/healthz").status_code == 200
        r = client.get("/readyz")
        assert r.status_code == 503
        assert r.json()["status"] == "unavailable"
        assert r.json()["checks"]["database"] != "ok"
        assert r.json()["checks"]["broker"] == "ok"
        assert str(tmp_path) not in r.text
        r = client.get("/v1/datasets", headers={"Authorization": "Bearer vips_0123456789abcdef_x"})
        assert r.status_code == 503
        assert r.json()["detail"] == "the control database is unavailable; try again later"


def test_embedded_broker_readiness_checks_its_folders(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'control.db'}"
    migrate("control", url)
    settings = ServiceSettings(home=tmp_path, control_database_url=url)
    with TestClient(create_app(settings)) as client:
        r = client.get("/readyz")  # no embedded worker has reported yet
        assert r.status_code == 503
        assert r.json()["checks"]["worker"] == "no live worker (no worker has started)"
        settings.worker_alive_path().touch()  # what a live worker does every WORKER_ALIVE_SECONDS
        assert client.get("/readyz").status_code == 200
        (tmp_path / "broker" / "processed").rmdir()
        r = client.get("/readyz")
        assert r.status_code == 503
        assert r.json()["checks"]["database"] == r.json()["checks"]["worker"] == "ok"
        assert r.json()["checks"]["broker"] != "ok"


# ---- keys: expiry, listing, revocation, scopes ------------------------------------------------------------


def test_an_expired_key_is_401_like_a_revoked_one(api: Api) -> None:
    r = api.call(
        "POST", "/v1/keys", "admin", json={"role": "analyst", "all_datasets": True, "expires_in_days": 2}
    )
    assert r.status_code == 201, r.text
    created = r.json()
    expires = datetime.fromisoformat(created["expires_at"])
    assert timedelta(days=2) - timedelta(minutes=1) < expires - datetime.now(UTC) <= timedelta(days=2)
    headers = {"Authorization": f"Bearer {created['key']}"}
    assert api.client.get("/v1/datasets", headers=headers).status_code == 200
    with api.engine.begin() as conn:
        conn.execute(
            update(api_keys)
            .where(api_keys.c.id == created["id"])
            .values(expires_at=datetime.now(UTC) - timedelta(seconds=1))
        )
    r = api.client.get("/v1/datasets", headers=headers)
    assert r.status_code == 401
    assert r.headers["www-authenticate"] == "Bearer"
    assert r.json()["detail"].startswith("this API key expired at ")  # its holder learns why (issue 55)
    listed = {k["id"]: k for k in api.call("GET", "/v1/keys", "admin").json()}
    assert listed[created["id"]]["expired"] is True and listed[created["id"]]["revoked"] is False
    assert listed[api.ids["analyst"]]["expires_at"] is None and listed[api.ids["analyst"]]["expired"] is False
    for days in (0, -1, 36_501, "1"):
        bad = api.call("POST", "/v1/keys", "admin", json={"role": "admin", "expires_in_days": days})
        assert bad.status_code == 422, days


def test_keys_are_listed_without_secrets_and_revoked_by_delete(api: Api) -> None:
    r = api.call("GET", "/v1/keys", "admin")
    assert r.status_code == 200
    listed = r.json()
    assert {k["id"] for k in listed} == set(api.ids.values())
    with api.engine.connect() as conn:
        hashes = set(conn.execute(select(api_keys.c.key_hash)).scalars())
    for secret in [*hashes, *api.keys.values()]:
        assert secret not in r.text
    assert set(listed[0]) == {
        "id", "name", "role", "dataset", "all_datasets", "created_at", "expires_at", "expired", "revoked"
    }  # fmt: skip
    by_id = {k["id"]: k for k in listed}
    assert by_id[api.ids["cust2"]]["dataset"] == "other"
    assert by_id[api.ids["client"]]["all_datasets"] is True
    assert by_id[api.ids["cust"]]["all_datasets"] is False and by_id[api.ids["cust"]]["dataset"] == "priv"

    assert api.call("GET", "/v1/jobs", "analyst").status_code == 200
    r = api.call("DELETE", f"/v1/keys/{api.ids['analyst']}", "admin")
    assert r.status_code == 200, r.text
    assert r.json()["revoked"] is True and r.json()["id"] == api.ids["analyst"]
    assert api.call("GET", "/v1/jobs", "analyst").status_code == 401
    assert api.call("DELETE", f"/v1/keys/{api.ids['analyst']}", "admin").status_code == 200  # again: no-op
    missing = api.call("DELETE", "/v1/keys/0123456789abcdef", "admin")
    assert missing.status_code == 404
    assert missing.json()["detail"] == "key 0123456789abcdef not found"
    assert api.call("GET", "/v1/jobs", "analyst2").status_code == 200  # the others still work


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"role": "analyst"}, "dataset"),
        ({"role": "client"}, "dataset"),
        ({"role": "analyst", "dataset": "priv", "all_datasets": True}, "dataset"),
        ({"role": "custodian", "all_datasets": True}, "all_datasets"),
        ({"role": "admin", "all_datasets": True}, "all_datasets"),
        ({"role": "admin", "dataset": "priv"}, "dataset"),
    ],
)
def test_analyst_and_client_keys_need_a_scope_or_all_datasets(api: Api, body: Any, field: str) -> None:
    r = api.call("POST", "/v1/keys", "admin", json=body)
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"] == ["body", field]
    assert len(api.call("GET", "/v1/keys", "admin").json()) == len(api.ids)


def test_a_scoped_analyst_sees_and_submits_only_on_its_dataset(api: Api) -> None:
    for role in ("analyst", "client"):
        r = api.call("POST", "/v1/keys", "admin", json={"role": role, "dataset": "later"})
        assert r.status_code == 201, r.text  # a dataset that does not exist yet
        assert r.json()["dataset"] == "later" and r.json()["all_datasets"] is False
    _, api.keys["scoped"] = create_key(api.engine, "analyst", "other")
    assert [d["name"] for d in api.call("GET", "/v1/datasets", "scoped").json()] == ["other"]
    assert api.call("GET", "/v1/datasets/other", "scoped").json()["budget"]["epsilon"] == PRIVATE_BUDGET
    foreign = api.call("GET", "/v1/datasets/priv", "scoped")
    missing = api.call("GET", "/v1/datasets/nosuch", "scoped")
    assert foreign.status_code == missing.status_code == 404
    assert foreign.json()["detail"] == missing.json()["detail"].replace("nosuch", "priv")
    for name in ("priv", "pub"):
        r = api.submit("scoped", dataset=name)
        assert r.status_code == 404, r.text
        assert r.json()["detail"] == f"dataset {name} not found"
        assert api.submit("scoped", dataset=name, dry_run=True).status_code == 404
    assert job_count(api.engine) == 0 and open_reservations(api.engine) == 0
    r = api.submit("scoped", dataset="other")
    assert r.status_code == 202, r.text
    assert [j["id"] for j in api.call("GET", "/v1/jobs", "scoped").json()] == [r.json()["id"]]
    # A key scoped to a dataset that does not exist yet sees it once it is there.
    _, api.keys["later"] = create_key(api.engine, "analyst", "later")
    assert api.call("GET", "/v1/datasets", "later").json() == []
    add_dataset(api.engine, "later")
    assert [d["name"] for d in api.call("GET", "/v1/datasets", "later").json()] == ["later"]
    # Unscoped (all-datasets) analysts still see every dataset.
    assert len(api.call("GET", "/v1/datasets", "analyst").json()) == 6


def test_custodians_read_the_jobs_of_their_datasets_only(api: Api) -> None:
    mine = api.submit(dataset="priv").json()["id"]
    theirs = api.submit(dataset="other").json()["id"]
    charge(api.engine, mine, 1)
    finish(api.engine, mine, {"model": "blr", "job_id": mine})
    store_release(api.engine, mine, 1, {"s": [1.0]}, {"s": 1.0})
    for cust, own, foreign in (("cust", mine, theirs), ("cust2", theirs, mine)):
        assert api.call("GET", f"/v1/jobs/{own}", cust).json()["id"] == own
        assert [j["id"] for j in api.call("GET", "/v1/jobs", cust).json()] == [own]
        assert api.call("GET", f"/v1/jobs/{own}/releases", cust).status_code == 200
        for path in (f"/v1/jobs/{foreign}", f"/v1/jobs/{foreign}/releases", f"/v1/jobs/{foreign}/posterior"):
            r = api.call("GET", path, cust)
            assert r.status_code == 404, (cust, path)
            assert r.json()["detail"] == f"job {foreign} not found"
        other = "other" if cust == "cust" else "priv"
        assert api.call("GET", "/v1/jobs", cust, params={"dataset": other}).json() == []
        assert api.call("POST", f"/v1/jobs/{foreign}/cancel", cust).status_code == 404
    assert [r["iteration"] for r in api.call("GET", f"/v1/jobs/{mine}/releases", "cust").json()] == [1]
    assert api.call("GET", f"/v1/jobs/{mine}/posterior", "cust").json()["job_id"] == mine
    assert api.call("GET", f"/v1/jobs/{theirs}/posterior", "cust2").status_code == 409  # not finished
    assert api.call("GET", "/v1/jobs", "cust", params={"dataset": "priv"}).json()[0]["id"] == mine


# ---- the ledger: pages and per-job summary -----------------------------------------------------------------


def test_ledger_pages_cover_every_entry_exactly_once(api: Api) -> None:
    first, second = api.submit().json()["id"], api.submit().json()["id"]
    for t in range(1, 5):
        charge(api.engine, first, t)
        charge(api.engine, second, t)
    charge(api.engine, first, 5)
    total = 9
    seen: list[tuple[str, int]] = []
    ids: list[int] = []
    cursor = None
    pages = 0
    while True:
        params: dict[str, Any] = {"limit": 2} | ({} if cursor is None else {"cursor": cursor})
        r = api.call("GET", "/v1/datasets/priv/ledger", "cust", params=params)
        assert r.status_code == 200, r.text
        page = r.json()
        pages += 1
        assert len(page["entries"]) <= 2
        assert page["budget"]["epsilon"] == PRIVATE_BUDGET
        seen += [(e["job_id"], e["iteration"]) for e in page["entries"]]
        ids += [e["id"] for e in page["entries"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert pages == 5
    assert len(seen) == len(set(seen)) == total
    assert ids == sorted(ids)
    assert sorted(seen) == sorted([(first, t) for t in range(1, 6)] + [(second, t) for t in range(1, 5)])
    whole = api.call("GET", "/v1/datasets/priv/ledger", "cust").json()  # default page: 100
    assert [e["id"] for e in whole["entries"]] == ids and whole["next_cursor"] is None
    exact = api.call("GET", "/v1/datasets/priv/ledger", "cust", params={"limit": total}).json()
    assert exact["next_cursor"] is None and len(exact["entries"]) == total
    custodian = VipsClient("http://testserver", api.keys["cust"], http=api.client)
    assert [e["id"] for e in custodian.ledger("priv", page_size=4)["entries"]] == ids
    for params in ({"limit": 0}, {"limit": 1001}, {"cursor": "abc"}, {"cursor": "-1"}):
        bad = api.call("GET", "/v1/datasets/priv/ledger", "cust", params=params)
        assert bad.status_code == 422, params
        assert bad.json()["detail"][0]["loc"][-1] in ("limit", "cursor")


def test_ledger_jobs_summarises_each_job_at_the_datasets_delta(api: Api) -> None:
    first, second, queued = (api.submit().json()["id"] for _ in range(3))
    for t in (1, 2, 3):
        charge(api.engine, first, t)
    charge(api.engine, second, 1)
    charge(api.engine, second, 2, sigma=SIGMA * 2)  # beyond its reservation's event: summed from the rows
    r = api.call("GET", "/v1/datasets/priv/ledger/jobs", "cust")
    assert r.status_code == 200, r.text
    summary = r.json()
    assert summary["dataset"] == "priv" and summary["delta"] == DELTA
    assert [j["job_id"] for j in summary["jobs"]] == [first, second, queued]
    by_id = {j["job_id"]: j for j in summary["jobs"]}
    assert (by_id[first]["iterations_charged"], by_id[first]["charges"]) == (3, 3)
    assert (by_id[second]["iterations_charged"], by_id[queued]["charges"]) == (2, 0)
    for job_id in (first, second, queued):
        job = api.call("GET", f"/v1/jobs/{job_id}", "analyst").json()
        assert by_id[job_id]["status"] == job["status"] == "queued"
        assert by_id[job_id]["epsilon_spent"] == pytest.approx(job["epsilon_spent"], rel=1e-12)
    assert by_id[first]["epsilon_spent"] == pytest.approx(epsilon(SIGMA, BATCH, N, 3, DELTA))
    assert by_id[queued]["epsilon_spent"] == 0.0
    assert api.call("GET", "/v1/datasets/priv/ledger/jobs", "admin").json() == summary
    assert api.call("GET", "/v1/datasets/priv/ledger/jobs", "cust2").status_code == 404
    assert api.call("GET", "/v1/datasets/nobudget/ledger/jobs", "cust").json() == {
        "dataset": "nobudget",
        "delta": None,
        "jobs": [],
    }


# ---- the Python client -----------------------------------------------------------------------------------


def test_the_client_mirrors_the_routes(api: Api) -> None:
    analyst = VipsClient("http://testserver", api.keys["analyst"], http=api.client)
    custodian = VipsClient("http://testserver", api.keys["cust"], http=api.client)
    admin = VipsClient("http://testserver", api.keys["admin"], http=api.client)
    assert analyst.health() == {"status": "ok"}
    assert analyst.ready()["status"] == "ok"
    assert {d["name"] for d in analyst.datasets()} >= {"priv", "pub"}
    assert analyst.dataset("priv")["population"] == N
    assert custodian.set_budget("nobudget", 1.0, DELTA)["epsilon"] == 1.0
    quote = analyst.submit_job(
        dataset="priv", model="blr", iterations=5, batch_size=BATCH, sigma=SIGMA, dry_run=True
    )
    assert quote["admissible"] is True
    job = analyst.submit_job(dataset="priv", model="blr", iterations=5, batch_size=BATCH, sigma=SIGMA)
    assert analyst.job(job["id"])["status"] == "queued"
    assert [j["id"] for j in analyst.jobs()] == [job["id"]]
    assert analyst.releases(job["id"]) == []
    assert analyst.cancel(job["id"])["status"] == "cancelled"
    assert analyst.wait(job["id"], interval=0.01)["status"] == "cancelled"
    assert custodian.ledger("priv")["entries"] == []
    created = admin.create_key("analyst", all_datasets=True)
    assert created["role"] == "analyst"
    assert created["id"] in {k["id"] for k in admin.list_keys()}
    assert admin.revoke_key(created["id"])["revoked"] is True
    with pytest.raises(ApiError) as unscoped:
        admin.create_key("client")
    assert unscoped.value.status_code == 422
    assert "--all-datasets" in unscoped.value.detail
    with pytest.raises(ApiError) as refused:
        analyst.submit_job(dataset="priv", model="blr", iterations=400, batch_size=BATCH, sigma=0.5)
    assert refused.value.status_code == 409
    assert refused.value.body["epsilon_budget"] == PRIVATE_BUDGET
    with pytest.raises(ApiError) as invalid:
        analyst.submit_job(dataset="priv", model="blr", iterations=0, sigma=1.0)
    assert invalid.value.status_code == 422
    assert invalid.value.detail.startswith("iterations: ")
    with pytest.raises(ApiError) as denied:
        analyst.posterior(job["id"])
    assert denied.value.status_code == 409
    with pytest.raises(ApiError) as anonymous:
        VipsClient("http://testserver", "vips_0123456789abcdef_x", http=api.client).datasets()
    assert anonymous.value.status_code == 401


def test_the_client_reads_its_environment() -> None:
    client = VipsClient.from_env({"VIPS_URL": "http://example.invalid:9/", "VIPS_API_KEY": "vips_a_b"})
    assert client.base_url == "http://example.invalid:9"
    with pytest.raises(ApiError) as missing:
        VipsClient.from_env({}).datasets()
    assert missing.value.status_code == 401
    assert "VIPS_API_KEY" in missing.value.detail
    with pytest.raises(ApiError) as unreachable:
        VipsClient("http://127.0.0.1:9", "k", timeout=2).health()
    assert unreachable.value.status_code == 0


# ---- PostgreSQL ------------------------------------------------------------------------------------------


@pytest.mark.postgres
def test_submit_path_on_postgresql(tmp_path: Path) -> None:
    with fresh_database("postgresql", tmp_path, "control") as url:
        for api in make_api(url, tmp_path):
            r = api.submit()
            assert r.status_code == 202, r.text
            job_id = r.json()["id"]
            assert api.queue.sent == [job_id]
            assert reserved(api.engine) == pytest.approx(epsilon(SIGMA, BATCH, N, 5, DELTA))
            assert api.submit(sigma=0.5, iterations=400).status_code == 409
            charge(api.engine, job_id, 1)
            job = api.call("GET", f"/v1/jobs/{job_id}", "analyst").json()
            assert job["epsilon_spent"] == pytest.approx(epsilon(SIGMA, BATCH, N, 1, DELTA))
            assert api.call("POST", f"/v1/jobs/{job_id}/cancel", "analyst").json()["status"] == "cancelled"
            status = ledger_db.budget_status(api.engine, "priv")
            assert status.epsilon_reserved == pytest.approx(status.epsilon_spent)
            assert math.isfinite(status.epsilon_spent)
            with api.engine.connect() as conn:
                assert (
                    conn.execute(select(budgets.c.dataset).where(budgets.c.dataset == "pub")).first() is None
                )
