"""Fixtures shared by the test modules."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from privacy_wall.sqlengine import create_db_engine
from tests.dbservers import fresh_database
from vips.migrate import upgrade


@pytest.fixture(params=["sqlite", "postgresql"])
def engines(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Engine, Engine]]:
    """A fresh control and sensitive database, migrated, on SQLite and on PostgreSQL (a module may define
    its own `engines`, e.g. with a dataset already ingested)."""
    with (
        fresh_database(request.param, tmp_path) as control_url,
        fresh_database(request.param, tmp_path) as sensitive_url,
    ):
        upgrade("control", control_url)
        upgrade("sensitive", sensitive_url)
        control, sensitive = create_db_engine(control_url), create_db_engine(sensitive_url)
        try:
            yield control, sensitive
        finally:
            control.dispose()
            sensitive.dispose()
