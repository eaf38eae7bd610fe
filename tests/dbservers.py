"""Real PostgreSQL and SQLite databases for tests: a fresh database per use, dropped afterwards.

Under CI (CI=true) a PostgreSQL server that cannot be reached is an error, never a skip.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, MetaData

from tests.servers import may_use
from vips.migrate import History, upgrade

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
    may_use("PostgreSQL", "postgres")
    if postgres_available():
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"PostgreSQL at {POSTGRES_ADMIN_URL} is down under CI; .ci/run should have started it")
    pytest.skip(f"SKIPPED: no PostgreSQL at {POSTGRES_ADMIN_URL} (start it to run this test)")


#: Drops the databases tests are done with while the next tests run (a DROP DATABASE waits for a
#: checkpoint: up to a second on a busy machine; drops running at once share one). At exit the interpreter
#: waits for its queue.
_dropper = ThreadPoolExecutor(max_workers=4, thread_name_prefix="drop-database")
_drops: list[Future[None]] = []
#: Per process, for each kind and history: a database brought to the history's head once, which
#: fresh_database(..., at_head=history) copies (a SQLite file, or a PostgreSQL template database).
_templates: dict[tuple[str, History], str] = {}
#: The (history, URL) of every database made as such a copy: at its head already (see `migrate`).
_at_head: set[tuple[History, str]] = set()


def _drop(name: str) -> None:
    import psycopg

    with psycopg.connect(_psycopg_dsn(POSTGRES_ADMIN_URL), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def finish_drops() -> None:
    """Drop this process's template databases; wait for every database handed to the dropper and raise
    the first drop that failed."""
    for (kind, _), template in list(_templates.items()):
        if kind == "postgresql":
            _drops.append(_dropper.submit(_drop, template))
        else:
            shutil.rmtree(Path(template).parent, ignore_errors=True)
    _templates.clear()
    while _drops:
        _drops.pop(0).result()


def _postgres_url(name: str) -> str:
    base = POSTGRES_ADMIN_URL.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://")
    return f"{base}/{name}"


def _create_postgres_database(template: str | None = None) -> str:
    """A new database (empty, or a copy of `template`); its name."""
    import psycopg

    require_postgres()
    name = f"vips_test_{uuid.uuid4().hex[:12]}"
    copy = "" if template is None else f' TEMPLATE "{template}"'
    with psycopg.connect(_psycopg_dsn(POSTGRES_ADMIN_URL), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"{copy}')
    return name


def _template(kind: str, history: History) -> str:
    """This process's database of `kind` at `history`'s head (made by the migrations on first use): a
    SQLite file's path, or a PostgreSQL database's name. Nothing connects to it once it is made."""
    if (kind, history) not in _templates:
        if kind == "sqlite":
            path = Path(tempfile.mkdtemp(prefix="vips-template-")) / f"{history}.db"
            upgrade(history, f"sqlite:///{path}")
            leftovers = [p.name for p in path.parent.iterdir() if p != path]
            assert not leftovers, f"the migrated template left {leftovers} beside it"  # all in the file
            _templates[kind, history] = str(path)
        else:
            name = _create_postgres_database()
            upgrade(history, _postgres_url(name))  # its engine is disposed: no session stays on it
            _templates[kind, history] = name
    return _templates[kind, history]


@contextmanager
def fresh_postgres_database(template: str | None = None) -> Iterator[str]:
    """A new empty database (or a copy of the database `template`); yields its SQLAlchemy URL and drops it
    afterwards (in the background: its name is never used again, and the drop's FORCE ends every
    connection left to it)."""
    name = _create_postgres_database(template)
    try:
        yield _postgres_url(name)
    finally:
        _drops.append(_dropper.submit(_drop, name))


@contextmanager
def fresh_database(kind: str, tmp_path: Path, at_head: History | None = None) -> Iterator[str]:
    """A fresh database of the given kind ("sqlite" or "postgresql"), as a SQLAlchemy URL: empty, or with
    `at_head` at that history's latest migration, as vips.migrate.upgrade leaves a fresh database (a copy
    of one this process migrated once, rather than every migration run again)."""
    if kind == "sqlite":
        url = f"sqlite:///{tmp_path / f'{uuid.uuid4().hex[:8]}.db'}"
        if at_head is not None:
            migrate(at_head, url)
        yield url
    elif kind == "postgresql":
        with fresh_postgres_database(None if at_head is None else _template(kind, at_head)) as url:
            if at_head is not None:
                _at_head.add((at_head, url))
            yield url
    else:
        raise ValueError(kind)


def migrate(history: History, url: str) -> None:
    """vips.migrate.upgrade(history, url) for a test's database: a SQLite file not created yet becomes a
    copy of this process's migrated one; a database fresh_database made at this head is left as it is."""
    if (history, url) in _at_head:
        return
    if url.startswith("sqlite:///") and not (path := Path(url.removeprefix("sqlite:///"))).exists():
        shutil.copyfile(_template("sqlite", history), path)
        _at_head.add((history, url))
        return
    upgrade(history, url)


def schema_drift(engine: Engine, metadata: MetaData, name: str) -> list[Any]:
    """What Alembic's autogenerate would change for the database behind `engine` to match `metadata`, on
    the tables whose name contains `name`: empty when the migrations build what the code declares."""
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    with engine.connect() as conn:
        diffs = compare_metadata(MigrationContext.configure(conn), metadata)
    return [diff for diff in diffs if name in repr(diff)]
