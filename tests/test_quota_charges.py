"""Per-key quotas hold for charges beyond a job's reservation too (issue 34, item 2): a retried attempt once
the reservation is used up, or a charge after the job's refund, is checked against the submitting key's
quota as well as the dataset's budget, in the charge's transaction under the budget row's lock; refused,
the job fails as on a budget refusal (no release, nothing left reserved). SQLite and PostgreSQL."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, func, select

from control.budgets.key_spend import key_spend
from control.budgets.quotas import QuotaExceeded, check_charge_quota, set_quota
from control.jobs.end import end_job
from control.store.models import jobs
from privacy_wall.accounting.accountants import configured_accountant
from privacy_wall.accounting.events import SubsampledGaussianEvent
from privacy_wall.ledger import database as ledger_db
from privacy_wall.ledger.base import Charge
from privacy_wall.ledger.schema import reservations
from tests.test_jobs import (
    DELTA,
    Crash,
    charge_keys,
    databases,
    job_row,
    on_gate_call,
    stored_iterations,
    submit,
)
from worker import jobs as job_runner
from worker import stored_releases

#: The auditor's schedule: 5 iterations of sigma 2 on 100 of 1000 records (one job: epsilon 0.6172).
N, SIGMA, BATCH, T = 1000, 2.0, 100, 5
EVENT = SubsampledGaussianEvent(SIGMA, BATCH, N)


@pytest.fixture(params=["sqlite", "postgresql"])
def engines(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Engine, Engine]]:
    with databases(request.param, tmp_path, rows=N) as pair:
        yield pair


def price(iterations: int) -> float:
    """Epsilon of `iterations` releases of EVENT composed, at the dataset's delta."""
    return configured_accountant().cost(EVENT).scaled(iterations).epsilon(DELTA)


def key_epsilon(control: Engine) -> float:
    """Key k1's releases on the dataset composed, with the rest of its open reservations."""
    (row,) = key_spend(control, "t", DELTA, "k1")
    return row.epsilon_reserved


def open_reservations(control: Engine) -> int:
    with control.connect() as conn:
        return int(conn.execute(select(func.count()).where(reservations.c.open.is_(True))).scalar_one())


@pytest.mark.slow
def test_a_retried_charge_beyond_the_reservation_never_takes_the_key_past_its_quota(
    engines: tuple[Engine, Engine], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The auditor's replay: quota 1.001 x the price of one job; release 3 is lost after its charge (the
    worker dies while storing it), so the resumed job pays (3, 1) from its reservation, which (4, 0) uses
    up; (5, 0) would bring the key to six iterations' price (1.4503 > 1.3963 by the filter): refused."""
    control, sensitive = engines
    quota = 1.001 * price(T)
    assert (round(quota, 4), round(price(T + 1), 4)) == (1.3963, 1.4503)
    set_quota(control, "t", "k1", quota)
    job_id = submit(control, iterations=T, sigma=SIGMA, batch_size=BATCH, population=N)
    real_store, calls = stored_releases.run_writes, {"n": 0}  # the worker's only write of a release

    def crashing_store(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 3:
            raise Crash  # release 3 was charged and computed, then the process died
        return real_store(*args, **kwargs)

    monkeypatch.setattr(stored_releases, "run_writes", crashing_store)
    with pytest.raises(Crash):
        job_runner.execute_job(job_id, control, sensitive)
    monkeypatch.undo()
    status = job_runner.execute_job(job_id, control, sensitive, heartbeat_timeout=0)
    assert key_epsilon(control) <= quota
    assert status == "failed"
    assert charge_keys(control, job_id) == [(1, 0), (2, 0), (3, 0), (3, 1), (4, 0)]
    assert stored_iterations(control, job_id) == [1, 2, 3, 4]  # release 5 was never computed
    assert "quota" in job_row(control, job_id).error
    assert key_epsilon(control) == pytest.approx(price(T), rel=1e-9)
    assert open_reservations(control) == 0
    budget = ledger_db.budget_status(control, "t")
    assert budget.epsilon_reserved == pytest.approx(budget.epsilon_spent, rel=1e-12)


def test_a_charge_after_the_reapers_refund_is_held_to_the_keys_quota(
    engines: tuple[Engine, Engine], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reaper fails and refunds a job cut off before release 3, and the key's next job takes the room
    the refund freed; the first job's worker, still running, must not charge release 3 on top."""
    control, sensitive = engines
    quota = 1.001 * price(T)
    set_quota(control, "t", "k1", quota)
    first = submit(control, iterations=T, sigma=SIGMA, batch_size=BATCH, population=N)

    def reaped_and_replaced() -> None:
        with control.begin() as conn:
            end_job(conn, first, "failed", only_if=jobs.c.status == "running", error="reaped")
        submit(control, iterations=T - 2, sigma=SIGMA, batch_size=BATCH, population=N)  # 2 + 3 fit

    on_gate_call(monkeypatch, 3, reaped_and_replaced)
    status = job_runner.execute_job(first, control, sensitive)
    assert key_epsilon(control) <= quota
    assert status == "failed" and job_row(control, first).error == "reaped"
    assert charge_keys(control, first) == [(1, 0), (2, 0)]
    assert stored_iterations(control, first) == [1, 2]
    assert open_reservations(control) == 1  # the second job's


def test_concurrent_uncovered_charges_of_one_keys_jobs_never_jointly_pass_its_quota(
    engines: tuple[Engine, Engine],
) -> None:
    """Two jobs of one key, their reservations used up, each charge a retried attempt at once; the quota
    has room for one of them: exactly one is admitted, whichever takes the budget row's lock first."""
    control, _ = engines
    set_quota(control, "t", "k1", (price(2 * T + 1) + price(2 * T + 2)) / 2)
    ledger = ledger_db.SqlLedger(control, check_charge_quota)  # as the worker charges
    both = [submit(control, iterations=T, sigma=SIGMA, batch_size=BATCH, population=N) for _ in range(2)]
    for job_id in both:
        for t in range(1, T + 1):
            ledger.commit(Charge("t", job_id, t, EVENT))
    start = threading.Barrier(len(both))
    outcomes: list[str] = []

    def retry(job_id: str) -> None:
        start.wait()
        try:
            ledger.commit(Charge("t", job_id, T, EVENT, attempt=1))
            outcomes.append("charged")
        except QuotaExceeded:
            outcomes.append("refused")

    threads = [threading.Thread(target=retry, args=(job_id,)) for job_id in both]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(outcomes) == ["charged", "refused"]
    assert key_epsilon(control) == pytest.approx(price(2 * T + 1), rel=1e-9)
    # The refusal is a BudgetExceeded (what the gate and the worker handle) naming the key and the charge.
    with pytest.raises(QuotaExceeded, match=r"key k1's quota on dataset t: .* charge 2 \(attempt 2\)"):
        ledger.commit(Charge("t", both[0], 2, EVENT, attempt=2))
