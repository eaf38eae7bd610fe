"""Nothing stays reserved and nothing is charged unseen (issue 11, points 1-2): the reaper without any
worker, database outages at task start and mid-job (retried, never acked away), and Idempotency-Key."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from collections.abc import Set as AbstractSet
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Connection, Engine, func, select, update
from sqlalchemy.exc import DBAPIError, OperationalError

from control.jobs import reaper
from control.jobs.end import end_job
from control.jobs.queue import RecordingQueue
from control.jobs.reaper import MAX_RESUMES, reap
from control.settings import ServiceSettings
from control.store.models import jobs, releases
from privacy_wall.ledger import database as ledger_db
from privacy_wall.ledger.schema import budgets, charges, reservations
from privacy_wall.sqlengine import create_db_engine
from service.app import create_app
from tests import test_jobs
from tests.dbservers import fresh_database
from tests.test_api import Api, populate
from tests.test_jobs import job_row, on_gate_call, submit
from worker import jobs as job_runner
from worker.stored_releases import StoredReleases
from worker.tasks import retry_delay

engines = test_jobs.engines  # the fixture: real control and sensitive databases with dataset "t"


def open_reservations(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).where(reservations.c.open.is_(True))).scalar_one())


def count(engine: Engine, table: Any, job_id: str) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).where(table.c.job_id == job_id)).scalar_one())


# --- the reaper ------------------------------------------------------------------------------------------


def test_a_queued_job_no_worker_started_is_failed_and_refunded(engines: tuple[Engine, Engine]) -> None:
    control, _ = engines
    old, young = submit(control), submit(control)
    with control.begin() as conn:
        conn.execute(
            update(jobs).where(jobs.c.id == old).values(created_at=datetime.now(UTC) - timedelta(seconds=600))
        )
    assert reap(control, heartbeat_timeout=60, queued_timeout=300) == [old]
    row = job_row(control, old)
    assert row.status == "failed" and "no worker started this job within 300 s" in row.error
    assert job_row(control, young).status == "queued"
    assert open_reservations(control) == 1  # the young job's
    assert ledger_db.budget_status(control, "t").epsilon_spent == 0.0


@pytest.mark.parametrize(("held", "reaped"), [(True, False), (None, False), (False, True)])
def test_a_queued_job_is_reaped_only_when_the_broker_lost_its_task(
    engines: tuple[Engine, Engine], held: bool | None, reaped: bool
) -> None:
    """Past the queued timeout a job waiting behind a backlog (its task still in the broker) stays queued,
    as it does when the broker cannot be read; only a task the broker no longer holds is failed."""
    control, _ = engines
    job_id = submit(control)
    long_ago = datetime.now(UTC) - timedelta(seconds=600)
    with control.begin() as conn:
        conn.execute(update(jobs).where(jobs.c.id == job_id).values(created_at=long_ago))
    asked: list[set[str]] = []

    def holds(asked_ids: AbstractSet[str]) -> set[str] | None:
        asked.append(set(asked_ids))
        return None if held is None else set(asked_ids) if held else set()

    assert reap(control, heartbeat_timeout=60, queued_timeout=300, holds=holds) == (
        [job_id] if reaped else []
    )
    assert asked == [{job_id}]
    assert job_row(control, job_id).status == ("failed" if reaped else "queued")
    assert open_reservations(control) == (0 if reaped else 1)


def test_the_reaper_reads_the_broker_once_per_pass(engines: tuple[Engine, Engine]) -> None:
    """Reading the broker takes its whole queue, so a pass asks once for all its quiet queued jobs (not the
    young one); it fails the one whose task is gone and keeps the one whose task is still held."""
    control, _ = engines
    held, lost, young = submit(control), submit(control), submit(control)
    long_ago = datetime.now(UTC) - timedelta(seconds=600)
    with control.begin() as conn:
        conn.execute(update(jobs).where(jobs.c.id.in_([held, lost])).values(created_at=long_ago))
    asked: list[set[str]] = []

    def holds(asked_ids: AbstractSet[str]) -> set[str] | None:
        asked.append(set(asked_ids))
        return {held}

    assert reap(control, heartbeat_timeout=60, queued_timeout=300, holds=holds) == [lost]
    assert asked == [{held, lost}]
    assert [job_row(control, job).status for job in (held, lost, young)] == ["queued", "failed", "queued"]
    assert open_reservations(control) == 2


def test_a_job_a_worker_deferred_recently_is_not_reaped(engines: tuple[Engine, Engine]) -> None:
    """A worker that defers a job (its key at the running limit) vouches for it with heartbeat_at: the
    job's task is held by that worker, not by the broker, and the job is not lost."""
    control, _ = engines
    job_id = submit(control)
    with control.begin() as conn:
        conn.execute(
            update(jobs)
            .where(jobs.c.id == job_id)
            .values(created_at=datetime.now(UTC) - timedelta(seconds=600), heartbeat_at=datetime.now(UTC))
        )
    assert reap(control, heartbeat_timeout=60, queued_timeout=300, holds=lambda _: set()) == []
    with control.begin() as conn:
        stale = datetime.now(UTC) - timedelta(seconds=400)
        conn.execute(update(jobs).where(jobs.c.id == job_id).values(heartbeat_at=stale))
    assert reap(control, heartbeat_timeout=60, queued_timeout=300, holds=lambda _: set()) == [job_id]


