"""Per-key quotas (issue 23, item 3): `PUT/DELETE /v1/datasets/{name}/quotas/{key_id}`, `GET .../quotas`,
`vips budget quota`; admission checks the dataset's budget and the submitting key's quota (its own
releases composed at the dataset's delta) in the reservation's transaction, so 30 simultaneous submissions
by one key or by two keys overspend neither, on SQLite and PostgreSQL; the 409 names the limit that
refused the job and the largest epsilon that fits both; the dry run reports both; migration 0009."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import insert, inspect, select
from sqlalchemy.exc import IntegrityError

from control.budgets.key_spend import key_cost
from control.store.models import jobs, key_quotas
from privacy_wall.accounting.accountants import configured_accountant
from privacy_wall.accounting.events import SubsampledGaussianEvent
from privacy_wall.ledger import database as ledger_db
from privacy_wall.sqlengine import create_db_engine
from tests.dbservers import fresh_database, schema_drift
from tests.test_api import BATCH, DELTA, SIGMA, Api, make_api
from tests.test_cli_verbs import lines, use
from tests.test_key_names import named_analyst
from vips.cli import main
from vips.migrate import alembic_config

#: Room for the races: neither the per-key queue nor the pricing rate refuses any of them.
ROOMY = {"max_queued_per_key": 1000, "pricing_burst_per_key": 1000, "pricing_rate_per_key": 1000.0}
ITERATIONS = 5


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    with fresh_database("sqlite", tmp_path, "control") as url:
        yield from make_api(url, tmp_path)


def jobs_epsilon(count: int) -> float:
    """`count` jobs of the default schedule composed, at the fixture's delta."""
    job = configured_accountant().cost(SubsampledGaussianEvent(SIGMA, BATCH, 1000)).scaled(ITERATIONS)
    return job.scaled(count).epsilon(DELTA)


def room_for(count: int) -> float:
    """A cap halfway between `count` and `count + 1` composed jobs: exactly `count` fit."""
    return (jobs_epsilon(count) + jobs_epsilon(count + 1)) / 2


def put_quota(api: Api, who: str, key_id: str, epsilon: Any, dataset: str = "priv") -> Any:
    return api.call("PUT", f"/v1/datasets/{dataset}/quotas/{key_id}", who, json={"epsilon": epsilon})


def key_reserved(api: Api, key_id: str) -> float:
    with api.engine.connect() as conn:
        return key_cost(conn, "priv", key_id).epsilon(DELTA)


# ---- done when ---------------------------------------------------------------------------------------


def test_a_quota_refuses_alices_job_with_a_409_naming_it_while_bob_is_admitted(api: Api) -> None:
    alice = named_analyst(api, "alice")
    named_analyst(api, "bob", who="bob")  # no quota: the dataset's budget alone
    r = put_quota(api, "cust", alice, 0.2)
    assert r.status_code == 200, r.text
    assert r.json() == {
        "dataset": "priv",
        "key_id": alice,
        "key_name": "alice",
        "epsilon": 0.2,
        "epsilon_spent": 0.0,
        "epsilon_reserved": 0.0,
        "epsilon_remaining": 0.2,
        "warning": None,
    }
    refused = api.submit("alice", sigma=None, epsilon=0.3)
    assert refused.status_code == 409, refused.text
    body = refused.json()
    assert body["limit"] == "quota" and body["epsilon_budget"] == 0.2
    assert body["detail"].startswith(f"key {alice}'s quota on dataset priv:"), body["detail"]
    assert 0.19 < body["largest_epsilon"] <= 0.2  # the quota is the tighter limit
    admitted = api.submit("bob", sigma=None, epsilon=0.3)
    assert admitted.status_code == 202, admitted.text
    # The largest epsilon offered fits both limits: alice's job at it is admitted.
    again = api.submit("alice", sigma=None, epsilon=body["largest_epsilon"])
    assert again.status_code == 202, again.text
    assert key_reserved(api, alice) <= 0.2
    # (a job of eps 0.01 would fit: composed with alice's ~0.2 it adds ~0.0003, within the headroom's slack)
    assert api.submit("alice", sigma=None, epsilon=0.05).json()["limit"] == "quota"
    # A quota set below what the key holds is kept, with a warning that its next job is refused.
    lowered = put_quota(api, "cust", alice, 0.1).json()
    assert lowered["epsilon_remaining"] == 0.0 and "its next job will be refused" in lowered["warning"]
    assert put_quota(api, "cust", alice, 0.2).json()["warning"] is None  # back above what alice holds
    # Cancelling refunds the job's uncommitted rest, also against the quota.
    assert api.call("POST", f"/v1/jobs/{again.json()['id']}/cancel", "alice").status_code == 202
    assert key_reserved(api, alice) == 0.0
    assert api.submit("alice", sigma=None, epsilon=0.1).status_code == 202


