"""Per-key storage caps (issue 34, item 10): a key's jobs may store at most VIPS_MAX_KEY_STORED_MB in the
control database together: queued and running jobs count at their admission estimates, ended ones at
what they stored (releases and posterior), and a job that would pass the cap is refused at admission
(409 naming the cap, nothing reserved), atomically per key (concurrent submissions on SQLite and
PostgreSQL never pass it together). Deleting an ended job's outputs (`DELETE /v1/jobs/{id}/outputs`,
`vips delete`) frees its bytes, keeps its record and charges, and makes its outputs a 410. Migration 0010
counts what jobs stored before it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import JSON, Connection, DateTime, String, column, func, insert, inspect, select, table

from control.jobs.end import end_job
from control.jobs.storage import MIB
from control.planning.resources import estimate
from control.store.models import jobs, posteriors, releases
from control.store.posteriors import store_posterior
from privacy_wall.ledger import database as ledger_db
from privacy_wall.sqlengine import create_db_engine
from tests.dbservers import fresh_database, schema_drift
from tests.test_api import BATCH, DELTA, SIGMA, Api, charge, make_api, open_reservations, store_release
from tests.test_cli_verbs import use
from tests.test_key_quotas import ROOMY, admitted, race
from vips.cli import main
from vips.migrate import alembic_config

ITERATIONS = 5  # test_key_quotas.race's schedule: blr, 5 iterations of S 100 on the 3-column dataset "priv"
#: What admission estimates such a job stores (T releases of d = 3 and the posterior).
ESTIMATE = estimate("blr", "vips", {}, 3, BATCH, ITERATIONS).stored_bytes
POSTERIOR = {"model": "blr", "mean": [0.5, -1.25, 2.0], "covariance": [[1.0, 0, 0], [0, 1.0, 0], [0, 0, 1.0]]}


def room_for(count: int) -> dict[str, Any]:
    """Settings whose per-key cap holds `count` estimated jobs and not `count` + 1."""
    return {**ROOMY, "max_key_stored_mb": (count + 0.5) * ESTIMATE / MIB}


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    with fresh_database("sqlite", tmp_path) as url:
        yield from make_api(url, tmp_path, **room_for(2))


def stored(api: Api, job_id: str) -> int:
    with api.engine.connect() as conn:
        return int(conn.execute(select(jobs.c.stored_bytes).where(jobs.c.id == job_id)).scalar_one())


def run_to_success(api: Api, job_id: str) -> int:
    """What the worker does: charge and store each release, store the posterior, end the job. Returns
    the bytes it stored (the releases' .npz documents and the posterior's JSON text)."""
    total = 0
    for t in range(1, ITERATIONS + 1):
        charge(api.engine, job_id, t)
        store_release(api.engine, job_id, t, {"mean": [0.1 * t, 0.2, 0.3]}, {"mean": 1.0})
    with api.engine.connect() as conn:
        total = int(conn.execute(select(func.sum(releases.c.stored_bytes))).scalar_one())
    with api.engine.begin() as conn:
        store_posterior(conn, job_id, json.dumps(POSTERIOR).encode(), datetime.now(UTC))
        assert end_job(conn, job_id, "succeeded", only_if=jobs.c.status == "queued")
    return total + len(json.dumps(POSTERIOR).encode())


# ---- done when ---------------------------------------------------------------------------------------


def test_a_job_past_the_keys_storage_cap_is_a_409_naming_it_and_reserves_nothing(api: Api) -> None:
    first, second = api.submit().json(), api.submit().json()
    assert first["stored_bytes"] == second["stored_bytes"] == ESTIMATE > 0
    reserved, queued = open_reservations(api.engine), len(api.queue.sent)
    third = api.submit()
    assert third.status_code == 409, third.text
    detail = third.json()["detail"]
    assert "VIPS_MAX_KEY_STORED_MB" in detail and "vips delete" in detail and "nothing was reserved" in detail
    assert open_reservations(api.engine) == reserved and len(api.queue.sent) == queued
    assert admitted(api, api.ids["analyst"]) == 2
    # The dry run says so too, with the numbers; the cap is per key: another analyst is admitted.
    quote = api.submit(dry_run=True).json()
    assert quote["admissible"] is False and quote["limit"] == "storage"
    assert quote["resources"]["key_stored_bytes"] == 2 * ESTIMATE
    assert quote["resources"]["key_max_stored_bytes"] == int(2.5 * ESTIMATE)
    assert api.submit("analyst2").status_code == 202


def test_an_ended_job_counts_what_it_stored_and_deleting_its_outputs_frees_it(api: Api) -> None:
    job_id = api.submit().json()["id"]
    measured = run_to_success(api, job_id)
    assert stored(api, job_id) == measured
    assert api.call("GET", f"/v1/jobs/{job_id}", "analyst").json()["stored_bytes"] == measured
    assert measured < ESTIMATE / 2  # what it stored replaced its estimate: two more estimates fit beside it
    assert [api.submit().status_code for _ in range(3)] == [202, 202, 409]
    spent = api.call("GET", f"/v1/jobs/{job_id}", "analyst").json()["epsilon_spent"]

    gone = api.call("DELETE", f"/v1/jobs/{job_id}/outputs", "analyst")
    assert gone.status_code == 200, gone.text
    body = gone.json()
    assert body["stored_bytes"] == 0 and body["outputs_deleted_at"] is not None
    assert body["status"] == "succeeded" and body["epsilon_spent"] == spent  # the record and charges stay
    with api.engine.connect() as conn:
        assert conn.execute(select(func.count()).where(releases.c.job_id == job_id)).scalar_one() == 0
        assert conn.execute(select(func.count()).where(posteriors.c.job_id == job_id)).scalar_one() == 0
    assert ledger_db.budget_status(api.engine, "priv").epsilon_spent > 0
    for path in (f"/v1/jobs/{job_id}/posterior", f"/v1/jobs/{job_id}/releases"):
        answer = api.call("GET", path, "analyst")
        assert answer.status_code == 410 and "deleted" in answer.json()["detail"], answer.text
    again = api.call("DELETE", f"/v1/jobs/{job_id}/outputs", "analyst")
    assert again.status_code == 200 and again.json()["outputs_deleted_at"] == body["outputs_deleted_at"]
    assert api.submit().status_code == 409


def test_only_an_ended_jobs_outputs_are_deleted_and_only_by_who_may_cancel_it(api: Api) -> None:
    job_id = api.submit().json()["id"]
    queued = api.call("DELETE", f"/v1/jobs/{job_id}/outputs", "analyst")
    assert queued.status_code == 409 and "cancel it first" in queued.json()["detail"]
    run_to_success(api, job_id)
    for who in ("analyst2", "client"):  # another analyst; a client may read the posterior, not delete it
        answer = api.call("DELETE", f"/v1/jobs/{job_id}/outputs", who)
        assert answer.status_code in (403, 404), (who, answer.text)
    assert stored(api, job_id) > 0
    assert api.call("DELETE", f"/v1/jobs/{job_id}/outputs", "cust").status_code == 200


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_30_simultaneous_submissions_by_one_key_never_pass_its_storage_cap(tmp_path: Path, kind: str) -> None:
    with fresh_database(kind, tmp_path) as url:
        for api in make_api(url, tmp_path, **room_for(7)):
            ledger_db.set_budget(api.engine, "priv", 10.0, DELTA)  # the storage cap is the tighter limit
            codes = race(api, ["analyst"] * 30)
            assert codes.count(202) == 7 and codes.count(409) == 23, codes
            assert admitted(api, api.ids["analyst"]) == 7
            assert open_reservations(api.engine) == 7


def test_vips_delete_frees_a_jobs_outputs(
    api: Api, monkeypatch: pytest.MonkeyPatch, capsys: Any, tmp_path: Path
) -> None:
    job_id = api.submit().json()["id"]
    run_to_success(api, job_id)
    use(api, monkeypatch, "analyst")
    assert main(["delete", job_id[:8]]) == 0
    assert json.loads(capsys.readouterr().out)["stored_bytes"] == 0
    assert main(["posterior", job_id, "-o", str(tmp_path / "p.json")]) == 1
    assert "deleted" in capsys.readouterr().err and not (tmp_path / "p.json").exists()


# ---- migration 0010 --------------------------------------------------------------------------------------

#: Columns of jobs that revisions after 0010 add.
LATER_JOB_COLUMNS = {"resumes"}

#: The posteriors table as migration 0010 left it (0011 moved the document into chunks).
posteriors_0010 = table(
    "posteriors", column("job_id", String(32)), column("document", JSON), column("created_at", DateTime)
)


def insert_job(conn: Connection, job_id: str, owner: str, status: str = "succeeded") -> None:
    """A 2-iteration BLR job on "priv", with the columns every migration since 0010 keeps."""
    spec = {"dataset": "priv", "owner": owner, "model": "blr", "algorithm": "vips", "options": {}}
    spec |= {
        "iterations": 2,
        "batch_size": BATCH,
        "sigma": SIGMA,
        "delta": 1e-5,
        "created_at": datetime.now(UTC),
    }
    conn.execute(insert(jobs).values(id=job_id, status=status, **spec))


def test_migration_0010_counts_what_earlier_jobs_stored(tmp_path: Path) -> None:
    from alembic import command

    from control.store.keys import create_key
    from privacy_wall.ledger.schema import metadata
    from tests.test_api import add_dataset

    url = f"sqlite:///{tmp_path / 'control.db'}"
    config = alembic_config("control", url)
    command.upgrade(config, "0009")
    engine = create_db_engine(url)
    try:
        owner, _ = create_key(engine, "analyst", None, all_datasets=True)
        add_dataset(engine, "priv")
        now = datetime.now(UTC)
        with engine.begin() as conn:
            insert_job(conn, "a" * 32, owner)
            insert_job(conn, "b" * 32, owner, "failed")
            for t in (1, 2):
                conn.execute(
                    insert(releases).values(
                        job_id="a" * 32,
                        iteration=t,
                        arrays=b"x" * 100,
                        stored_bytes=100,
                        noise_std={},
                        created_at=now,
                    )
                )
            conn.execute(insert(posteriors_0010).values(job_id="a" * 32, document=POSTERIOR, created_at=now))
        command.upgrade(config, "0010")
        engine.dispose()
        # the table (not later tables' keys to it, nor the columns later revisions add: 0015's resumes)
        drift = schema_drift(engine, metadata, "'jobs'")
        assert [d for d in drift if not (d[0] == "add_column" and d[3].name in LATER_JOB_COLUMNS)] == []
        with engine.connect() as conn:
            found = dict(conn.execute(select(jobs.c.id, jobs.c.stored_bytes)).all())
        assert found == {"a" * 32: 200 + len(json.dumps(POSTERIOR).encode()), "b" * 32: 0}
        command.downgrade(config, "0009")
        engine.dispose()
        assert "stored_bytes" not in {c["name"] for c in inspect(engine).get_columns("jobs")}
    finally:
        engine.dispose()


def test_the_dashboard_says_a_jobs_outputs_were_deleted(api: Api) -> None:
    from tests.test_ui import sign_in

    job_id = api.submit().json()["id"]
    run_to_success(api, job_id)
    sign_in(api, "analyst")
    assert f'href="/ui/jobs/{job_id}/posterior.json"' in api.client.get(f"/ui/jobs/{job_id}").text
    assert api.call("DELETE", f"/v1/jobs/{job_id}/outputs", "analyst").status_code == 200
    page = api.client.get(f"/ui/jobs/{job_id}")
    assert page.status_code == 200 and "Its releases and posterior were deleted at" in page.text
    assert "posterior.json" not in page.text and "convergence.svg" not in page.text
    assert api.client.get(f"/ui/jobs/{job_id}/posterior.json").status_code == 410
