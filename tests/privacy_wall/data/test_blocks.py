"""The sensitive store's blocks of columns: reads by id equal the rows ingested, at block edges and for
random id sets, for every kind; the cache serves minibatches of data that fits it; migration s0002 moves
per-row storage into blocks and back, values exact. On SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import scipy.sparse as sp
import sqlalchemy as sa
from alembic import command
from sqlalchemy import Engine, insert, select

from privacy_wall.data import blocks as block_layout
from privacy_wall.data.dataset_cache import DatasetCache
from privacy_wall.data.db_store import DatabaseStore
from privacy_wall.data.docword import BagOfWords
from privacy_wall.data.ingest import ingest, ingest_bag_of_words
from privacy_wall.data.schema import blocks, stored_datasets
from privacy_wall.data.store import Batch
from privacy_wall.sqlengine import create_db_engine
from tests.dbservers import fresh_database
from tests.privacy_wall.data.test_ingest_store import tabular_data, write_tabular
from vips.migrate import alembic_config

N, D, V = 101, 4, 9
#: Rows per block in these tests: 101 rows are 14 full blocks and one of 3.
PER_BLOCK = 7


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """PER_BLOCK rows per block, so 101 rows span many blocks and end in a partial one."""
    monkeypatch.setattr(block_layout, "block_rows", lambda kind, dimension: PER_BLOCK)


def corpus(seed: int = 3) -> BagOfWords:
    """N documents over V words, some empty, as CSR arrays."""
    rng = np.random.default_rng(seed)
    dense = rng.poisson(0.4, size=(N, V)) * (rng.random((N, 1)) < 0.9)
    matrix = sp.csr_array(dense)
    return BagOfWords(
        vocabulary=[f"w{j}" for j in range(V)],
        indptr=matrix.indptr.astype(np.int64),
        word_ids=matrix.indices.astype(np.int64),
        counts=matrix.data.astype(np.int64),
    )


def stored_kinds(control: Engine, sensitive: Engine, tmp_path: Path) -> dict[str, np.ndarray]:
    """Ingest one dataset of each kind; each one's rows as a dense table (features, then the label)."""
    x, y = tabular_data(n=N, d=D, seed=4)
    ingest(
        control=control, sensitive=sensitive, name="tab", kind="tabular", label="label",
        path=write_tabular(tmp_path / "t.csv", x, y),
    )  # fmt: skip
    bits = np.random.default_rng(5).integers(0, 2, size=(N, 11))
    (tmp_path / "bits.csv").write_text(
        ",".join(f"c{j}" for j in range(11)) + "\n" + "".join(",".join(map(str, r)) + "\n" for r in bits)
    )
    ingest(control=control, sensitive=sensitive, name="bits", kind="binary", path=tmp_path / "bits.csv")
    documents = corpus()
    ingest_bag_of_words(
        control=control, sensitive=sensitive, name="docs", corpus=documents, vocabulary_public=True
    )
    counts = sp.csr_array((documents.counts, documents.word_ids, documents.indptr), shape=(N, V))
    return {"tab": np.column_stack([x, y]), "bits": bits.astype(float), "docs": counts.toarray()}


def as_table(batch: Batch) -> np.ndarray:
    if batch.counts is not None:
        return np.asarray(batch.counts.toarray())
    return batch.features if batch.labels is None else np.column_stack([batch.features, batch.labels])


EDGES = np.array([0, PER_BLOCK - 1, PER_BLOCK, 2 * PER_BLOCK - 1, 2 * PER_BLOCK, 97, 98, N - 1])


def test_blocks_tile_the_rows_and_reads_by_id_return_exactly_those_rows(
    engines: tuple[Engine, Engine], tmp_path: Path
) -> None:
    control, sensitive = engines
    tables = stored_kinds(control, sensitive, tmp_path)
    with sensitive.connect() as conn:
        layout = conn.execute(
            select(blocks.c.first_row, blocks.c.row_count)
            .where(blocks.c.dataset == "tab")
            .order_by("first_row")
        ).all()
    assert [tuple(r) for r in layout] == [(f, min(PER_BLOCK, N - f)) for f in range(0, N, PER_BLOCK)]
    rng = np.random.default_rng(0)
    id_sets = [EDGES, np.array([N - 1]), np.arange(N)] + [
        rng.choice(N, size, replace=False) for size in (1, 5, 30, 80)
    ]
    for name, table in tables.items():
        store = DatabaseStore(sensitive, name)
        np.testing.assert_array_equal(as_table(store.take(slice(None))), table)
        for ids in id_sets:
            np.testing.assert_array_equal(as_table(store.take(ids)), table[np.sort(ids)])