def test_the_dataset_budget_still_refuses_first_and_the_409_says_so(api: Api) -> None:
    alice = named_analyst(api, "alice")
    assert put_quota(api, "cust", alice, 100.0).status_code == 200  # far above the dataset's budget (3)
    r = api.submit("alice", sigma=None, epsilon=2.8)
    assert r.status_code == 202
    refused = api.submit("alice", sigma=None, epsilon=2.8)  # two compose to ~3.27 (two of 2.5: 2.93)
    assert refused.status_code == 409
    body = refused.json()
    assert body["limit"] == "dataset" and body["detail"].startswith("dataset priv:")
    assert body["largest_epsilon"] < 2.5


def test_the_dry_run_reports_both_limits(api: Api) -> None:
    alice = named_analyst(api, "alice")
    plain = api.submit("alice", dry_run=True).json()
    assert plain["admissible"] is True and plain["limit"] is None and plain["quota_epsilon"] is None
    assert plain["quota_remaining"] is None and plain["quota_epsilon_after"] is None
    put_quota(api, "cust", alice, room_for(1))
    assert api.submit("alice").status_code == 202
    quote = api.submit("alice", dry_run=True).json()
    assert quote["admissible"] is False and quote["limit"] == "quota"
    assert quote["quota_epsilon"] == pytest.approx(room_for(1))
    assert quote["quota_epsilon_reserved"] == pytest.approx(jobs_epsilon(1), rel=1e-9)
    assert quote["quota_epsilon_after"] == pytest.approx(jobs_epsilon(2), rel=1e-9)
    assert quote["quota_remaining"] == pytest.approx(room_for(1) - jobs_epsilon(1), rel=1e-9)
    assert quote["epsilon_remaining"] > quote["quota_remaining"]  # the dataset alone would admit it
    assert quote["largest_epsilon"] < quote["epsilon_job"]
    fits = api.submit("alice", sigma=None, epsilon=quote["largest_epsilon"], dry_run=True).json()
    assert fits["admissible"] is True and fits["limit"] is None
    # Another analyst without a quota: the dataset alone.
    other = api.submit("analyst", dry_run=True).json()
    assert other["admissible"] is True and other["quota_epsilon"] is None


# ---- concurrency ----------------------------------------------------------------------------------------


def race(api: Api, senders: list[str]) -> list[int]:
    """One submission per entry of `senders` (the key's name in api.keys), all released at once."""
    body = {"dataset": "priv", "model": "blr", "iterations": ITERATIONS, "batch_size": BATCH, "sigma": SIGMA}
    start = threading.Barrier(len(senders))
    answers: list[Any] = []
    lock = threading.Lock()

    def send(who: str) -> None:
        start.wait()
        answer = api.client.post("/v1/jobs", json=body, headers={"Authorization": f"Bearer {api.keys[who]}"})
        with lock:
            answers.append(answer)

    threads = [threading.Thread(target=send, args=(who,)) for who in senders]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for answer in answers:  # asserted here: an assertion in a sender thread would only be printed
        assert answer.status_code in (202, 409), answer.text
        if answer.status_code == 409:
            assert answer.json()["limit"] in ("dataset", "quota", "storage"), answer.text
    return [answer.status_code for answer in answers]


