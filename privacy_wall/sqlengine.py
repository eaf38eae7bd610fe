"""Engines for the project's databases: PostgreSQL in production, SQLite files for the embedded mode.

SQLite connections begin every transaction with BEGIN IMMEDIATE, so a transaction that reads a budget
and then writes a charge holds the database's write lock from its first statement: the SQLite
counterpart of PostgreSQL's SELECT ... FOR UPDATE on the budget row.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url

SQLITE_BUSY_TIMEOUT_SECONDS = 60


def create_db_engine(url: str, **kwargs: Any) -> Engine:
    """An engine for `url`; SQLite gets immediate transactions, a busy timeout and foreign keys."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        return create_engine(url, pool_pre_ping=True, **kwargs)
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
