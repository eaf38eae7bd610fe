"""Key names (issue 23, item 1): `vips admin create-key --name`, `POST /v1/keys` `name`, shown by
`list-keys` and `GET /v1/keys`, on every job (`JobPublic.key_name`, `vips jobs`, `vips job`), in the
ledger's per-job summary (`vips ledger`), on the dashboard (escaped), and migration 0008 keeping the keys
made before it without a name."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import insert, inspect, select, text

from control.store.keys import InvalidKeyRequest, create_key, key_names, list_keys
from control.store.models import api_keys
from privacy_wall.sqlengine import create_db_engine
from tests.dbservers import fresh_database, migrate, schema_drift
from tests.test_api import Api, make_api
from tests.test_cli_verbs import FIT, lines, use
from tests.test_ui import finished_job, sign_in
from vips.cli import main
from vips.migrate import alembic_config, upgrade

#: Names that are refused: empty, too long, control and other category C characters, outer whitespace.
BAD_NAMES = ["", "x" * 65, "ali\nce", "tab\there", "bell\x07", "nul\x00", "zw\u200bsp", " alice", "alice "]
#: Names that are taken as given: printable, inner spaces, any script, exactly 64 characters.
GOOD_NAMES = ["alice", "Alice Martin (stats team)", "é漢字 ✓", "x" * 64, "<b>&amp;</b>"]


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    with fresh_database("sqlite", tmp_path, "control") as url:
        yield from make_api(url, tmp_path)


def named_analyst(api: Api, name: str, who: str = "alice") -> str:
    """A new analyst key on every dataset named `name`, made by the admin over HTTP, as api.keys[who]."""
    r = api.call("POST", "/v1/keys", "admin", json={"role": "analyst", "all_datasets": True, "name": name})
    assert r.status_code == 201, r.text
    api.keys[who], api.ids[who] = r.json()["key"], r.json()["id"]
    return str(r.json()["id"])


# ---- the rule and the store ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", BAD_NAMES)
def test_create_key_refuses_a_name_that_is_not_printable(tmp_path: Path, name: str) -> None:
    url = f"sqlite:///{tmp_path / 'control.db'}"
    migrate("control", url)
    engine = create_db_engine(url)
    try:
        with pytest.raises(InvalidKeyRequest) as caught:
            create_key(engine, "admin", name=name)
        assert caught.value.field == "name"
        assert list_keys(engine) == []
    finally:
        engine.dispose()


def test_names_are_optional_not_unique_and_stored_as_given(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'control.db'}"
    migrate("control", url)
    engine = create_db_engine(url)
    try:
        ids = [create_key(engine, "admin", name=name)[0] for name in GOOD_NAMES]
        twin, _ = create_key(engine, "analyst", "d", name="alice")
        unnamed, _ = create_key(engine, "admin")
        names = key_names(engine, [*ids, twin, unnamed, "0123456789abcdef"])
        assert [names[key_id] for key_id in ids] == GOOD_NAMES
        assert names[twin] == "alice" and names[unnamed] is None
        assert "0123456789abcdef" not in names
        assert {k["id"]: k["name"] for k in list_keys(engine)}[twin] == "alice"
    finally:
        engine.dispose()


# ---- over HTTP ------------------------------------------------------------------------------------------


def test_post_keys_takes_a_name_and_get_keys_shows_it(api: Api) -> None:
    r = api.call("POST", "/v1/keys", "admin", json={"role": "analyst", "dataset": "priv", "name": "alice"})
    assert r.status_code == 201, r.text
    named = r.json()
    assert named["name"] == "alice"
    r = api.call("POST", "/v1/keys", "admin", json={"role": "analyst", "dataset": "priv", "name": "alice"})
    assert r.status_code == 201 and r.json()["name"] == "alice"  # names are not unique
    twin = r.json()["id"]
    r = api.call("POST", "/v1/keys", "admin", json={"role": "client", "dataset": "priv"})
    assert r.status_code == 201 and r.json()["name"] is None
    unnamed = r.json()["id"]
    listed = {k["id"]: k for k in api.call("GET", "/v1/keys", "admin").json()}
    assert listed[named["id"]]["name"] == listed[twin]["name"] == "alice"
    assert listed[unnamed]["name"] is None
    assert all(listed[key_id]["name"] is None for key_id in api.ids.values())  # the fixture's keys
    r = api.call("DELETE", f"/v1/keys/{named['id']}", "admin")
    assert r.status_code == 200 and r.json()["name"] == "alice"


@pytest.mark.parametrize("name", [*BAD_NAMES, 7, ["alice"]])
def test_post_keys_refuses_a_bad_name_with_a_422_naming_the_field(api: Api, name: object) -> None:
    before = len(api.call("GET", "/v1/keys", "admin").json())
    r = api.call("POST", "/v1/keys", "admin", json={"role": "admin", "name": name})
    assert r.status_code == 422, r.text
    assert ["body", "name"] in [e["loc"] for e in r.json()["detail"]]
    assert len(api.call("GET", "/v1/keys", "admin").json()) == before


def test_every_job_carries_the_name_of_its_key_for_whoever_reads_it(api: Api) -> None:
    named_analyst(api, "alice")
    mine = api.submit("alice").json()
    assert mine["key_name"] == "alice"
    theirs = api.submit("analyst").json()  # a key made without a name
    assert theirs["key_name"] is None
    for who in ("alice", "cust", "admin", "client"):  # each may read alice's job
        assert api.call("GET", f"/v1/jobs/{mine['id']}", who).json()["key_name"] == "alice", who
    listed = {job["id"]: job["key_name"] for job in api.call("GET", "/v1/jobs", "admin").json()}
    assert listed == {mine["id"]: "alice", theirs["id"]: None}
    assert [j["key_name"] for j in api.call("GET", "/v1/jobs", "alice").json()] == ["alice"]
    r = api.call("POST", f"/v1/jobs/{mine['id']}/cancel", "alice")
    assert r.status_code == 202 and r.json()["key_name"] == "alice"
    assert api.call("GET", f"/v1/jobs/{mine['id']}", "client_other").status_code == 404  # not its dataset


def test_the_ledger_summary_names_the_key_of_each_job(api: Api) -> None:
    named_analyst(api, "alice")
    mine = finished_job_of(api, "alice")
    theirs = api.submit("analyst").json()["id"]
    r = api.call("GET", "/v1/datasets/priv/ledger/jobs", "cust")
    assert r.status_code == 200, r.text
    summary = {job["job_id"]: job for job in r.json()["jobs"]}
    assert summary[mine]["key_name"] == "alice" and summary[mine]["iterations_charged"] == 3
    assert summary[theirs]["key_name"] is None
    assert api.call("GET", "/v1/datasets/priv/ledger/jobs", "alice").status_code == 403


def finished_job_of(api: Api, who: str) -> str:
    """test_ui.finished_job submitted by `who` (it submits as "analyst": swap the keys around it)."""
    analyst = api.keys["analyst"]
    api.keys["analyst"] = api.keys[who]
    try:
        return finished_job(api)
    finally:
        api.keys["analyst"] = analyst


# ---- the CLI ---------------------------------------------------------------------------------------------


def test_admin_create_key_takes_a_name_and_list_keys_shows_it(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VIPS_HOME", str(tmp_path / "home"))
    for variable in ("VIPS_CONTROL_DATABASE_URL", "VIPS_SENSITIVE_DATABASE_URL"):
        monkeypatch.delenv(variable, raising=False)
    assert main(["migrate", "all"]) == 0
    capsys.readouterr()
    argv = ["admin", "create-key", "--role", "analyst", "--dataset", "d"]
    assert main([*argv, "--name", "alice smith"]) == 0
    out = capsys.readouterr()
    named = out.out.strip().split("_")[1]
    assert "named 'alice smith'" in out.err
    assert main(argv) == 0
    unnamed = capsys.readouterr().out.strip().split("_")[1]
    for bad in BAD_NAMES:
        assert main([*argv, "--name", bad]) == 2, bad
        err = capsys.readouterr().err
        assert err.startswith("vips: error: argument --name: a key name"), err
    assert main(["admin", "list-keys"]) == 0
    listed = {k["id"]: k for k in map(json.loads, capsys.readouterr().out.splitlines())}
    assert set(listed) == {named, unnamed}  # the refused ones made no key
    assert listed[named]["name"] == "alice smith" and listed[unnamed]["name"] is None


def test_jobs_job_and_ledger_verbs_show_the_key_name(
    api: Api, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    named_analyst(api, "alice")
    use(api, monkeypatch, "alice")
    assert main([*FIT, "--sigma", "2"]) == 0
    job_id = capsys.readouterr().out.strip()
    assert main(["jobs"]) == 0
    assert [(j["id"], j["key_name"]) for j in lines(capsys.readouterr().out)] == [(job_id, "alice")]
    assert main(["job", job_id[:8]]) == 0
    assert lines(capsys.readouterr().out)[0]["key_name"] == "alice"
    use(api, monkeypatch, "cust")
    assert main(["ledger", "priv"]) == 0
    (summary,) = lines(capsys.readouterr().out)
    assert [(j["job_id"], j["key_name"]) for j in summary["jobs"]] == [(job_id, "alice")]  # type: ignore[index]


# ---- the dashboard ---------------------------------------------------------------------------------------


def test_the_dashboard_shows_the_key_name_escaped(api: Api) -> None:
    hostile = '<script>alert("x")</script> & co'
    escaped = "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt; &amp; co"
    named_analyst(api, hostile)
    job_id = finished_job_of(api, "alice")
    unnamed = finished_job(api)
    pages = [("cust", "/ui/datasets/priv"), ("admin", "/ui/datasets/priv")]
    pages += [("cust", f"/ui/jobs/{job_id}"), ("alice", f"/ui/jobs/{job_id}")]
    for who, path in pages:
        sign_in(api, who)
        page = api.client.get(path)
        assert page.status_code == 200, (who, path)
        assert escaped in page.text and "<script>" not in page.text, (who, path)
        assert api.ids["alice"] in page.text  # the key id stays next to its name
    sign_in(api, "cust")
    page = api.client.get(f"/ui/jobs/{unnamed}").text
    assert f"submitted by key <code>{api.ids['analyst']}</code>." in page


# ---- migration 0008 --------------------------------------------------------------------------------------


def test_migration_0008_adds_the_name_and_keeps_old_keys_without_one(tmp_path: Path) -> None:
    from alembic import command

    url = f"sqlite:///{tmp_path / 'control.db'}"
    config = alembic_config("control", url)
    command.upgrade(config, "0007")
    engine = create_db_engine(url)
    try:
        columns = {c["name"] for c in inspect(engine).get_columns("api_keys")}
        assert "name" not in columns
        with engine.begin() as conn:  # a key as 0007's code stored it
            conn.execute(
                text(
                    "INSERT INTO api_keys (id, key_hash, role, dataset, created_at, revoked, expires_at) "
                    "VALUES ('0123456789abcdef', :hash, 'analyst', 'd', :now, 0, NULL)"
                ),
                {"hash": "a" * 64, "now": datetime.now(UTC)},
            )
        command.upgrade(config, "0008")
        engine.dispose()
        column = {c["name"]: c for c in inspect(engine).get_columns("api_keys")}["name"]
        assert column["nullable"] and getattr(column["type"], "length", None) == 64
        (old,) = list_keys(engine)
        assert (old["id"], old["role"], old["dataset"], old["name"]) == (
            "0123456789abcdef",
            "analyst",
            "d",
            None,
        )
        with engine.begin() as conn:
            conn.execute(
                insert(api_keys).values(
                    id="fedcba9876543210", key_hash="b" * 64, role="admin", created_at=datetime.now(UTC),
                    revoked=False, name="bob",
                )
            )  # fmt: skip
            # A job of the old key: on SQLite a downgrade that recreated api_keys would fail on it.
            conn.execute(
                text(
                    "INSERT INTO datasets (name, kind, population, dimension, schema, public, created_at) "
                    "VALUES ('d', 'tabular', 10, 3, '{}', 0, :now)"
                ),
                {"now": datetime.now(UTC)},
            )
            conn.execute(
                text(
                    "INSERT INTO jobs (id, dataset, owner, model, algorithm, options, iterations, "
                    "batch_size, sigma, delta, status, iteration, cancel_requested, created_at) "
                    "VALUES ('j', 'd', '0123456789abcdef', 'blr', 'vips', '{}', 1, 1, 1.0, 1e-5, 'queued', "
                    "0, 0, :now)"
                ),
                {"now": datetime.now(UTC)},
            )
        command.downgrade(config, "0007")
        engine.dispose()
        assert "name" not in {c["name"] for c in inspect(engine).get_columns("api_keys")}
        with engine.connect() as conn:
            assert set(conn.execute(select(text("id")).select_from(text("api_keys"))).scalars()) == {
                "0123456789abcdef",
                "fedcba9876543210",
            }
    finally:
        engine.dispose()


def test_the_migrated_api_keys_table_matches_the_model(tmp_path: Path) -> None:
    """Alembic's comparison of the migrated database with control.store.models finds nothing to do on
    api_keys."""
    from control.store.models import metadata

    url = f"sqlite:///{tmp_path / 'control.db'}"
    upgrade("control", url)
    engine = create_db_engine(url)
    try:
        assert schema_drift(engine, metadata, "api_keys") == []
    finally:
        engine.dispose()
