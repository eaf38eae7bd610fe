"""What an attack on the running service found over HTTP (issue 21, item 6), each through the app in
process: cursors are ASCII digits or a 422 naming them; every path parameter is bounded before any query
(API and dashboard); custodians cancel the jobs on their datasets; and one Idempotency-Key sent by many
concurrent submissions under a budget that fits one job is one job, replayed to every other sender.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, event, func, select, update

from control.store.models import jobs
from privacy_wall.ledger import database as ledger_db
from privacy_wall.ledger.schema import reservations
from tests.dbservers import fresh_database
from tests.test_api import BATCH, DELTA, SIGMA, Api, job_count, make_api, open_reservations, reserved
from tests.test_ui import csrf, sign_in


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    with fresh_database("sqlite", tmp_path, "control") as url:
        yield from make_api(url, tmp_path)


@contextmanager
def statements(engine: Engine) -> Iterator[list[str]]:
    """Every statement the app's engine sends meanwhile, with its parameters, as text."""
    sent: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        sent.append(f"{statement} {parameters!r}")

    event.listen(engine, "before_cursor_execute", record)
    try:
        yield sent
    finally:
        event.remove(engine, "before_cursor_execute", record)


def app_engine(api: Api) -> Engine:
    engine: Engine = api.client.app.state.engine  # type: ignore[attr-defined]
    return engine


# ---- 1. ledger cursors: ASCII digits, bounded ----------------------------------------------------------

#: Not cursors: other digits (they pass str.isdigit), signs, spaces, '_', and ids no integer column holds.
BAD_CURSORS = [
    "²",
    "①",
    "٣",
    "１",
    "1_0",
    " 1",
    "1 ",
    "+1",
    "-1",
    "0x1",
    "1e3",
    "",
    "abc",
    str(2**31),
    "9" * 18,
]


def check_cursors(api: Api, bad: list[str]) -> None:
    for cursor in bad:
        r = api.call("GET", "/v1/datasets/priv/ledger", "cust", params={"cursor": cursor})
        assert r.status_code == 422, (cursor, r.text)
        (error,) = r.json()["detail"]
        assert error["loc"] == ["query", "cursor"]
        assert "next_cursor" in error["msg"]
    for good in ("0", "00", str(2**31 - 1)):
        r = api.call("GET", "/v1/datasets/priv/ledger", "cust", params={"cursor": good})
        assert r.status_code == 200, r.text
        assert r.json()["entries"] == []


@pytest.mark.parametrize("cursor", BAD_CURSORS)
def test_a_cursor_that_is_not_ascii_digits_is_a_422_naming_it(api: Api, cursor: str) -> None:
    check_cursors(api, [cursor])


@pytest.mark.postgres
def test_cursors_on_postgresql(tmp_path: Path) -> None:
    """PostgreSQL refuses a parameter its integer column cannot hold: such a cursor never reaches it."""
    with fresh_database("postgresql", tmp_path, "control") as url:
        for api in make_api(url, tmp_path):
            check_cursors(api, BAD_CURSORS)


# ---- 2. path parameters: bounded before any query -------------------------------------------------------

LONG = "z" * 50_001


@pytest.mark.parametrize(
    ("method", "path", "loc"),
    [
        ("GET", "/v1/jobs/{}", "job_id"),
        ("POST", "/v1/jobs/{}/cancel", "job_id"),
        ("GET", "/v1/jobs/{}/releases", "job_id"),
        ("GET", "/v1/jobs/{}/posterior", "job_id"),
        ("GET", "/v1/datasets/{}", "name"),
        ("PUT", "/v1/datasets/{}/budget", "name"),
        ("GET", "/v1/datasets/{}/ledger", "name"),
        ("GET", "/v1/datasets/{}/ledger/jobs", "name"),
        ("DELETE", "/v1/keys/{}", "key_id"),
    ],
)
@pytest.mark.parametrize("value", [LONG, "f" * 129, "a b"])
def test_every_api_path_parameter_is_bounded_before_any_query(
    api: Api, method: str, path: str, loc: str, value: str
) -> None:
    body = {"epsilon": 1.0, "delta": DELTA} if method == "PUT" else None
    with statements(app_engine(api)) as sent:
        r = api.call(method, path.format(value), "admin", json=body)
    assert r.status_code == 422, r.text
    assert ["path", loc] in [e["loc"] for e in r.json()["detail"]]
    assert len(r.content) < 2_000  # an excerpt of the value at most
    assert not [s for s in sent if value in s]  # only the key was looked up
    assert api.call("GET", "/v1/datasets", "analyst").status_code == 200