def test_the_cache_serves_minibatches_of_data_that_fits_and_blocks_serve_the_rest(
    engines: tuple[Engine, Engine], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    control, sensitive = engines
    table = stored_kinds(control, sensitive, tmp_path)["tab"]
    calls: dict[str, int] = {"_read_all": 0, "_read_rows": 0}

    def counted(method: str) -> Any:
        real = getattr(DatabaseStore, method)

        def read(self: DatabaseStore, *args: Any) -> Any:
            calls[method] += 1
            return real(self, *args)

        return read

    for method in calls:
        monkeypatch.setattr(DatabaseStore, method, counted(method))
    ids = np.array([3, 50, 99])
    fits = DatabaseStore(sensitive, "tab", DatasetCache(1 << 20))
    for _ in range(3):
        np.testing.assert_array_equal(as_table(fits.take(ids)), table[ids])
    assert calls == {"_read_all": 1, "_read_rows": 0}  # read once, then from memory
    too_small = DatabaseStore(sensitive, "tab", DatasetCache(N * (D + 1) * 8 - 1))
    for _ in range(3):
        np.testing.assert_array_equal(as_table(too_small.take(ids)), table[ids])
    assert calls == {"_read_all": 1, "_read_rows": 3}  # only the blocks the ids fall in, every time


def test_a_block_missing_inside_the_population_is_an_error_not_a_short_batch(
    engines: tuple[Engine, Engine], tmp_path: Path
) -> None:
    control, sensitive = engines
    stored_kinds(control, sensitive, tmp_path)
    with sensitive.begin() as conn:
        conn.execute(sa.delete(blocks).where(blocks.c.dataset == "tab", blocks.c.first_row == PER_BLOCK))
    for selected in (slice(None), np.array([0, 1])):
        with pytest.raises(RuntimeError, match="do not hold its population"):
            DatabaseStore(sensitive, "tab").take(selected)


# ---- migration s0002: per-row storage into blocks and back ----------------------------------------------

OLD_ROWS = sa.table(
    "rows",
    sa.column("dataset", sa.String),
    sa.column("row_id", sa.Integer),
    sa.column("payload", sa.LargeBinary),
    sa.column("label", sa.Float),
)


def old_rows(seed: int = 6) -> dict[str, tuple[str, int, list[tuple[int, bytes, float | None]]]]:
    """Datasets as revision s0001 stored them: (kind, dimension, [(row id, payload, label)]), with a
    leftover row past a population."""
    rng = np.random.default_rng(seed)
    n = 4100 + 3  # more than one block of the migration
    x = rng.normal(size=(n, 3)) / 4
    tab = [(i, x[i].astype("<f8").tobytes(), float(i % 2)) for i in range(n)]
    bits = [(i, np.packbits(rng.integers(0, 2, size=10).astype(np.uint8)).tobytes(), None) for i in range(50)]
    docs = []
    for i in range(40):
        ids = np.sort(rng.choice(V, size=int(rng.integers(0, 4)), replace=False)).astype("<i4")
        counts = rng.integers(1, 5, size=ids.size).astype("<i4")
        docs.append((i, ids.tobytes() + counts.tobytes(), None))
    return {"tab": ("tabular", 3, tab), "bits": ("binary", 10, bits), "docs": ("bow", V, docs)}


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_migration_s0002_moves_rows_into_blocks_and_back(tmp_path: Path, backend: str) -> None:
    datasets = old_rows()
    with fresh_database(backend, tmp_path) as url:
        config = alembic_config("sensitive", url)
        command.upgrade(config, "s0001")
        engine = create_db_engine(url)
        try:
            with engine.begin() as conn:
                for name, (kind, dimension, rows) in datasets.items():
                    conn.execute(
                        insert(stored_datasets).values(
                            name=name, kind=kind, population=len(rows), dimension=dimension, public=False,
                            created_at=datetime.now(UTC),
                        )
                    )  # fmt: skip
                    values = [{"dataset": name, "row_id": i, "payload": p, "label": y} for i, p, y in rows]
                    conn.execute(insert(OLD_ROWS), values)
                leftover = {"dataset": "bits", "row_id": 50, "payload": b"\xff\xc0", "label": None}
                conn.execute(insert(OLD_ROWS), [leftover])  # past the population: not carried over
            command.upgrade(config, "s0002")
            tab = DatabaseStore(engine, "tab").take(slice(None))
            expected = np.array([np.frombuffer(p, dtype="<f8") for _, p, _ in datasets["tab"][2]])
            np.testing.assert_array_equal(tab.features, expected)
            np.testing.assert_array_equal(tab.labels, [y for _, _, y in datasets["tab"][2]])
            docs = DatabaseStore(engine, "docs").take(np.array([0, 39]))
            assert docs.counts is not None and docs.counts.shape == (2, V)
            assert DatabaseStore(engine, "bits").take(slice(None)).size == 50
            command.downgrade(config, "s0001")
            with engine.connect() as conn:
                for name, (_, _, rows) in datasets.items():
                    back = conn.execute(
                        select(OLD_ROWS.c.row_id, OLD_ROWS.c.payload, OLD_ROWS.c.label)
                        .where(OLD_ROWS.c.dataset == name)
                        .order_by(OLD_ROWS.c.row_id)
                    ).all()
                    assert [(i, bytes(p), y) for i, p, y in back] == rows
        finally:
            engine.dispose()


@pytest.mark.postgres
def test_a_lost_postgresql_connection_is_reported_as_sqlalchemy_reports_it(tmp_path: Path) -> None:
    """Block reads on PostgreSQL go through the driver's binary cursor; a dropped connection still comes out
    as SQLAlchemy's OperationalError, the failure the gate knows tells nothing of the values."""
    from sqlalchemy.exc import OperationalError

    with (
        fresh_database("postgresql", tmp_path, "control") as control_url,
        fresh_database("postgresql", tmp_path, "sensitive") as url,
    ):
        control, sensitive = create_db_engine(control_url), create_db_engine(url)
        try:
            x, y = tabular_data(n=N, d=D, seed=4)
            ingest(
                control=control, sensitive=sensitive, name="tab", kind="tabular", label="label",
                path=write_tabular(tmp_path / "t.csv", x, y),
            )  # fmt: skip
            with sensitive.connect() as conn:
                store = DatabaseStore(conn, "tab")
                store.take(np.array([0]))  # the block index is read
                driver = conn.connection.driver_connection
                assert driver is not None
                driver.close()
                for selected in (slice(None), np.array([1, 2])):
                    with pytest.raises(OperationalError):
                        store.take(selected)
                conn.invalidate()
        finally:
            control.dispose()
            sensitive.dispose()
