"""Real PostgreSQL and SQLite databases for tests: a fresh database per use, dropped afterwards.

Under CI (CI=true) a PostgreSQL server that cannot be reached is an error, never a skip.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, MetaData

POSTGRES_ADMIN_URL = os.environ.get("VIPS_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/postgres")


def _psycopg_dsn(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://")


def postgres_available() -> bool:
    import psycopg

    try:
        with psycopg.connect(_psycopg_dsn(POSTGRES_ADMIN_URL), connect_timeout=3):
            return True
    except psycopg.OperationalError:
        return False


def require_postgres() -> None:
    if postgres_available():
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"PostgreSQL at {POSTGRES_ADMIN_URL} is down under CI; .ci/run should have started it")
    pytest.skip(f"SKIPPED: no PostgreSQL at {POSTGRES_ADMIN_URL} (start it to run this test)")


@contextmanager
def fresh_postgres_database() -> Iterator[str]:
    """A new empty database; yields its SQLAlchemy URL and drops it afterwards."""
    import psycopg

    require_postgres()
    name = f"vips_test_{uuid.uuid4().hex[:12]}"
    admin = _psycopg_dsn(POSTGRES_ADMIN_URL)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    base = POSTGRES_ADMIN_URL.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://")
    try:
        yield f"{base}/{name}"
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextmanager
def fresh_database(kind: str, tmp_path: Path) -> Iterator[str]:
    """A fresh database of the given kind ("sqlite" or "postgresql"), as a SQLAlchemy URL."""
    if kind == "sqlite":
        yield f"sqlite:///{tmp_path / f'{uuid.uuid4().hex[:8]}.db'}"
    elif kind == "postgresql":
        with fresh_postgres_database() as url:
            yield url
    else:
        raise ValueError(kind)


def schema_drift(engine: Engine, metadata: MetaData, name: str) -> list[Any]:
    """What Alembic's autogenerate would change for the database behind `engine` to match `metadata`, on
    the tables whose name contains `name`: empty when the migrations build what the code declares."""
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    with engine.connect() as conn:
        diffs = compare_metadata(MigrationContext.configure(conn), metadata)
    return [diff for diff in diffs if name in repr(diff)]