def test_a_key_id_longer_than_its_column_is_422(api: Api) -> None:
    r = api.call("DELETE", "/v1/keys/" + "f" * 33, "admin")
    assert r.status_code == 422 and ["path", "key_id"] in [e["loc"] for e in r.json()["detail"]]
    assert api.call("DELETE", "/v1/keys/0123456789abcdef", "admin").status_code == 404


@pytest.mark.parametrize(
    ("path", "words"),
    [
        ("/ui/jobs/{}", "no such job"),
        ("/ui/jobs/{}/convergence.svg", "no such job"),
        ("/ui/jobs/{}/posterior.svg", "no such job"),
        ("/ui/jobs/{}/posterior.json", "no such job"),
        ("/ui/datasets/{}", "no such dataset"),
        ("/ui/datasets/{}/epsilon.svg", "no such dataset"),
    ],
)
@pytest.mark.parametrize("value", [LONG, "just-too-long", "a b", "a%00b"])
def test_every_dashboard_path_is_bounded_before_any_query(
    api: Api, path: str, words: str, value: str
) -> None:
    if value == "just-too-long":  # one character more than a job id or a dataset name may have
        value = "f" * (65 if "/jobs/" in path else 129)
    sign_in(api, "admin")
    with statements(app_engine(api)) as sent:
        r = api.client.get(path.format(value))
    assert r.status_code == 404, r.text[:500]
    assert words in r.text and "<html" in r.text.lower()
    assert value not in r.text
    assert not [s for s in sent if value in s]  # only the session was looked up


def test_the_budget_form_of_an_unbounded_name_is_404_before_any_query(api: Api) -> None:
    sign_in(api, "cust")
    token = csrf(api, "/ui/datasets/priv")
    with statements(app_engine(api)) as sent:
        r = api.client.post(
            f"/ui/datasets/{LONG}/budget", data={"epsilon": "4", "delta": "1e-5", "csrf_token": token}
        )
    assert r.status_code == 404 and "no such dataset" in r.text and LONG not in r.text
    assert not [s for s in sent if LONG in s]


@pytest.mark.parametrize("epsilon", ["４", "1_0", "infinity", "0x10", "²"])
def test_the_budget_form_takes_ascii_decimal_numbers_only(api: Api, epsilon: str) -> None:
    sign_in(api, "cust")
    token = csrf(api, "/ui/datasets/priv")
    form = "/ui/datasets/priv/budget"
    r = api.client.post(form, data={"epsilon": epsilon, "delta": "1e-5", "csrf_token": token})
    assert r.status_code == 422 and f"epsilon: {epsilon} is not a number" in r.text, r.text
    r = api.client.post(form, data={"epsilon": " 4.5 ", "delta": "1E-5", "csrf_token": token})
    assert r.status_code == 200 and ledger_db.budget_status(api.engine, "priv").epsilon_budget == 4.5


# ---- 3. custodians cancel the jobs on their datasets -------------------------------------------------