def admitted(api: Api, key_id: str) -> int:
    with api.engine.connect() as conn:
        return len(conn.execute(select(jobs.c.id).where(jobs.c.owner == key_id)).all())


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_30_simultaneous_submissions_by_one_key_never_overspend_its_quota(tmp_path: Path, kind: str) -> None:
    with fresh_database(kind, tmp_path, "control") as url:
        for api in make_api(url, tmp_path, **ROOMY):
            alice = named_analyst(api, "alice")
            ledger_db.set_budget(api.engine, "priv", room_for(12), DELTA)  # the quota is the tighter limit
            assert put_quota(api, "cust", alice, room_for(7)).status_code == 200
            codes = race(api, ["alice"] * 30)
            assert codes.count(202) == 7 and codes.count(409) == 23, codes
            assert admitted(api, alice) == 7
            assert key_reserved(api, alice) <= room_for(7)
            assert ledger_db.budget_status(api.engine, "priv").epsilon_reserved <= room_for(7)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_30_simultaneous_submissions_by_two_keys_overspend_neither_quota_nor_dataset(
    tmp_path: Path, kind: str
) -> None:
    with fresh_database(kind, tmp_path, "control") as url:
        for api in make_api(url, tmp_path, **ROOMY):
            alice, bob = named_analyst(api, "alice"), named_analyst(api, "bob", who="bob")
            ledger_db.set_budget(api.engine, "priv", room_for(12), DELTA)
            for key_id in (alice, bob):
                assert put_quota(api, "cust", key_id, room_for(8)).status_code == 200
            codes = race(api, ["alice", "bob"] * 15)
            assert codes.count(202) == 12, codes  # the dataset is the tighter limit overall
            mine, theirs = admitted(api, alice), admitted(api, bob)
            assert mine + theirs == 12 and mine <= 8 and theirs <= 8
            assert key_reserved(api, alice) <= room_for(8) and key_reserved(api, bob) <= room_for(8)
            assert ledger_db.budget_status(api.engine, "priv").epsilon_reserved <= room_for(12)


# ---- the routes' role matrix ----------------------------------------------------------------------------


def test_only_the_datasets_custodian_and_admins_manage_quotas(api: Api) -> None:
    alice = named_analyst(api, "alice")
    path = f"/v1/datasets/priv/quotas/{alice}"
    assert put_quota(api, "cust", alice, 0.5).json()["epsilon"] == 0.5
    assert put_quota(api, "admin", alice, 0.4).json()["epsilon"] == 0.4  # a change, not a second row
    for who, code in (("analyst", 403), ("alice", 403), ("client", 403), ("cust2", 404)):
        assert put_quota(api, who, alice, 9.0).status_code == code, who
        assert api.call("DELETE", path, who).status_code == code, who
        assert api.call("GET", "/v1/datasets/priv/quotas", who).status_code == code, who
    assert api.call("GET", "/v1/datasets/priv/quotas").status_code == 401
    listed = api.call("GET", "/v1/datasets/priv/quotas", "cust").json()
    assert [(q["key_id"], q["key_name"], q["epsilon"]) for q in listed] == [(alice, "alice", 0.4)]
    assert api.call("GET", "/v1/datasets/other/quotas", "cust2").json() == []
    # The analyst sees its own quota in its row of the ledger by key, and nobody else's.
    (own,) = api.call("GET", "/v1/datasets/priv/ledger/keys", "alice").json()["keys"]
    assert own["quota_epsilon"] == 0.4
    assert api.call("DELETE", path, "cust").status_code == 204
    assert api.call("DELETE", path, "cust").status_code == 204  # already gone: still 204
    assert api.call("GET", "/v1/datasets/priv/quotas", "admin").json() == []


@pytest.mark.parametrize("epsilon", ["0", "-1", '"0.2"', "null", "true", "1e400", "NaN"])
def test_a_bad_quota_is_a_422_naming_epsilon(api: Api, epsilon: str) -> None:
    alice = named_analyst(api, "alice")
    headers = {"Authorization": f"Bearer {api.keys['cust']}", "Content-Type": "application/json"}
    r = api.client.put(
        f"/v1/datasets/priv/quotas/{alice}", content=f'{{"epsilon": {epsilon}}}', headers=headers
    )
    assert r.status_code == 422, r.text
    assert ["body", "epsilon"] in [e["loc"] for e in r.json()["detail"]]