def test_a_finished_job_with_an_open_reservation_is_refunded(engines: tuple[Engine, Engine]) -> None:
    """A job marked failed while its refund could not be written (the database went away in between)."""
    control, _ = engines
    job_id = submit(control)
    with control.begin() as conn:
        conn.execute(update(jobs).where(jobs.c.id == job_id).values(status="failed"))
    assert open_reservations(control) == 1
    reap(control, heartbeat_timeout=60, queued_timeout=300)
    assert open_reservations(control) == 0


@pytest.mark.parametrize("engines", ["postgresql"], indirect=True)
def test_a_job_is_never_seen_ended_with_budget_still_reserved(engines: tuple[Engine, Engine]) -> None:
    """The reaper's status change and its refund commit together: while the refund waits for the budget
    row (a charge in flight holds it), readers still see the job running, never failed with budget held."""
    control, _ = engines
    job_id = submit(control)
    with control.begin() as conn:
        conn.execute(
            update(jobs)
            .where(jobs.c.id == job_id)
            .values(status="running", heartbeat_at=datetime.now(UTC) - timedelta(hours=1))
        )
    reaped: list[list[str]] = []
    with control.connect() as charge_in_flight:
        with charge_in_flight.begin():
            charge_in_flight.execute(select(budgets).where(budgets.c.dataset == "t").with_for_update())
            reaper = threading.Thread(target=lambda: reaped.append(reap(control, heartbeat_timeout=60)))
            reaper.start()
            reaper.join(timeout=1.0)
            assert reaper.is_alive(), "the reaper should be waiting for the budget row"
            assert job_row(control, job_id).status == "running"
            assert open_reservations(control) == 1
        reaper.join(timeout=30)
    assert reaped == [[job_id]]
    assert job_row(control, job_id).status == "failed" and open_reservations(control) == 0


@pytest.fixture
def api_without_workers(tmp_path: Path) -> Iterator[Api]:
    """The API with a fast reaper and no worker at all: tasks go to a queue nobody reads."""
    with fresh_database("sqlite", tmp_path, "control") as url:
        engine = create_db_engine(url)
        keys, ids = populate(engine)
        queue = RecordingQueue()
        settings = ServiceSettings(
            home=tmp_path,
            control_database_url=url,
            reaper_interval_seconds=0.2,
            queued_timeout_seconds=1.0,
            heartbeat_timeout_seconds=1.0,
        )
        try:
            with TestClient(create_app(settings, queue=queue)) as client:
                yield Api(client, engine, queue, keys, ids)
        finally:
            engine.dispose()


