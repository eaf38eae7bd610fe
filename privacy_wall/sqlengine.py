"""Engines for the project's databases: PostgreSQL in production, SQLite files for the embedded mode.

SQLite connections begin every transaction with BEGIN IMMEDIATE, so a transaction that reads a budget
and then writes a charge holds the database's write lock from its first statement: the SQLite
counterpart of PostgreSQL's SELECT ... FOR UPDATE on the budget row.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, cast

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict
from sqlalchemy import Connection, CursorResult, Engine, Executable, create_engine, event
from sqlalchemy.engine import make_url

SQLITE_BUSY_TIMEOUT_SECONDS = 60


class DatabaseSettings(BaseSettings):
    """How long a PostgreSQL connection may wait on a peer that is gone (a network cut sends no reset).

    VIPS_IDLE_TRANSACTION_TIMEOUT_SECONDS: the server ends a session whose transaction has waited this long
    for its client; otherwise a client cut off mid-transaction would hold its row locks (the budget row's
    among them) until TCP notices, hours later, and every admission, charge and refund on that dataset would
    wait. Our transactions never idle for long. VIPS_DATABASE_LOST_SECONDS: the client gives up a connection
    whose server stops acknowledging (TCP keepalives, tcp_user_timeout) after about this long, instead of
    waiting for an answer that cannot come (the job is then resumed; see worker/jobs.py)."""

    model_config = SettingsConfigDict(env_prefix="VIPS_", extra="ignore")

    idle_transaction_timeout_seconds: float = Field(default=60.0, gt=0)
    database_lost_seconds: float = Field(default=60.0, ge=3)

    def postgresql_connect_args(self) -> dict[str, Any]:
        """libpq parameters: keepalive probes after a third of the bound, three of them a sixth apart."""
        lost, idle_ms = self.database_lost_seconds, round(self.idle_transaction_timeout_seconds * 1000)
        return {
            "options": f"-c idle_in_transaction_session_timeout={idle_ms}",
            "keepalives": 1,
            "keepalives_idle": max(1, round(lost / 3)),
            "keepalives_interval": max(1, round(lost / 6)),
            "keepalives_count": 3,
            "tcp_user_timeout": round(lost * 1000),
        }


def create_db_engine(url: str, **kwargs: Any) -> Engine:
    """An engine for `url`. PostgreSQL connections give up on a lost peer in bounded time (DatabaseSettings);
    SQLite gets immediate transactions, a busy timeout and foreign keys. A statement's parameters (rows,
    released values) never appear in its errors or in logs (hide_parameters)."""
    parsed = make_url(url)
    kwargs.setdefault("hide_parameters", True)  # errors and logs never quote the values of a statement
    if parsed.get_backend_name() != "sqlite":
        connect_args = {**DatabaseSettings().postgresql_connect_args(), **kwargs.pop("connect_args", {})}
        return create_engine(url, pool_pre_ping=True, connect_args=connect_args, **kwargs)
    engine = create_engine(
        url, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_SECONDS, "check_same_thread": False}, **kwargs
    )

    @event.listens_for(engine, "connect")
    def _connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None  # let the "begin" hook below issue BEGIN itself
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _begin(connection: Any) -> None:
        connection.exec_driver_sql("BEGIN IMMEDIATE")

    return engine


#: Where a function runs its statements: an engine (a pooled connection per call) or an open connection
#: that the caller holds across calls (a job's iterations, a request), saving a checkout and its ping.
Bind = Engine | Connection


@contextmanager
def transaction(bind: Bind) -> Iterator[Connection]:
    """A transaction committed on exit (rolled back on error), on a fresh or on the caller's connection."""
    if isinstance(bind, Engine):
        with bind.begin() as conn:
            yield conn
    else:
        with bind.begin():
            yield bind


@contextmanager
def reading(bind: Bind) -> Iterator[Connection]:
    """A connection for reads only: a fresh one in autocommit (see `autocommit_reads`), or the caller's,
    whose implicit transaction is ended afterwards."""
    if isinstance(bind, Engine):
        with bind.connect() as conn:
            yield autocommit_reads(conn)
        return
    try:
        yield bind
    finally:
        if bind.in_transaction():
            bind.rollback()


def autocommit_reads(conn: Connection) -> Connection:
    """On PostgreSQL, let each read on this connection run without BEGIN and ROLLBACK round trips (the
    pool restores the isolation level when the connection returns).

    Only for connections that never write: an autocommit connection's `begin()` is not atomic. SQLite
    keeps its transactions (the embedded mode is not where round trips matter).
    """
    if conn.dialect.name == "postgresql":
        return conn.execution_options(isolation_level="AUTOCOMMIT")
    return conn


def run_writes(
    conn: Connection, *statements: Executable, parameters: dict[str, Any] | None = None
) -> CursorResult[Any]:
    """Run INSERT/UPDATE statements in one transaction; on PostgreSQL as one statement (one round trip).
    `parameters` fills the statements' bindparam()s (shared names mean the same value). Returns the last
    statement's result (for its RETURNING rows).

    PostgreSQL runs data-modifying CTEs on one snapshot in unspecified order, so the statements must not
    depend on each other's effects (here they always write different tables).
    """
    if not statements:
        raise ValueError("run_writes needs at least one statement")
    if conn.dialect.name == "postgresql" and len(statements) > 1:
        *first, last = statements
        ctes = [cast(Any, statement).cte(f"write_{i}") for i, statement in enumerate(first)]
        return conn.execute(cast(Any, last).add_cte(*ctes), parameters)
    *first, last = statements
    for statement in first:
        conn.execute(statement, parameters)
    return conn.execute(cast(Any, last), parameters)


@contextmanager
def relaxed_connection(engine: Engine) -> Iterator[Connection]:
    """A connection whose writes commit without waiting for their WAL flush (PostgreSQL), one statement
    per transaction (autocommit). SQLite: an ordinary connection.

    Only for writes whose loss errs on the safe side (see worker/stored_releases.py). The connection is
    detached from the pool, so the setting can never leak into a pooled connection that writes charges.
    """
    with engine.connect() as conn:
        if conn.dialect.name != "postgresql":
            yield conn
            return
        conn.execution_options(isolation_level="AUTOCOMMIT")
        conn.exec_driver_sql("SET synchronous_commit TO OFF")
        conn.commit()  # ends SQLAlchemy's implicit transaction (autocommit: nothing is sent)
        conn.detach()
        yield conn
