"""Running jobs against real databases: stored releases, resume without paying twice, crash windows,
cancel, the reaper. The Celery layer is exercised end to end in the service tests."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sqlalchemy import Engine, func, insert, select, update
from sqlalchemy.exc import DataError

from control.budgets.charge_outcomes import charge_outcomes
from control.jobs.reaper import reap
from control.store.models import api_keys, jobs, releases
from control.store.posteriors import posterior_text
from privacy_wall.accounting.accountants import privacy_cost
from privacy_wall.accounting.events import SubsampledGaussianEvent
from privacy_wall.data.ingest import ingest
from privacy_wall.gate import Gate
from privacy_wall.ledger import database as ledger_db
from privacy_wall.ledger.schema import charges
from privacy_wall.sqlengine import create_db_engine
from tests.dbservers import fresh_database
from tests.privacy_wall.data.test_ingest_store import tabular_data, write_tabular
from worker import jobs as job_runner
from worker import stored_releases
from worker.stored_releases import StorageLimits

DELTA = 1e-5


class Crash(BaseException):
    """Stands for the process dying: not an Exception, so nothing in the job catches it."""


@contextmanager
def databases(kind: str, tmp_path: Path, rows: int = 400) -> Iterator[tuple[Engine, Engine]]:
    """Fresh control and sensitive databases of `kind` with dataset "t" (`rows` records, budget 50) and
    analyst key "k1"."""
    with (
        fresh_database(kind, tmp_path, "control") as control_url,
        fresh_database(kind, tmp_path, "sensitive") as sensitive_url,
    ):
        control, sensitive = create_db_engine(control_url), create_db_engine(sensitive_url)
        x, y = tabular_data(n=rows, d=3, seed=3)
        ingest(
            control=control,
            sensitive=sensitive,
            name="t",
            kind="tabular",
            path=write_tabular(tmp_path / "t.csv", x, y),
            label="label",
        )
        ledger_db.set_budget(control, "t", 50.0, DELTA)
        with control.begin() as conn:
            conn.execute(
                insert(api_keys).values(
                    id="k1", key_hash="0" * 64, role="analyst", created_at=datetime.now(UTC), revoked=False
                )
            )
        try:
            yield control, sensitive
        finally:
            control.dispose()
            sensitive.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def engines(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Engine, Engine]]:
    with databases(request.param, tmp_path) as pair:
        yield pair


def submit(
    control: Engine, iterations: int = 6, sigma: float = 3.0, batch_size: int = 100, population: int = 400
) -> str:
    """A job of key k1 on dataset "t" (of `population` records), its whole cost reserved."""
    job_id = uuid.uuid4().hex
    event = SubsampledGaussianEvent(sigma, batch_size, population)
    ledger_db.reserve(control, "t", job_id, event, iterations)
    with control.begin() as conn:
        conn.execute(
            insert(jobs).values(
                id=job_id,
                dataset="t",
                owner="k1",
                model="blr",
                algorithm="vips",
                options={},
                iterations=iterations,
                batch_size=batch_size,
                sigma=sigma,
                epsilon_target=None,
                epsilon_job=None,
                delta=DELTA,
                status="queued",
                iteration=0,
                cancel_requested=False,
                created_at=datetime.now(UTC),
            )
        )
    return job_id


def job_row(control: Engine, job_id: str) -> Any:
    with control.connect() as conn:
        return conn.execute(select(jobs).where(jobs.c.id == job_id)).one()


def charge_keys(control: Engine, job_id: str) -> list[tuple[int, int]]:
    return ledger_db.charged_iterations(control, job_id)


def stored_iterations(control: Engine, job_id: str) -> list[int]:
    with control.connect() as conn:
        rows = conn.execute(select(releases.c.iteration).where(releases.c.job_id == job_id))
        return sorted(int(r[0]) for r in rows)


def on_gate_call(monkeypatch: pytest.MonkeyPatch, call: int, action: Callable[[], None]) -> dict[str, int]:
    """Run `action` when the gate's release is called for the `call`-th time (before it releases);
    returns the call counter."""
    real = Gate.release
    calls = {"n": 0}

    def release(self: Gate, *args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == call:
            action()
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Gate, "release", release)
    return calls


def crash_on_gate_call(monkeypatch: pytest.MonkeyPatch, call: int) -> None:
    def crash() -> None:
        raise Crash

    on_gate_call(monkeypatch, call, crash)


def test_job_runs_stores_every_release_and_charges_each_once(engines: tuple[Engine, Engine]) -> None:
    control, sensitive = engines
    job_id = submit(control)
    assert job_runner.execute_job(job_id, control, sensitive) == "succeeded"
    assert stored_iterations(control, job_id) == list(range(1, 7))
    assert charge_keys(control, job_id) == [(t, 0) for t in range(1, 7)]
    status = ledger_db.budget_status(control, "t")
    expected = privacy_cost(SubsampledGaussianEvent(3.0, 100, 400)).scaled(6).epsilon(DELTA)
    assert status.epsilon_spent == pytest.approx(expected, rel=1e-9)
    assert status.epsilon_reserved == pytest.approx(expected, rel=1e-9)  # nothing left reserved
    document = json.loads(posterior_text(control, job_id))
    assert document["privacy"]["epsilon"] == pytest.approx(expected, rel=1e-9)
    assert len(document["mean"]) == 3
    # Redelivery of a finished job does nothing and pays nothing.
    assert job_runner.execute_job(job_id, control, sensitive) == "succeeded"
    assert len(charge_keys(control, job_id)) == 6


@pytest.mark.slow
def test_resume_after_crash_reuses_stored_releases(
    engines: tuple[Engine, Engine], monkeypatch: pytest.MonkeyPatch
) -> None:
    control, sensitive = engines
    job_id = submit(control)
    crash_on_gate_call(monkeypatch, 3)  # dies before iteration 3 is charged
    with pytest.raises(Crash):
        job_runner.execute_job(job_id, control, sensitive)
    assert job_row(control, job_id).status == "running"
    assert stored_iterations(control, job_id) == [1, 2]
    monkeypatch.undo()
    # A fresh heartbeat means another worker owns the job: leave it.
    assert job_runner.execute_job(job_id, control, sensitive, heartbeat_timeout=60) == "running"
    # Stale: the redelivered task resumes, reusing 1 and 2 without paying again.
    assert job_runner.execute_job(job_id, control, sensitive, heartbeat_timeout=0) == "succeeded"
    assert charge_keys(control, job_id) == [(t, 0) for t in range(1, 7)]
    assert stored_iterations(control, job_id) == list(range(1, 7))


@pytest.mark.slow
def test_release_lost_after_its_charge_is_paid_again_never_reused(
    engines: tuple[Engine, Engine], monkeypatch: pytest.MonkeyPatch
) -> None:
    control, sensitive = engines
    job_id = submit(control)
    real_store = stored_releases.run_writes  # the worker's only write of a release
    calls = {"n": 0}

    def crashing_store(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 3:
            raise Crash  # iteration 3 was charged and computed, then the process died
        return real_store(*args, **kwargs)

    monkeypatch.setattr(stored_releases, "run_writes", crashing_store)
    with pytest.raises(Crash):
        job_runner.execute_job(job_id, control, sensitive)
    monkeypatch.undo()
    assert charge_keys(control, job_id) == [(1, 0), (2, 0), (3, 0)]
    # The ledger tells the charges apart (issue 52): 1 and 2 kept; 3 unknown while the job may resume.
    assert outcomes(control, job_id) == {(1, 0): True, (2, 0): True, (3, 0): None}
    assert job_runner.execute_job(job_id, control, sensitive, heartbeat_timeout=0) == "succeeded"
    keys = charge_keys(control, job_id)
    assert keys == [(1, 0), (2, 0), (3, 0), (3, 1), (4, 0), (5, 0), (6, 0)]
    # The lost release's charge is the one spent without a release; the rest were kept.
    assert outcomes(control, job_id) == {key: key != (3, 0) for key in keys}
    # Every stored release has its charge, and the ledger over-counts by exactly the lost one.
    assert set(stored_iterations(control, job_id)) <= {t for t, _ in keys}
    per_iteration = privacy_cost(SubsampledGaussianEvent(3.0, 100, 400))
    assert ledger_db.budget_status(control, "t").epsilon_spent == pytest.approx(
        per_iteration.scaled(7).epsilon(DELTA), rel=1e-9
    )


def outcomes(control: Engine, job_id: str) -> dict[tuple[int, int], bool | None]:
    """(iteration, attempt) -> whether its release was kept, as the ledger's `released` says."""
    entries = [e for e in ledger_db.ledger_entries(control, "t") if e["job_id"] == job_id]
    found = charge_outcomes(control, entries)
    return {(e["iteration"], e["attempt"]): found[e["id"]] for e in entries}