@pytest.mark.slow
def test_the_api_sends_lost_jobs_again_without_any_worker_and_fails_them_past_the_limit(
    api_without_workers: Api,
) -> None:
    """The API's own reaper (heartbeat 1 s): a queued job whose task the broker lost (the recording queue
    forgets it) and a running job whose worker died are sent again, not failed; a queued job whose task
    the broker still holds waits (no worker is running: nothing was lost), however long. A job that keeps
    losing its task is failed and refunded once it was sent again MAX_RESUMES times."""
    api = api_without_workers
    queued = api.submit().json()["id"]
    running = api.submit().json()["id"]
    waiting = api.submit().json()["id"]
    api.queue.sent.remove(queued)  # the broker restarted without it
    with api.engine.begin() as conn:  # a worker took this one, then died
        conn.execute(
            update(jobs).where(jobs.c.id == running).values(status="running", heartbeat_at=datetime.now(UTC))
        )
    sent_before = list(api.queue.sent)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and not {queued, running} <= set(api.queue.sent[len(sent_before) :]):
        time.sleep(0.1)
    for job_id in (queued, running):
        row = job_row(api.engine, job_id)
        assert row.status == "queued" and row.resumes == 1, (job_id, row.status, row.resumes)
    time.sleep(2.5)  # two heartbeats more: held by the broker now, so waiting, not lost again
    assert job_row(api.engine, queued).resumes == 1 and job_row(api.engine, waiting).resumes == 0
    # The broker keeps losing it: sent again up to the limit, then failed with a message that says so.
    while time.monotonic() < deadline and job_row(api.engine, queued).status != "failed":
        api.queue.sent[:] = [job_id for job_id in api.queue.sent if job_id != queued]
        time.sleep(0.1)
    failed = api.call("GET", f"/v1/jobs/{queued}", "analyst").json()
    assert failed["status"] == "failed" and f"lost its worker {MAX_RESUMES + 1} times" in failed["error"]
    assert job_row(api.engine, queued).resumes == MAX_RESUMES
    assert api.call("GET", f"/v1/jobs/{waiting}", "analyst").json()["status"] == "queued"
    assert open_reservations(api.engine) == 2  # the running job's (sent again) and the waiting job's


def test_a_lost_job_is_sent_again_by_one_reaper_only(engines: tuple[Engine, Engine]) -> None:
    """Two reapers read the same stale running job: the update conditional on what they read lets one of
    them send it; the job resumes from where it stopped (status queued, its start kept)."""
    control, _ = engines
    job_id = submit(control)
    stale = datetime.now(UTC) - timedelta(seconds=120)
    with control.begin() as conn:
        conn.execute(
            update(jobs)
            .where(jobs.c.id == job_id)
            .values(status="running", started_at=stale, heartbeat_at=stale)
        )
    first, second = reaper._rows_to_check(control), reaper._rows_to_check(control)
    sent: list[str] = []
    assert reaper._send_again(control, first[0], sent.append) is True
    assert reaper._send_again(control, second[0], sent.append) is False
    assert sent == [job_id]
    row = job_row(control, job_id)
    assert (row.status, row.resumes) == ("queued", 1) and row.started_at is not None


def test_a_taken_job_a_dead_worker_never_started_is_sent_again_after_a_heartbeat(
    engines: tuple[Engine, Engine],
) -> None:
    """Issue 52.2: a worker took a job (Redis keeps its task unacknowledged, for an hour) and died before
    starting it. Quiet for a heartbeat and not waiting in the broker's queue, it is sent again; one
    waiting in the queue behind a backlog is not, nor one a live worker deferred a moment ago, nor anything
    while the broker cannot be read."""
    control, _ = engines
    taken, backlog, deferred, young = (submit(control) for _ in range(4))
    long_ago = datetime.now(UTC) - timedelta(seconds=90)
    with control.begin() as conn:
        conn.execute(
            update(jobs).where(jobs.c.id.in_([taken, backlog, deferred])).values(created_at=long_ago)
        )
        conn.execute(update(jobs).where(jobs.c.id == deferred).values(heartbeat_at=datetime.now(UTC)))
    asked: list[tuple[set[str], bool]] = []

    def holds(job_ids: AbstractSet[str], taken: bool = True) -> set[str] | None:
        asked.append((set(job_ids), taken))
        return {backlog}

    sent: list[str] = []
    assert reap(control, heartbeat_timeout=60, queued_timeout=300, holds=holds, resend=sent.append) == []
    assert sent == [taken] and asked == [({taken, backlog}, False)]
    assert [job_row(control, j).resumes for j in (taken, backlog, deferred, young)] == [1, 0, 0, 0]
    with control.begin() as conn:
        conn.execute(update(jobs).where(jobs.c.id == backlog).values(created_at=long_ago))
    assert reap(control, heartbeat_timeout=60, holds=lambda ids, taken=True: None, resend=sent.append) == []
    assert sent == [taken]  # the broker unreadable: nothing queued is touched


