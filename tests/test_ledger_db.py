"""The ledger in the control database, on real PostgreSQL and on SQLite files (the embedded mode)."""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from privacy_wall import ledger_db
from privacy_wall.accounting import SubsampledGaussianEvent, rdp_curve
from privacy_wall.ledger import BudgetExceeded, Charge, DuplicateCharge
from privacy_wall.sqlengine import create_db_engine
from tests.dbservers import fresh_database
from vips.migrate import upgrade

EVENT = SubsampledGaussianEvent(noise_multiplier=1.0, sample_size=100, population=10_000)
DELTA = 1e-5


@pytest.fixture(params=["sqlite", "postgresql"])
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Engine]:
    with fresh_database(request.param, tmp_path) as url:
        upgrade("control", url)
        eng = create_db_engine(url, pool_size=20, max_overflow=40)
        try:
            yield eng
        finally:
            eng.dispose()


def budget_admitting_exactly(jobs: int, iterations: int) -> float:
    """An epsilon cap halfway between the cost of `jobs` and of `jobs + 1` identical jobs."""
    per_job = rdp_curve(EVENT).scaled(iterations)
    low = per_job.scaled(jobs).epsilon(DELTA)
    high = per_job.scaled(jobs + 1).epsilon(DELTA)
    return (low + high) / 2


def test_concurrent_reservations_admit_exactly_k(engine: Engine) -> None:
    k, iterations, submissions = 7, 10, 50
    cap = budget_admitting_exactly(k, iterations)
    ledger_db.set_budget(engine, "d", cap, DELTA)
    admitted: list[str] = []
    refused: list[str] = []
    errors: list[BaseException] = []
    start = threading.Barrier(submissions)

    def submit(i: int) -> None:
        start.wait()
        try:
            ledger_db.reserve(engine, "d", f"job{i}", EVENT, iterations)
            admitted.append(f"job{i}")
        except BudgetExceeded:
            refused.append(f"job{i}")
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=submit, args=(i,)) for i in range(submissions)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert len(admitted) == k
    assert len(refused) == submissions - k
    status = ledger_db.budget_status(engine, "d")
    assert status.epsilon_reserved <= cap
    # Committing every admitted job's iterations never exceeds the cap either.
    for job in admitted:
        for t in range(1, iterations + 1):
            ledger_db.commit_charge(engine, Charge("d", job, t, EVENT))
    status = ledger_db.budget_status(engine, "d")
    assert status.epsilon_spent <= cap
    assert math.isclose(
        status.epsilon_spent, rdp_curve(EVENT).scaled(k * iterations).epsilon(DELTA), rel_tol=1e-9
    )


def test_commit_refund_and_quote_arithmetic(engine: Engine) -> None:
    ledger_db.set_budget(engine, "d", 5.0, DELTA)
    quote = ledger_db.quote(engine, "d", EVENT, 20)
    assert quote.admissible and quote.status.epsilon_spent == 0
    assert math.isclose(quote.job_epsilon, rdp_curve(EVENT).scaled(20).epsilon(DELTA))
    assert ledger_db.budget_status(engine, "d").epsilon_reserved == 0  # a quote reserves nothing

    ledger_db.reserve(engine, "d", "j", EVENT, 20)
    for t in range(1, 6):
        ledger_db.commit_charge(engine, Charge("d", "j", t, EVENT))
    with pytest.raises(DuplicateCharge):
        ledger_db.commit_charge(engine, Charge("d", "j", 3, EVENT))
    status = ledger_db.budget_status(engine, "d")
    assert math.isclose(status.epsilon_spent, rdp_curve(EVENT).scaled(5).epsilon(DELTA), rel_tol=1e-9)
    assert math.isclose(status.epsilon_reserved, rdp_curve(EVENT).scaled(20).epsilon(DELTA), rel_tol=1e-9)

    assert ledger_db.refund(engine, "j") == 15
    assert ledger_db.refund(engine, "j") == 0  # idempotent
    status = ledger_db.budget_status(engine, "d")
    assert math.isclose(status.epsilon_reserved, status.epsilon_spent, rel_tol=1e-12)
    assert ledger_db.charged_iterations(engine, "j") == [(t, 0) for t in range(1, 6)]
    entries = ledger_db.ledger_entries(engine, "d")
    assert [e["iteration"] for e in entries] == [1, 2, 3, 4, 5]
    assert entries[0]["event"]["noise_multiplier"] == 1.0


def test_refused_job_reserves_nothing_and_charges_beyond_cap_are_refused(engine: Engine) -> None:
    cap = budget_admitting_exactly(1, 10)
    ledger_db.set_budget(engine, "d", cap, DELTA)
    ledger_db.reserve(engine, "d", "a", EVENT, 10)
    with pytest.raises(BudgetExceeded) as refused:
        ledger_db.reserve(engine, "d", "b", EVENT, 10)
    assert refused.value.budget == cap
    # An unreserved charge is admitted on its own only while it fits.
    with pytest.raises(BudgetExceeded):
        for t in range(1, 100):
            ledger_db.commit_charge(engine, Charge("d", "loose", t, EVENT))
    assert ledger_db.budget_status(engine, "d").epsilon_reserved <= cap


def test_budget_rules(engine: Engine) -> None:
    with pytest.raises(ledger_db.UnknownDataset):
        ledger_db.reserve(engine, "missing", "j", EVENT, 1)
    with pytest.raises(ValueError, match="delta"):
        ledger_db.set_budget(engine, "d", 1.0, 2.0)
    ledger_db.set_budget(engine, "d", 5.0, DELTA)
    ledger_db.commit_charge(engine, Charge("d", "j", 1, EVENT))
    with pytest.raises(ValueError, match="delta cannot change"):
        ledger_db.set_budget(engine, "d", 5.0, 1e-6)
    assert ledger_db.set_budget(engine, "d", 6.0, DELTA).epsilon_budget == 6.0