def test_a_job_failed_after_a_charge_shows_that_charge_spent_without_release(
    engines: tuple[Engine, Engine], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job that ends between a charge and its store (here its store is refused for a reason that keeps
    the charge, as a killed process's is) leaves that charge `released: false`, the rest true; GET
    /v1/datasets/{name}/ledger serves the same flags (tests/test_e2e.py, a killed worker)."""
    control, sensitive = engines
    job_id = submit(control)
    real_store = stored_releases.run_writes
    calls = {"n": 0}

    def failing_store(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 2:
            raise MemoryError  # after the commit of charge 2: the charge stays
        return real_store(*args, **kwargs)

    monkeypatch.setattr(stored_releases, "run_writes", failing_store)
    assert job_runner.execute_job(job_id, control, sensitive) == "failed"
    assert outcomes(control, job_id) == {(1, 0): True, (2, 0): False}


def test_cancel_between_iterations_refunds_the_rest(
    engines: tuple[Engine, Engine], monkeypatch: pytest.MonkeyPatch
) -> None:
    control, sensitive = engines
    job_id = submit(control)
    real = Gate.release

    def cancel_during_two(self: Gate, *args: Any, **kwargs: Any) -> Any:
        if kwargs["iteration"] == 2:  # the analyst cancels while iteration 2 is being computed
            with control.begin() as conn:
                conn.execute(update(jobs).where(jobs.c.id == job_id).values(cancel_requested=True))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Gate, "release", cancel_during_two)
    assert job_runner.execute_job(job_id, control, sensitive) == "cancelled"
    assert charge_keys(control, job_id) == [(1, 0), (2, 0)]
    status = ledger_db.budget_status(control, "t")
    assert status.epsilon_reserved == pytest.approx(status.epsilon_spent, rel=1e-12)


def test_reaper_fails_stale_jobs_and_refunds(
    engines: tuple[Engine, Engine], monkeypatch: pytest.MonkeyPatch
) -> None:
    control, sensitive = engines
    job_id = submit(control)
    crash_on_gate_call(monkeypatch, 4)
    with pytest.raises(Crash):
        job_runner.execute_job(job_id, control, sensitive)
    monkeypatch.undo()
    fresh = submit(control)
    with control.begin() as conn:
        conn.execute(
            update(jobs).where(jobs.c.id == fresh).values(status="running", heartbeat_at=datetime.now(UTC))
        )
        conn.execute(
            update(jobs)
            .where(jobs.c.id == job_id)
            .values(heartbeat_at=datetime.now(UTC) - timedelta(seconds=120))
        )
    assert reap(control, 60) == [job_id]
    assert job_row(control, job_id).status == "failed"
    assert job_row(control, fresh).status == "running"
    per_iteration = privacy_cost(SubsampledGaussianEvent(3.0, 100, 400))
    status = ledger_db.budget_status(control, "t")
    assert status.epsilon_spent == pytest.approx(per_iteration.scaled(3).epsilon(DELTA), rel=1e-9)
    # What remains reserved is exactly the fresh job's whole curve on top of the three charges.
    assert status.epsilon_reserved == pytest.approx(per_iteration.scaled(9).epsilon(DELTA), rel=1e-9)
    with control.connect() as conn:
        assert conn.execute(select(func.count()).select_from(charges)).scalar_one() == 3
    assert np.isfinite(status.epsilon_spent)


NOISED = "0.8137264"  # stands for a noised value: it must never reach the job's stored error


def test_a_failed_job_stores_a_message_for_users_and_logs_the_technical_detail(
    engines: tuple[Engine, Engine], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """GET /v1/jobs/ID returns `error` to every key that reads the job (client keys included): it says
    what failed and where to look, never the exception's text (SQL, the values it carried)."""
    control, sensitive = engines
    statement = (
        "INSERT INTO releases (job_id, iteration, statistics) VALUES (%(p_job_id)s, %(p_iteration)s, ...)"
    )
    real_store = stored_releases.run_writes
    calls = {"n": 0}

    def refused_store(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 3:  # the database refuses release 3, quoting the statement and its values
            raise DataError(
                statement, {"p_statistics": {"mean": [float(NOISED)]}}, Exception(f"{NOISED} too large")
            )
        return real_store(*args, **kwargs)

    monkeypatch.setattr(stored_releases, "run_writes", refused_store)
    job_id = submit(control)
    with caplog.at_level("ERROR", logger=job_runner.__name__):
        assert job_runner.execute_job(job_id, control, sensitive) == "failed"
    error = job_row(control, job_id).error
    assert error == (
        "the job failed while storing release 3: the database refused a value (out of range, or larger "
        f"than it accepts); the worker's log has the details (job {job_id}), ask the service's operator"
    )
    assert "INSERT" in caplog.text and NOISED in caplog.text and "DataError" in caplog.text
    # Release 3 was never stored: its charge was withdrawn (charges = releases) and the rest refunded.
    assert charge_keys(control, job_id) == [(1, 0), (2, 0)] and stored_iterations(control, job_id) == [1, 2]
    status = ledger_db.budget_status(control, "t")
    assert status.epsilon_reserved == pytest.approx(status.epsilon_spent, rel=1e-12)
    monkeypatch.undo()

    def numbers_and_sql() -> None:
        raise RuntimeError(f"SELECT value FROM rows WHERE value > {NOISED}")

    on_gate_call(monkeypatch, 2, numbers_and_sql)
    other = submit(control)
    assert job_runner.execute_job(other, control, sensitive) == "failed"
    error = job_row(control, other).error
    assert error.startswith("the job failed while computing release 2: an unexpected error; ")
    assert other in error
    for leak in (NOISED, "SELECT", "RuntimeError", "INSERT"):
        assert leak not in error


def assert_charges_are_releases(control: Engine, job_id: str, iterations: list[int]) -> None:
    """Exactly these iterations were charged (once each) and stored, and nothing is left reserved."""
    assert charge_keys(control, job_id) == [(t, 0) for t in iterations]
    assert stored_iterations(control, job_id) == iterations
    status = ledger_db.budget_status(control, "t")
    assert status.epsilon_reserved == pytest.approx(status.epsilon_spent, rel=1e-12)


def test_a_release_over_the_release_limit_is_neither_stored_nor_charged(
    engines: tuple[Engine, Engine],
) -> None:
    """BLR on 3 features releases 12 values in two blocks: at most 654 bytes by their shapes (96 of values,
    the headers; 550 stored). Under a 500-byte limit the first release is dropped, its charge withdrawn
    (the refusal depends on shapes alone), and the job fails saying so."""
    control, sensitive = engines
    job_id = submit(control)
    limits = StorageLimits(release_bytes=500, stored_bytes=1 << 30)
    assert job_runner.execute_job(job_id, control, sensitive, limits=limits) == "failed"
    error = job_row(control, job_id).error
    assert error.startswith(
        "release 1 could take 654 B, more than this server stores for one release (500 B, "
    )
    assert "VIPS_MAX_RELEASE_MB" in error and "neither stored nor charged" in error
    assert_charges_are_releases(control, job_id, [])
    assert ledger_db.budget_status(control, "t").epsilon_spent == 0.0


def test_a_job_stops_before_its_releases_outgrow_the_stored_limit(engines: tuple[Engine, Engine]) -> None:
    """Room for 2.5 releases of 550 bytes: releases 1 and 2 are stored; release 3 would pass the bound, so
    the job fails before charging it, keeps what it released and is refunded the rest."""
    control, sensitive = engines
    job_id = submit(control)
    limits = StorageLimits(release_bytes=1 << 20, stored_bytes=int(2.5 * 550))
    assert job_runner.execute_job(job_id, control, sensitive, limits=limits) == "failed"
    error = job_row(control, job_id).error
    assert error.startswith("the job's releases reached what this server stores for one job (1.4 kB, ")
    assert "before release 3" in error and "VIPS_MAX_JOB_STORED_MB" in error
    assert_charges_are_releases(control, job_id, [1, 2])


def test_a_release_that_runs_out_of_memory_is_withdrawn(
    engines: tuple[Engine, Engine], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gate runs out of memory computing release 3 (after its charge): the job fails with charges =
    releases (1 and 2), on both databases, and nothing stays reserved."""
    control, sensitive = engines
    real = Gate._compute
    calls = {"n": 0}

    def compute(self: Gate, *args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 3:
            raise MemoryError
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Gate, "_compute", compute)
    job_id = submit(control)
    assert job_runner.execute_job(job_id, control, sensitive) == "failed"
    assert "ran out of memory" in job_row(control, job_id).error
    assert_charges_are_releases(control, job_id, [1, 2])


def test_a_key_at_its_running_limit_has_its_next_job_deferred(engines: tuple[Engine, Engine]) -> None:
    """One key, one running job (fresh heartbeat): its next job is deferred, not started, and vouched for
    (heartbeat_at) so the reaper leaves it; once the first ends, the deferred one runs. Another key's job
    is never held back by this key's."""
    control, sensitive = engines
    first, second = submit(control), submit(control)
    with control.begin() as conn:
        conn.execute(
            update(jobs).where(jobs.c.id == first).values(status="running", heartbeat_at=datetime.now(UTC))
        )
        conn.execute(
            insert(api_keys).values(
                id="k2", key_hash="1" * 64, role="analyst", created_at=datetime.now(UTC), revoked=False
            )
        )
    other = submit(control)
    with control.begin() as conn:
        conn.execute(update(jobs).where(jobs.c.id == other).values(owner="k2"))
    assert job_runner.execute_job(second, control, sensitive, max_running_per_key=1) == "deferred"
    row = job_row(control, second)
    assert row.status == "queued" and row.heartbeat_at is not None and count_charges(control, second) == 0
    with control.begin() as conn:  # submitted long ago, deferred just now: a worker holds it
        conn.execute(
            update(jobs).where(jobs.c.id == second).values(created_at=datetime.now(UTC) - timedelta(hours=1))
        )
    assert reap(control, heartbeat_timeout=60, queued_timeout=300, holds=lambda _: set()) == []
    assert job_runner.execute_job(other, control, sensitive, max_running_per_key=1) == "succeeded"
    assert job_runner.execute_job(second, control, sensitive, max_running_per_key=2) == "succeeded"
    with control.begin() as conn:
        conn.execute(
            update(jobs).where(jobs.c.id == first).values(heartbeat_at=datetime.now(UTC) - timedelta(hours=1))
        )
    third = submit(control)  # the first job's worker died (stale heartbeat): it no longer counts
    assert job_runner.execute_job(third, control, sensitive, max_running_per_key=1) == "succeeded"


def count_charges(control: Engine, job_id: str) -> int:
    with control.connect() as conn:
        return int(conn.execute(select(func.count()).where(charges.c.job_id == job_id)).scalar_one())


def test_a_job_over_the_wall_time_limit_stops_and_keeps_only_what_it_released(
    engines: tuple[Engine, Engine], monkeypatch: pytest.MonkeyPatch
) -> None:
    """VIPS_MAX_JOB_SECONDS: the job stops before the first release past its deadline; every release is
    charged once, the rest of its reservation is refunded, and the error says what happened."""
    control, sensitive = engines
    job_id = submit(control, iterations=6)
    real = Gate.release

    def slow_third(self: Gate, *args: Any, **kwargs: Any) -> Any:
        if kwargs["iteration"] == 3:
            monkeypatch.setattr(
                stored_releases, "utc_now", lambda: datetime.now(UTC) + timedelta(seconds=120)
            )
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Gate, "release", slow_third)
    assert job_runner.execute_job(job_id, control, sensitive, max_job_seconds=60) == "failed"
    row = job_row(control, job_id)
    assert "VIPS_MAX_JOB_SECONDS" in row.error and "before release 4" in row.error
    assert charge_keys(control, job_id) == [(1, 0), (2, 0), (3, 0)]
    assert stored_iterations(control, job_id) == [1, 2, 3]
    status = ledger_db.budget_status(control, "t")
    assert status.epsilon_reserved == pytest.approx(status.epsilon_spent, rel=1e-12)
    expected = privacy_cost(SubsampledGaussianEvent(3.0, 100, 400)).scaled(3).epsilon(DELTA)
    assert status.epsilon_spent == pytest.approx(expected, rel=1e-9)


def test_a_dataset_whose_rows_and_catalogue_disagree_is_refused_before_any_charge(
    engines: tuple[Engine, Engine],
) -> None:
    """An append killed between its two commits leaves the stored population above the catalogue's: the
    job fails before its first charge, saying what to do, and nothing stays reserved."""
    from privacy_wall.data.schema import stored_datasets

    control, sensitive = engines
    with sensitive.begin() as conn:
        conn.execute(update(stored_datasets).where(stored_datasets.c.name == "t").values(population=401))
    job_id = submit(control)
    assert job_runner.execute_job(job_id, control, sensitive) == "failed"
    assert "dataset t is being changed" in job_row(control, job_id).error
    assert_charges_are_releases(control, job_id, [])


def test_a_job_whose_first_update_cannot_run_fails_before_any_charge(
    engines: tuple[Engine, Engine], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 52: options admitted but unrunnable (an update that divides by zero, as LDA's unigram_clip
    1e-300 did after spending) fail the job at the rehearsal on a public stand-in: no charge, nothing
    reserved, and the message says nothing was spent."""
    from vips.models.blr.model import BayesianLogisticRegression

    def divides_by_zero(*_args: object, **_kwargs: object) -> None:
        raise ZeroDivisionError("float division by zero")

    monkeypatch.setattr(BayesianLogisticRegression, "m_step", divides_by_zero)
    control, sensitive = engines
    job_id = submit(control)
    assert job_runner.execute_job(job_id, control, sensitive) == "failed"
    error = job_row(control, job_id).error
    assert error.startswith("the job failed while rehearsing the first update on a public stand-in: ")
    assert "nothing was spent" in error
    assert_charges_are_releases(control, job_id, [])
