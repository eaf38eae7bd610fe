"""The connection helpers that save round trips must keep their guarantees: atomic multi-table writes,
durable commits on every pooled connection, reads that leave no transaction open."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Column, Engine, Integer, MetaData, Table, func, insert, select, text, update
from sqlalchemy.exc import DBAPIError, IntegrityError

from privacy_wall.sqlengine import (
    autocommit_reads,
    create_db_engine,
    reading,
    relaxed_connection,
    run_writes,
    transaction,
)
from tests.dbservers import fresh_database

metadata = MetaData()
counters = Table("counters", metadata, Column("id", Integer, primary_key=True), Column("value", Integer))
events = Table("events", metadata, Column("id", Integer, primary_key=True))


@pytest.fixture(params=["sqlite", "postgresql"])
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Engine]:
    with fresh_database(request.param, tmp_path) as url:
        eng = create_db_engine(url, pool_size=1, max_overflow=0)  # one pooled connection: leaks show
        metadata.create_all(eng)
        with eng.begin() as conn:
            conn.execute(insert(counters).values(id=1, value=0))
        try:
            yield eng
        finally:
            eng.dispose()


def counter(engine: Engine) -> int:
    with reading(engine) as conn:
        return int(conn.execute(select(counters.c.value)).scalar_one())


def test_run_writes_is_all_or_nothing(engine: Engine) -> None:
    with transaction(engine) as conn:
        run_writes(conn, update(counters).values(value=counters.c.value + 1), insert(events).values(id=7))
    assert counter(engine) == 1
    # The second statement fails (duplicate key): the first must not have happened either.
    with pytest.raises(IntegrityError), transaction(engine) as conn:
        run_writes(conn, update(counters).values(value=counters.c.value + 1), insert(events).values(id=7))
    assert counter(engine) == 1
    with reading(engine) as conn:
        assert conn.execute(select(func.count()).select_from(events)).scalar_one() == 1


def test_a_held_connection_serves_reads_and_transactions_in_turn(engine: Engine) -> None:
    with engine.connect() as held:
        for expected in range(1, 4):
            with transaction(held) as conn:
                conn.execute(update(counters).values(value=counters.c.value + 1))
            with reading(held) as conn:
                assert conn.execute(select(counters.c.value)).scalar_one() == expected
            assert not held.in_transaction()


def test_relaxed_commits_never_leak_into_the_pool(engine: Engine) -> None:
    postgresql = engine.dialect.name == "postgresql"
    with relaxed_connection(engine) as relaxed:
        if postgresql:
            with reading(relaxed) as conn:
                assert conn.exec_driver_sql("SHOW synchronous_commit").scalar_one() == "off"
        with transaction(relaxed) as conn:
            run_writes(conn, update(counters).values(value=counters.c.value + 1), insert(events).values(id=1))
    assert counter(engine) == 1
    if postgresql:
        # The pool's only connection (charges are committed on such connections) still flushes on commit.
        with engine.begin() as conn:
            assert conn.execute(text("SHOW synchronous_commit")).scalar_one() == "on"


def test_autocommit_reads_leave_no_transaction_open(engine: Engine) -> None:
    other = create_db_engine(engine.url.render_as_string(hide_password=False))
    try:
        with engine.connect() as held:
            reads = autocommit_reads(held)
            with reading(reads) as conn:
                assert conn.execute(select(counters.c.value)).scalar_one() == 0
                postgresql = conn.dialect.name == "postgresql"
                pid = conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one() if postgresql else None
            assert not reads.in_transaction()
            with other.connect() as conn:
                if pid is not None:
                    state = conn.execute(
                        text("SELECT state FROM pg_stat_activity WHERE pid = :pid"), {"pid": pid}
                    ).scalar_one()
                    assert state == "idle"  # not "idle in transaction": no snapshot or lock held
            # A writer elsewhere is not blocked while the reader stays open (SQLite: no lock left).
            with transaction(other) as conn:
                conn.execute(update(counters).values(value=5))
            with reading(reads) as conn:
                assert conn.execute(select(counters.c.value)).scalar_one() == 5
    finally:
        other.dispose()


@pytest.mark.slow
def test_a_transaction_its_client_abandoned_frees_its_locks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client cut off mid-transaction sends nothing more: PostgreSQL ends its session after
    VIPS_IDLE_TRANSACTION_TIMEOUT_SECONDS, so the row it locked (a budget row) is not held for hours."""
    monkeypatch.setenv("VIPS_IDLE_TRANSACTION_TIMEOUT_SECONDS", "1")
    with fresh_database("postgresql", tmp_path) as url:
        eng = create_db_engine(url)
        try:
            metadata.create_all(eng)
            with eng.begin() as conn:
                conn.execute(insert(counters).values(id=1, value=0))
            abandoned = eng.connect()
            abandoned.execute(select(counters).where(counters.c.id == 1).with_for_update())
            started = time.monotonic()
            with eng.begin() as conn:  # waits for the abandoned transaction's lock, then gets it
                conn.exec_driver_sql("SET LOCAL lock_timeout = '10s'")  # without the timeout: an error
                conn.execute(update(counters).where(counters.c.id == 1).values(value=1))
            waited = time.monotonic() - started
            assert 0.5 < waited < 10, waited  # ended by the timeout (1 s), not by anything else
            with pytest.raises(DBAPIError, match="idle-in-transaction timeout"):  # its session is gone
                abandoned.execute(select(counters))
            abandoned.invalidate()
        finally:
            eng.dispose()


@pytest.mark.postgres
def test_a_client_gives_up_a_lost_server_in_bounded_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every PostgreSQL connection probes a silent server and drops unacknowledged sends after about
    VIPS_DATABASE_LOST_SECONDS (libpq's keepalives and tcp_user_timeout), and its session carries the
    idle-transaction timeout."""
    monkeypatch.setenv("VIPS_DATABASE_LOST_SECONDS", "30")
    monkeypatch.setenv("VIPS_IDLE_TRANSACTION_TIMEOUT_SECONDS", "45")
    with fresh_database("postgresql", tmp_path) as url:
        eng = create_db_engine(url)
        try:
            with eng.connect() as conn:
                params = conn.connection.dbapi_connection.info.get_parameters()  # type: ignore[union-attr]
                idle = conn.exec_driver_sql("SHOW idle_in_transaction_session_timeout").scalar_one()
        finally:
            eng.dispose()
    assert params["keepalives"] == "1" and params["tcp_user_timeout"] == "30000"
    assert int(params["keepalives_idle"]) + 3 * int(params["keepalives_interval"]) <= 30
    assert idle == "45s"