def test_a_quota_is_only_for_an_analyst_key_that_may_submit_to_the_dataset(api: Api) -> None:
    r = api.call("POST", "/v1/keys", "admin", json={"role": "analyst", "dataset": "other"})
    elsewhere = r.json()["id"]
    for key_id in (api.ids["client"], api.ids["cust"], elsewhere, "0123456789abcdef"):
        r = put_quota(api, "cust", key_id, 0.5)
        assert r.status_code == 404 and "no analyst key" in r.json()["detail"], key_id
    assert put_quota(api, "cust", "not-a-key-id!", 0.5).status_code == 422
    assert put_quota(api, "cust", api.ids["analyst"], 0.5, dataset="nope").status_code == 404


# ---- the CLI ---------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_vips_budget_quota_sets_lists_and_clears(
    api: Api, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    alice = named_analyst(api, "alice")
    use(api, monkeypatch, "cust")
    assert main(["budget", "quota", "priv", "--key", alice, "--epsilon", "0.2"]) == 0
    out = capsys.readouterr()
    (quota,) = lines(out.out)
    assert (quota["key_id"], quota["key_name"], quota["epsilon"]) == (alice, "alice", 0.2)
    assert "warning" not in out.err
    assert main(["budget", "quota", "priv"]) == 0
    assert [q["key_id"] for q in lines(capsys.readouterr().out)] == [alice]
    assert main(["ledger", "priv", "--by-key"]) == 0
    capsys.readouterr()
    use(api, monkeypatch, "alice")
    assert main(["fit", "--dataset", "priv", "--model", "blr", "--iterations", "5", "--epsilon", "0.3"]) == 1
    assert f"409: key {alice}'s quota on dataset priv" in capsys.readouterr().err
    assert main(["budget", "quota", "priv", "--key", alice, "--clear"]) == 1  # an analyst may not
    assert "403" in capsys.readouterr().err
    use(api, monkeypatch, "cust")
    assert main(["budget", "quota", "priv", "--key", alice, "--clear"]) == 0
    assert lines(capsys.readouterr().out) == [{"dataset": "priv", "key_id": alice, "epsilon": None}]
    assert main(["budget", "quota", "priv"]) == 0
    assert capsys.readouterr().out == ""
    usage = [
        ["budget", "quota", "priv", "--key", alice],
        ["budget", "quota", "priv", "--epsilon", "0.2"],
        ["budget", "quota", "priv", "--key", alice, "--epsilon", "0.2", "--clear"],
        ["budget", "quota", "priv", "--key", f"vips_{alice}_secret", "--epsilon", "0.2"],
        ["budget", "quota", "priv", "--key", alice, "--epsilon", "0"],
    ]
    for argv in usage:
        assert main(argv) == 2, argv
        assert capsys.readouterr().err.startswith("vips: error:"), argv


# ---- migration 0009 --------------------------------------------------------------------------------------


def test_migration_0009_creates_and_drops_the_quota_table(tmp_path: Path) -> None:
    from alembic import command

    from privacy_wall.ledger.schema import metadata

    url = f"sqlite:///{tmp_path / 'control.db'}"
    config = alembic_config("control", url)
    command.upgrade(config, "0008")
    engine = create_db_engine(url)
    try:
        assert "key_quotas" not in inspect(engine).get_table_names()
        command.upgrade(config, "0009")
        engine.dispose()
        assert schema_drift(engine, metadata, "key_quotas") == []
        columns = {c["name"]: c for c in inspect(engine).get_columns("key_quotas")}
        assert set(columns) == {"dataset", "key_id", "epsilon", "updated_at"}
        assert not any(c["nullable"] for c in columns.values())
        assert inspect(engine).get_pk_constraint("key_quotas")["constrained_columns"] == ["dataset", "key_id"]
        # The foreign keys hold: a quota needs its dataset and its key.
        with engine.begin() as conn, pytest.raises(IntegrityError, match="FOREIGN KEY"):
            conn.execute(
                insert(key_quotas).values(dataset="d", key_id="k", epsilon=1.0, updated_at=datetime.now(UTC))
            )
        command.downgrade(config, "0008")
        engine.dispose()
        assert "key_quotas" not in inspect(engine).get_table_names()
        command.upgrade(config, "head")
        engine.dispose()
        with engine.connect() as conn:
            assert conn.execute(select(key_quotas)).all() == []
    finally:
        engine.dispose()