def test_a_custodian_cancels_any_job_on_its_datasets_and_no_other(api: Api) -> None:
    mine = api.submit(dataset="priv").json()["id"]  # cust owns priv
    theirs = api.submit(dataset="other").json()["id"]  # cust2's key is scoped to other
    # refused: another custodian's job, another analyst's job, any client
    r = api.call("POST", f"/v1/jobs/{theirs}/cancel", "cust")
    assert r.status_code == 404 and r.json()["detail"] == f"job {theirs} not found"
    assert api.call("POST", f"/v1/jobs/{mine}/cancel", "cust2").status_code == 404
    assert api.call("POST", f"/v1/jobs/{mine}/cancel", "analyst2").status_code == 404
    for client in ("client", "client_other"):
        r = api.call("POST", f"/v1/jobs/{theirs}/cancel", client)
        assert r.status_code == 403 and "role" in r.json()["detail"]
    for job_id in (mine, theirs):
        assert api.call("GET", f"/v1/jobs/{job_id}", "admin").json()["status"] == "queued"
    assert reserved(api.engine, "priv") > 0
    # allowed: the custodian of the job's dataset, by owner or by its key's scope (and by a prefix)
    r = api.call("POST", f"/v1/jobs/{mine[:8]}/cancel", "cust")
    assert r.status_code == 202, r.text
    assert (r.json()["id"], r.json()["status"]) == (mine, "cancelled")
    assert reserved(api.engine, "priv") == 0.0  # a queued job's reservation is refunded
    assert api.call("POST", f"/v1/jobs/{theirs}/cancel", "cust2").json()["status"] == "cancelled"
    # a running job is asked to stop; a finished one is a 409, as for its analyst
    running = api.submit(dataset="priv").json()["id"]
    with api.engine.begin() as conn:
        conn.execute(
            update(jobs).where(jobs.c.id == running).values(status="running", started_at=datetime.now(UTC))
        )
    job = api.call("POST", f"/v1/jobs/{running}/cancel", "cust").json()
    assert (job["status"], job["cancel_requested"]) == ("running", True)
    with api.engine.begin() as conn:
        conn.execute(update(jobs).where(jobs.c.id == running).values(status="succeeded"))
    assert api.call("POST", f"/v1/jobs/{running}/cancel", "cust").status_code == 409
    # analysts still cancel their own jobs only
    own = api.submit(dataset="priv").json()["id"]
    assert api.call("POST", f"/v1/jobs/{own}/cancel", "analyst2").status_code == 404
    assert api.call("POST", f"/v1/jobs/{own}/cancel", "analyst").json()["status"] == "cancelled"


# ---- 4. one Idempotency-Key, many concurrent submissions, room for one job ---------------------------


def race_one_key(api: Api, senders: int) -> list[Any]:
    body = {"dataset": "priv", "model": "blr", "iterations": 5, "batch_size": BATCH, "sigma": SIGMA}
    headers = {"Authorization": f"Bearer {api.keys['analyst']}", "Idempotency-Key": "one-job"}
    start = threading.Barrier(senders)
    answers: list[Any] = []
    lock = threading.Lock()

    def send() -> None:
        start.wait()
        answer = api.client.post("/v1/jobs", json=body, headers=headers)
        with lock:
            answers.append(answer)

    threads = [threading.Thread(target=send) for _ in range(senders)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return answers


def room_for_one_job(api: Api) -> None:
    quote = api.submit(dry_run=True).json()
    ledger_db.set_budget(api.engine, "priv", quote["epsilon_job"] * 1.01, DELTA)
    after = api.submit(dry_run=True).json()
    assert after["admissible"] is True
    assert after["largest_epsilon"] < quote["epsilon_job"] * 1.01 + 1e-9


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_concurrent_submissions_with_one_key_replay_the_one_job(tmp_path: Path, kind: str) -> None:
    # Four pricing requests and no refill: two quotes, the one submission that prices, one refused new
    # job. The 19 racing repeats wait for the first and replay it without pricing (none is a 429).
    with fresh_database(kind, tmp_path, "control") as url:
        for api in make_api(url, tmp_path, pricing_burst_per_key=4, pricing_rate_per_key=1e-6):
            room_for_one_job(api)
            answers = race_one_key(api, 20)
            refused = [a.text for a in answers if a.status_code != 202]
            assert not refused, refused
            ids = {a.json()["id"] for a in answers}
            assert len(ids) == 1
            (job_id,) = ids
            replayed = [a.headers.get("Idempotent-Replayed") for a in answers]
            assert replayed.count("true") == 19 and replayed.count(None) == 1, replayed
            assert job_count(api.engine) == 1 and api.queue.sent == [job_id]
            with api.engine.connect() as conn:  # the losers never held a reservation
                assert conn.execute(select(func.count()).select_from(reservations)).scalar_one() == 1
            assert open_reservations(api.engine) == 1
            # the budget had room for that job only: a new key is refused, the old one still replays
            assert api.submit().status_code == 409
            again = race_one_key(api, 3)
            assert {(a.status_code, a.json()["id"], a.headers.get("Idempotent-Replayed")) for a in again} == {
                (202, job_id, "true")
            }
