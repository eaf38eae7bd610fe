"""Fixtures shared by the test modules."""

from __future__ import annotations

import gc
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine

from privacy_wall.sqlengine import create_db_engine
from tests.dbservers import finish_drops, fresh_database

#: The tests' root: LONGEST_FIRST names files under it.
TESTS = Path(__file__).parent


@pytest.fixture(params=["sqlite", "postgresql"])
def engines(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Engine, Engine]]:
    """A fresh control and sensitive database, migrated, on SQLite and on PostgreSQL (a module may define
    its own `engines`, e.g. with a dataset already ingested)."""
    with (
        fresh_database(request.param, tmp_path, "control") as control_url,
        fresh_database(request.param, tmp_path, "sensitive") as sensitive_url,
    ):
        control, sensitive = create_db_engine(control_url), create_db_engine(sensitive_url)
        try:
            yield control, sensitive
        finally:
            control.dispose()
            sensitive.dispose()


@pytest.fixture(scope="session", autouse=True)
def _dropped_databases() -> Iterator[None]:
    """Every PostgreSQL database a test made is dropped by the end of the session (a failed drop fails)."""
    yield
    finish_drops()


#: The longest test files (paths under tests/; their total time, measured with `--durations`), longest
#: first. Under `pytest -n 2 --dist loadfile` (make test) each process takes a whole file at a time:
#: started last, a long file would keep one process busy long after the other ran out of files, so these
#: start first and the other files follow in their usual order (an order only: every file runs, whether
#: listed or not).
LONGEST_FIRST = (
    "privacy_wall/test_privacy_audit.py",
    "test_ui_browser.py",
    "test_faults.py",
    "test_e2e.py",
    "privacy_wall/accounting/test_accountants.py",
    "test_embedded_faults.py",
    "privacy_wall/accounting/test_pld.py",
    "test_shards_e2e.py",
    "test_deployment.py",
    "privacy_wall/test_shards.py",
    "test_api.py",
    "privacy_wall/queries/test_sbn.py",
    "test_api_fuzz.py",
    "test_e2e_algorithms.py",
    "test_e2e_latent.py",
    "test_worker_memory.py",
    "vips/models/blr/test_dpsep.py",
    "privacy_wall/queries/test_dpsep.py",
    "test_demo.py",
    "test_cli_up.py",
)


def pytest_configure(config: pytest.Config) -> None:
    # pytest-xdist would otherwise order the files by their number of tests (--loadscope-reorder), which
    # puts the long one-test files (services started per test) last.
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:  # a test parametrised over the databases needs PostgreSQL in its postgresql case
        callspec = getattr(item, "callspec", None)
        if callspec is not None and "postgresql" in callspec.id.split("-"):
            item.add_marker(pytest.mark.postgres)
    rank = {name: place for place, name in enumerate(LONGEST_FIRST)}
    items.sort(
        key=lambda item: rank.get(item.path.relative_to(TESTS).as_posix(), len(rank))
    )  # stable: a file's tests keep their order


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Keep hypothesis's garbage-collection timer out of the process (issue 37): once a property test
    has run, hypothesis leaves a callback in gc.callbacks for the rest of the process, and a SIGINT the
    process gets later (execnet sends its own pytest-xdist worker one when the worker is slow to end)
    surfaced as a stray "Exception ignored in gc_callback ... KeyboardInterrupt" in the middle of `make
    test`. The timer only subtracts collection time from hypothesis's deadlines, which every property
    test here turns off (deadline=None)."""
    junkdrawer: Any = sys.modules.get("hypothesis.internal.conjecture.junkdrawer")
    if junkdrawer is None:
        return
    junkdrawer._gc_initialized = True  # never installs its callback; drop one installed already
    gc.callbacks[:] = [
        hook for hook in gc.callbacks if getattr(hook, "__module__", None) != junkdrawer.__name__
    ]