# --- database outages ------------------------------------------------------------------------------------


def test_an_unreachable_database_at_task_start_is_retried_not_failed(
    engines: tuple[Engine, Engine],
) -> None:
    control, sensitive = engines
    job_id = submit(control)
    gone = create_db_engine("postgresql+psycopg://vips@127.0.0.1:1/none", connect_args={"connect_timeout": 2})
    try:
        with pytest.raises(job_runner.DatabaseUnavailable) as caught:
            job_runner.execute_job(job_id, gone, sensitive)
    finally:
        gone.dispose()
    assert caught.value.started is False
    assert job_row(control, job_id).status == "queued"  # the retry will run it
    assert job_runner.execute_job(job_id, control, sensitive) == "succeeded"
    assert open_reservations(control) == 0


def idle_transaction_ended(control: Engine) -> DBAPIError:
    """The error a client gets once PostgreSQL ended its transaction for idling past the timeout (a frozen
    worker): an InternalError, not an OperationalError, after which SQLAlchemy drops the connection."""
    url = control.url.render_as_string(hide_password=False)
    engine = create_db_engine(url, connect_args={"options": "-c idle_in_transaction_session_timeout=200"})
    try:
        with engine.begin() as conn:
            conn.execute(select(1))
            time.sleep(0.6)
            conn.execute(select(1))
    except DBAPIError as exc:
        assert not isinstance(exc, OperationalError) and exc.connection_invalidated
        return exc
    finally:
        engine.dispose()
    raise AssertionError("the server kept a transaction idle past its timeout")


@pytest.mark.parametrize("loss", ["connection closed", "idle transaction ended"])
def test_a_database_lost_longer_than_the_wait_is_retried_and_resumes_without_paying_twice(
    engines: tuple[Engine, Engine], monkeypatch: pytest.MonkeyPatch, loss: str
) -> None:
    """The database away for longer than the task waits for it (here: no wait at all): the task's retry
    resumes the job once its heartbeat is stale."""
    control, sensitive = engines
    monkeypatch.setattr(job_runner, "MAX_RESUMPTIONS", 0)
    if loss == "idle transaction ended" and control.dialect.name != "postgresql":
        pytest.skip("the idle-transaction timeout is PostgreSQL's")
    job_id = submit(control)

    def lose_database() -> None:
        if loss == "idle transaction ended":
            raise idle_transaction_ended(control)
        raise OperationalError("SELECT", {}, ConnectionError("server closed the connection"))

    on_gate_call(monkeypatch, 4, lose_database)
    with pytest.raises(job_runner.DatabaseUnavailable) as caught:
        job_runner.execute_job(job_id, control, sensitive, heartbeat_timeout=60)
    assert caught.value.started is True
    assert job_row(control, job_id).status == "running"  # not failed: the retry resumes it
    monkeypatch.undo()
    # Before the heartbeat is stale the retry leaves the job alone; the task waits it out (retry_delay).
    assert job_runner.execute_job(job_id, control, sensitive, heartbeat_timeout=60) == "running"
    assert retry_delay(0, True, 60) > 60 and retry_delay(0, False, 60) < 60
    with control.begin() as conn:
        conn.execute(
            update(jobs)
            .where(jobs.c.id == job_id)
            .values(heartbeat_at=datetime.now(UTC) - timedelta(hours=1))
        )
    assert job_runner.execute_job(job_id, control, sensitive, heartbeat_timeout=60) == "succeeded"
    assert count(control, charges, job_id) == count(control, releases, job_id) == 6
    assert open_reservations(control) == 0


