"""The worker's dataset cache (issue 22, item 3): a full pass decodes a dataset version once; minibatches
of a cached version equal the database's rows; a new version (an append) replaces the old one; the budget
bounds the bytes kept; cached arrays cannot be written."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import scipy.sparse as sp
from sqlalchemy import Engine

from privacy_wall.data.dataset_cache import DatasetCache, batch_bytes, rows_of
from privacy_wall.data.db_store import DatabaseStore
from privacy_wall.data.ingest import ingest
from privacy_wall.data.store import Batch
from privacy_wall.sqlengine import create_db_engine
from tests.dbservers import fresh_database
from tests.privacy_wall.data.test_ingest_store import tabular_data, write_tabular

N, D = 300, 4


@pytest.fixture
def engines(tmp_path: Path) -> Iterator[tuple[Engine, Engine]]:
    with (
        fresh_database("sqlite", tmp_path, "control") as control_url,
        fresh_database("sqlite", tmp_path, "sensitive") as sensitive_url,
    ):
        control, sensitive = create_db_engine(control_url), create_db_engine(sensitive_url)
        x, y = tabular_data(n=N, d=D, seed=4)
        ingest(
            control=control, sensitive=sensitive, name="t", kind="tabular", label="label",
            path=write_tabular(tmp_path / "t.csv", x, y),
        )  # fmt: skip
        try:
            yield control, sensitive
        finally:
            control.dispose()
            sensitive.dispose()


def count_reads(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Counts the store's reads of the database (full passes and reads by id)."""
    reads = {"n": 0}

    def counted(real: Any) -> Any:
        def read(self: DatabaseStore, *args: Any) -> Any:
            reads["n"] += 1
            return real(self, *args)

        return read

    for method in ("_read_all", "_read_rows"):
        monkeypatch.setattr(DatabaseStore, method, counted(getattr(DatabaseStore, method)))
    return reads


def sorted_rows(batch: Batch) -> np.ndarray:
    """The batch's (features, label) rows in a canonical order (stores return rows in any order)."""
    assert batch.labels is not None
    table = np.column_stack([batch.features, batch.labels])
    return table[np.lexsort(table.T[::-1])]


def test_a_full_pass_reads_the_database_once_per_version(
    engines: tuple[Engine, Engine], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, sensitive = engines
    reads = count_reads(monkeypatch)
    cache = DatasetCache(1 << 30)
    first = DatabaseStore(sensitive, "t", cache).take(slice(None))
    again = DatabaseStore(sensitive, "t", cache).take(slice(None))  # another job on the same version
    assert reads["n"] == 1 and again is first and len(cache) == 1
    np.testing.assert_array_equal(
        sorted_rows(first), sorted_rows(DatabaseStore(sensitive, "t").take(slice(None)))
    )
    with pytest.raises(ValueError, match="read-only"):
        first.features[0, 0] = 2.0


def test_minibatches_of_a_cached_version_are_the_databases_rows(
    engines: tuple[Engine, Engine], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Random id sets, and the edges 0 and N - 1: the same rows as the database returns for those ids."""
    _, sensitive = engines
    cache = DatasetCache(1 << 30)
    store = DatabaseStore(sensitive, "t", cache)
    store.take(slice(None))
    uncached = DatabaseStore(sensitive, "t")
    reads = count_reads(monkeypatch)
    rng = np.random.default_rng(0)
    for ids in [np.array([0, N - 1]), rng.choice(N, 50, replace=False), np.arange(N)]:
        from_cache = store.take(ids)
        assert reads["n"] == 0
        np.testing.assert_array_equal(sorted_rows(from_cache), sorted_rows(uncached.take(ids)))
        reads["n"] = 0


def test_an_append_is_a_new_version_that_replaces_the_old(
    engines: tuple[Engine, Engine], tmp_path: Path
) -> None:
    control, sensitive = engines
    cache = DatasetCache(1 << 30)
    before = DatabaseStore(sensitive, "t", cache).take(slice(None))
    x, y = tabular_data(n=20, d=D, seed=9)
    ingest(
        control=control, sensitive=sensitive, name="t", kind="tabular", label="label", append=True,
        path=write_tabular(tmp_path / "more.csv", x, y),
    )  # fmt: skip
    after = DatabaseStore(sensitive, "t", cache).take(slice(None))
    assert before.size == N and after.size == N + 20 and len(cache) == 1


def test_the_budget_bounds_what_is_kept(
    engines: tuple[Engine, Engine], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, sensitive = engines
    size = N * D * 8 + N * 8
    small = DatasetCache(size - 1)
    reads = count_reads(monkeypatch)
    store = DatabaseStore(sensitive, "t", small)
    assert store.take(slice(None)).size == store.take(slice(None)).size == N
    assert reads["n"] == 2 and len(small) == 0  # too large: read on every pass, never kept
    cache = DatasetCache(size)
    DatabaseStore(sensitive, "t", cache).take(slice(None))
    assert len(cache) == 1


def test_the_lru_drops_the_least_recent_version_over_budget() -> None:
    def batch(n: int) -> Batch:
        return Batch(np.zeros((n, 2)), np.zeros(n))

    now = datetime.now(UTC)
    cache = DatasetCache(3 * batch_bytes(batch(10)))
    for name in "abc":
        cache.full((name, 10, now), lambda: batch(10))
    cache.get(("a", 10, now))  # a is now more recent than b
    cache.full(("d", 10, now), lambda: batch(10))
    assert cache.get(("b", 10, now)) is None
    assert all(cache.get((name, 10, now)) is not None for name in "acd")


def test_documents_are_cached_as_csr_rows() -> None:
    counts = sp.csr_array(np.array([[1, 0, 2], [0, 3, 0], [4, 0, 0]], dtype=np.int32))
    full = Batch.of_documents(counts)
    cache = DatasetCache(1 << 20)
    kept = cache.full(("docs", 3, datetime.now(UTC)), lambda: full)
    part = rows_of(kept, np.array([2, 0]))
    assert part.counts is not None
    np.testing.assert_array_equal(part.counts.toarray(), counts.toarray()[[2, 0]])