@pytest.mark.parametrize("loss", ["connection closed", "idle transaction ended"])
def test_a_database_lost_mid_job_is_waited_for_and_the_job_resumes_in_the_same_task(
    engines: tuple[Engine, Engine], monkeypatch: pytest.MonkeyPatch, loss: str
) -> None:
    """Issue 34.9: a lost database (back within the heartbeat timeout) does not end the task: it waits for
    the database, refreshes the heartbeat and resumes the job from its stored releases, paying nothing
    twice."""
    control, sensitive = engines
    if loss == "idle transaction ended" and control.dialect.name != "postgresql":
        pytest.skip("the idle-transaction timeout is PostgreSQL's")
    job_id = submit(control)

    def lose_database() -> None:
        if loss == "idle transaction ended":
            raise idle_transaction_ended(control)
        raise OperationalError("SELECT", {}, ConnectionError("server closed the connection"))

    on_gate_call(monkeypatch, 4, lose_database)
    assert job_runner.execute_job(job_id, control, sensitive, heartbeat_timeout=60) == "succeeded"
    assert count(control, charges, job_id) == count(control, releases, job_id) == 6
    assert open_reservations(control) == 0


def test_a_release_whose_store_a_lost_database_cut_off_is_stored_on_resumption_not_paid_again(
    engines: tuple[Engine, Engine], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 34.9: release 4 is charged and computed, then its store is cut off: the resumed job stores that
    release (it was paid for) instead of charging the iteration again: charges = releases."""
    control, sensitive = engines
    job_id = submit(control)
    real = StoredReleases._store
    cut = {"left": 1}

    def store(self: StoredReleases, release: Any) -> bool | None:
        if release.iteration == 4 and cut["left"]:
            cut["left"] -= 1
            raise OperationalError("INSERT", {}, ConnectionError("server closed the connection"))
        return real(self, release)

    monkeypatch.setattr(StoredReleases, "_store", store)
    monkeypatch.setattr(job_runner, "OUTAGE_POLL_SECONDS", 0.01)
    assert job_runner.execute_job(job_id, control, sensitive, heartbeat_timeout=60) == "succeeded"
    assert cut["left"] == 0
    assert count(control, charges, job_id) == count(control, releases, job_id) == 6
    assert open_reservations(control) == 0


def test_a_job_ended_while_its_worker_waited_for_the_database_is_left_as_it_ended(
    engines: tuple[Engine, Engine], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An outage longer than the heartbeat timeout: the reaper failed the job meanwhile; the waiting task
    sees that once the database is back and stops, charging nothing more."""
    control, sensitive = engines
    job_id = submit(control)

    def lose_database_and_get_reaped() -> None:
        with control.begin() as conn:
            end_job(conn, job_id, "failed", only_if=jobs.c.status == "running", error="reaped")
        raise OperationalError("SELECT", {}, ConnectionError("server closed the connection"))

    on_gate_call(monkeypatch, 4, lose_database_and_get_reaped)
    assert job_runner.execute_job(job_id, control, sensitive, heartbeat_timeout=60) == "failed"
    assert count(control, charges, job_id) == count(control, releases, job_id) == 3
    assert open_reservations(control) == 0


def test_recording_a_job_end_is_retried(
    engines: tuple[Engine, Engine], monkeypatch: pytest.MonkeyPatch
) -> None:
    control, _ = engines
    job_id = submit(control)
    real = ledger_db.close_reservation
    failures = {"left": 2}

    def flaky(conn: Connection, job: str) -> int:
        if failures["left"]:
            failures["left"] -= 1
            raise OperationalError("UPDATE", {}, ConnectionError("connection reset"))
        return real(conn, job)

    monkeypatch.setattr(ledger_db, "close_reservation", flaky)
    monkeypatch.setattr(job_runner, "FINISH_RETRY_WAITS", (0.01, 0.01, 0.01))
    job_runner._finish(control, job_id, 0, "failed", "test")
    assert job_row(control, job_id).status == "failed" and open_reservations(control) == 0


# --- Idempotency-Key --------------------------------------------------------------------------------------


def submit_with_key(api: Api, key: str, **spec: Any) -> Any:
    body = {"dataset": "priv", "model": "blr", "iterations": 5, "batch_size": 100, "sigma": 2.0, **spec}
    headers = {"Authorization": f"Bearer {api.keys['analyst']}", "Idempotency-Key": key}
    return api.client.post("/v1/jobs", json=body, headers=headers)


def test_the_same_idempotency_key_is_one_job(api_without_workers: Api) -> None:
    api = api_without_workers
    first = submit_with_key(api, "c0ffee-1")
    again = submit_with_key(api, "c0ffee-1")
    assert first.status_code == again.status_code == 202, again.text
    assert first.json()["id"] == again.json()["id"]
    assert again.headers.get("Idempotent-Replayed") == "true"
    assert len(api.queue.sent) == 1 and open_reservations(api.engine) == 1
    other = submit_with_key(api, "c0ffee-1", iterations=6)
    assert other.status_code == 409 and "iterations" in other.json()["detail"]
    assert submit_with_key(api, "c0ffee-2").json()["id"] != first.json()["id"]
    bad = submit_with_key(api, "no spaces allowed")
    assert bad.status_code == 422


def test_concurrent_submissions_with_one_key_reserve_once(api_without_workers: Api) -> None:
    api = api_without_workers
    start = threading.Barrier(8)
    answers: list[Any] = []

    def go() -> None:
        start.wait()
        answers.append(submit_with_key(api, "race"))

    threads = [threading.Thread(target=go) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert {a.status_code for a in answers} == {202}
    assert len({a.json()["id"] for a in answers}) == 1
    with api.engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(jobs)).scalar_one() == 1
        assert conn.execute(select(func.count()).select_from(reservations)).scalar_one() >= 1
    assert open_reservations(api.engine) == 1  # the losers' reservations were refunded


def test_readyz_reports_a_missing_worker(tmp_path: Path) -> None:
    with fresh_database("sqlite", tmp_path, "control") as url:
        settings = ServiceSettings(home=tmp_path, control_database_url=url)
        with TestClient(create_app(settings, queue=RecordingQueue(workers=False))) as client:
            r = client.get("/readyz")
        assert r.status_code == 503
        assert r.json()["checks"]["worker"].startswith("no live worker")
        assert r.json()["checks"]["database"] == r.json()["checks"]["broker"] == "ok"


def test_a_job_the_reaper_ended_stops_charging(
    engines: tuple[Engine, Engine], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker cut off long enough to be reaped must not go on charging (nor overwrite the status)."""
    control, sensitive = engines
    job_id = submit(control)

    def reap_it() -> None:  # the reaper fails the job while iteration 3 is computed
        with control.begin() as conn:
            end_job(conn, job_id, "failed", only_if=jobs.c.status == "running", error="reaped")

    calls = on_gate_call(monkeypatch, 3, reap_it)
    assert job_runner.execute_job(job_id, control, sensitive) == "failed"
    assert calls["n"] == 3 and job_row(control, job_id).error == "reaped"
    assert count(control, charges, job_id) == count(control, releases, job_id) == 3
    assert open_reservations(control) == 0


@pytest.mark.slow
def test_a_worker_that_comes_back_after_its_job_was_sent_again_stops(engines: tuple[Engine, Engine]) -> None:
    """The job's `resumes` is its runner's token: once the reaper sent the job again and another task
    claimed it, the first task's heartbeats and progress no longer count and its ending does not end the
    job (the worker had frozen or lost the database past the heartbeat); the new run finishes it."""
    control, sensitive = engines
    job_id = submit(control)
    first = job_runner._claim(job_id, control, 60, None)
    assert job_runner._beat(control, job_id, first.resumes)
    with control.begin() as conn:
        stale = datetime.now(UTC) - timedelta(seconds=120)
        conn.execute(update(jobs).where(jobs.c.id == job_id).values(heartbeat_at=stale))
    sent: list[str] = []
    assert reap(control, heartbeat_timeout=60, holds=lambda ids, taken=True: set(), resend=sent.append) == []
    assert sent == [job_id]
    second = job_runner._claim(job_id, control, 60, None)
    assert (first.resumes, second.resumes) == (0, 1)
    assert not job_runner._beat(control, job_id, first.resumes)
    assert job_runner._beat(control, job_id, second.resumes)
    job_runner._finish(control, job_id, first.resumes, "failed", "the first run's late ending")
    assert job_row(control, job_id).status == "running"
    assert job_runner.execute_job(job_id, control, sensitive, heartbeat_timeout=0.0) == "succeeded"
    assert open_reservations(control) == 0
