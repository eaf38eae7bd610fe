"""Ingestion into the sensitive database and the database row store, on SQLite and PostgreSQL."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import Engine, func, select

from privacy_wall.data.db_store import DatabaseStore
from privacy_wall.data.docword import BagOfWords, read_docword, read_vocabulary
from privacy_wall.data.ingest import IngestError, ingest, ingest_bag_of_words
from privacy_wall.data.schema import blocks, stored_datasets
from privacy_wall.data.store import BoundViolation, InMemoryTabularStore
from privacy_wall.data.vocabulary import DECLARED
from privacy_wall.gate import Gate
from privacy_wall.ledger import database as ledger_db
from privacy_wall.ledger.base import InMemoryLedger
from privacy_wall.ledger.schema import datasets
from privacy_wall.queries.blr import LogisticRegressionQuery
from privacy_wall.queries.lda import LdaQuery


def write_tabular(path: Path, features: np.ndarray, labels: np.ndarray) -> Path:
    header = ",".join([f"x{j}" for j in range(features.shape[1])] + ["label"])
    body = [
        ",".join(f"{v:.17g}" for v in row) + f",{int(y)}" for row, y in zip(features, labels, strict=True)
    ]
    path.write_text("\n".join([header, *body]) + "\n")
    return path


def tabular_data(n: int = 500, d: int = 4, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d))
    x /= np.maximum(1.0, np.linalg.norm(x, axis=1, keepdims=True))
    return x, (rng.random(n) < 0.5).astype(float)


def row_count(engine: Engine) -> int:
    """Rows stored in the sensitive database's blocks, all datasets."""
    with engine.connect() as conn:
        return int(conn.execute(select(func.coalesce(func.sum(blocks.c.row_count), 0))).scalar_one())


def test_tabular_round_trip_and_uniform_distinct_batches(
    engines: tuple[Engine, Engine], tmp_path: Path
) -> None:
    control, sensitive = engines
    x, y = tabular_data()
    meta = ingest(
        control=control,
        sensitive=sensitive,
        name="t",
        kind="tabular",
        path=write_tabular(tmp_path / "t.csv", x, y),
        label="label",
    )
    assert (meta.population, meta.dimension) == (500, 4)
    store = DatabaseStore(sensitive, "t")
    assert store.info.population == 500 and not store.info.public
    whole = store.sample(500, np.random.default_rng(0))
    np.testing.assert_array_equal(whole.features, x)  # exact float64 round trip
    np.testing.assert_array_equal(whole.labels, y)

    rng = np.random.default_rng(1)
    counts = np.zeros(500)
    lookup = {row.tobytes(): i for i, row in enumerate(x)}
    for _ in range(200):
        batch = store.sample(50, rng)
        ids = [lookup[row.tobytes()] for row in batch.features]
        assert len(set(ids)) == 50  # exactly S distinct rows
        counts[ids] += 1
    # Each row is in a batch with probability 0.1: 20 expected inclusions, binomial sd ~4.2.
    chi2 = float(((counts - 20) ** 2 / (20 * 0.9)).sum())
    assert chi2 < 500 + 4 * np.sqrt(2 * 500)  # chi-square(499) mean 499, sd ~32


def test_gate_over_database_store_and_ledger(engines: tuple[Engine, Engine], tmp_path: Path) -> None:
    control, sensitive = engines
    x, y = tabular_data()
    ingest(
        control=control,
        sensitive=sensitive,
        name="t",
        kind="tabular",
        path=write_tabular(tmp_path / "t.csv", x, y),
        label="label",
    )
    ledger_db.set_budget(control, "t", 10.0, 1e-5)
    gate = Gate(DatabaseStore(sensitive, "t"), ledger_db.SqlLedger(control))
    release = gate.release(
        LogisticRegressionQuery(),
        {"second_moment": np.eye(4)},
        job_id="j",
        iteration=1,
        sigma=2.0,
        batch_size=100,
    )
    assert release.statistics["s1"].shape == (4,)
    assert ledger_db.charged_iterations(control, "j") == [(1, 0)]


def test_bad_row_writes_nothing(engines: tuple[Engine, Engine], tmp_path: Path) -> None:
    control, sensitive = engines
    x, y = tabular_data()
    x[37] = [3.14159, 0, 0, 0]  # norm > 1 on data row 37 (file line 39)
    with pytest.raises(IngestError) as err:
        ingest(
            control=control,
            sensitive=sensitive,
            name="t",
            kind="tabular",
            path=write_tabular(tmp_path / "t.csv", x, y),
            label="label",
        )
    assert "line 39" in str(err.value) and "3.14" not in str(err.value)
    assert row_count(sensitive) == 0
    with control.connect() as conn:
        assert conn.execute(select(func.count()).select_from(datasets)).scalar_one() == 0
    with sensitive.connect() as conn:
        assert conn.execute(select(func.count()).select_from(stored_datasets)).scalar_one() == 0


def test_duplicate_name_and_bad_kind(engines: tuple[Engine, Engine], tmp_path: Path) -> None:
    control, sensitive = engines
    path = write_tabular(tmp_path / "t.csv", *tabular_data(20))
    ingest(control=control, sensitive=sensitive, name="t", kind="tabular", path=path, label="label")
    with pytest.raises(IngestError, match="already exists"):
        ingest(control=control, sensitive=sensitive, name="t", kind="tabular", path=path, label="label")
    with pytest.raises(IngestError, match="unknown kind"):
        ingest(control=control, sensitive=sensitive, name="u", kind="images", path=path)
    with pytest.raises(IngestError, match="--label"):
        ingest(control=control, sensitive=sensitive, name="u", kind="tabular", path=path)
    with pytest.raises(IngestError, match="dataset name"):
        ingest(control=control, sensitive=sensitive, name="../x", kind="tabular", path=path, label="label")
    assert row_count(sensitive) == 20


def test_bow_and_binary(engines: tuple[Engine, Engine], tmp_path: Path) -> None:
    control, sensitive = engines
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("apple\nbanana\ncherry\n")
    docword = tmp_path / "docword.txt"
    docword.write_text("3\n3\n4\n1 1 2\n1 3 1\n3 2 5\n3 3 1\n")
    meta = ingest(control=control, sensitive=sensitive, name="b", kind="bow", path=docword, vocab=vocab,
           vocabulary_public=True)  # fmt: skip
    assert (meta.population, meta.dimension) == (3, 3)  # the empty document 2 is kept
    documents = [(2, 0, 1), (0, 0, 0), (0, 5, 1)]
    bow = DatabaseStore(sensitive, "b")
    assert (bow.info.kind, bow.info.population, bow.info.dimension) == ("bow", 3, 3)
    whole = bow.sample(3, np.random.default_rng(0))
    assert whole.counts is not None and whole.size == 3 and whole.features.shape == (3, 0)
    assert sorted(map(tuple, whole.counts.toarray().tolist())) == sorted(documents)
    for seed in range(5):
        pair = bow.sample(2, np.random.default_rng(seed))
        assert pair.counts is not None
        rows = [tuple(r) for r in pair.counts.toarray().tolist()]
        assert len(set(rows)) == 2 and set(rows) <= set(documents)  # two distinct stored documents
    release = Gate(bow, InMemoryLedger(delta=1e-5)).release(
        LdaQuery(2, doc_length=10),
        {"expected_log_beta": np.log(np.full((2, 3), 1 / 3))},
        job_id="lda",
        iteration=1,
        sigma=1.0,
        batch_size=3,
    )
    assert release.statistics["s"].shape == (2, 3) and (release.statistics["s"] >= 0).all()
    docword.write_text("3\n3\n1\n1 4 2\n")
    with pytest.raises(IngestError, match=r"line 4.*wordID"):
        ingest(control=control, sensitive=sensitive, name="b2", kind="bow", path=docword, vocab=vocab,
           vocabulary_public=True)  # fmt: skip

    binary = tmp_path / "bin.csv"
    binary.write_text("p0,p1,p2\n1,0,1\n0,0,1\n")
    meta = ingest(control=control, sensitive=sensitive, name="img", kind="binary", path=binary, public=True)
    assert (meta.population, meta.dimension, meta.public) == (2, 3, True)
    store = DatabaseStore(sensitive, "img")
    whole = store.sample(2, np.random.default_rng(0))
    assert sorted(map(tuple, whole.features.tolist())) == [(0.0, 0.0, 1.0), (1.0, 0.0, 1.0)]
    assert whole.labels is None
    assert store.sample(1, np.random.default_rng(0)).features.shape == (1, 3)
    binary.write_text("p0,p1,p2\n1,0,1\n0,2,1\n")
    with pytest.raises(IngestError, match=r"line 3.*p1"):
        ingest(control=control, sensitive=sensitive, name="img2", kind="binary", path=binary)
    assert row_count(sensitive) == 5


def test_an_in_memory_corpus_is_stored_as_its_docword_file_would_be(
    engines: tuple[Engine, Engine], tmp_path: Path
) -> None:
    control, sensitive = engines
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("apple\nbanana\ncherry\n")
    docword = tmp_path / "docword.txt"
    docword.write_text("3\n3\n4\n1 1 2\n1 3 1\n3 2 5\n3 3 1\n")
    ingest(control=control, sensitive=sensitive, name="file", kind="bow", path=docword, vocab=vocab,
           vocabulary_public=True)  # fmt: skip
    corpus = read_docword(docword, read_vocabulary(vocab))
    meta = ingest_bag_of_words(
        control=control, sensitive=sensitive, name="memory", corpus=corpus, vocabulary_public=True
    )
    assert (meta.kind, meta.population, meta.dimension) == ("bow", 3, 3)
    assert meta.schema == {"vocabulary": ["apple", "banana", "cherry"], "vocabulary_source": DECLARED}
    with pytest.raises(IngestError, match="--vocab-is-public"):  # unconfirmed, as a file's would be
        ingest_bag_of_words(control=control, sensitive=sensitive, name="unconfirmed", corpus=corpus)
    everything = np.arange(3)
    from_file = DatabaseStore(sensitive, "file").take(everything).counts
    from_memory = DatabaseStore(sensitive, "memory").take(everything).counts
    assert from_file is not None and from_memory is not None
    np.testing.assert_array_equal(from_file.toarray(), from_memory.toarray())
    # Rows come back by id, in id order, whichever ids are asked for.
    np.testing.assert_array_equal(
        DatabaseStore(sensitive, "memory").take(np.array([2, 0])).counts.toarray(),  # type: ignore[union-attr]
        from_file.toarray()[[0, 2]],
    )
    # The checks read_docword makes of a file hold for an in-memory corpus too; nothing is written.
    bad_corpora = [
        (
            BagOfWords(corpus.indptr, corpus.word_ids, np.zeros_like(corpus.counts), corpus.vocabulary),
            "positive",
        ),
        (
            BagOfWords(corpus.indptr, corpus.word_ids + 2, corpus.counts, corpus.vocabulary),
            "document 0.*vocabulary",
        ),
        (
            BagOfWords(corpus.indptr, np.zeros_like(corpus.word_ids), corpus.counts, corpus.vocabulary),
            "twice",
        ),
        (BagOfWords(corpus.indptr[:-1], corpus.word_ids, corpus.counts, corpus.vocabulary), "CSR"),
    ]
    for bad, message in bad_corpora:
        with pytest.raises(IngestError, match=message):
            ingest_bag_of_words(control=control, sensitive=sensitive, name="bad", corpus=bad)
    assert row_count(sensitive) == 6


def test_regression_rows_keep_real_targets_in_the_unit_interval(
    engines: tuple[Engine, Engine], tmp_path: Path
) -> None:
    control, sensitive = engines
    x, _ = tabular_data(n=50, d=3, seed=4)
    y = np.linspace(-1.0, 1.0, 50)
    path = write_regression(tmp_path / "reg.csv", x, y)
    meta = ingest(control=control, sensitive=sensitive, name="r", kind="regression", path=path, label="y")
    assert (meta.kind, meta.population, meta.dimension) == ("regression", 50, 3)
    store = DatabaseStore(sensitive, "r")
    assert store.info.kind == "regression"
    whole = store.take(slice(None))
    assert whole.labels is not None
    order = np.argsort(whole.labels)
    np.testing.assert_array_equal(whole.labels[order], y)
    np.testing.assert_array_equal(whole.features[order], x)
    # A target outside [-1, 1] is refused naming its line, and nothing is written.
    path = write_regression(tmp_path / "big.csv", x, np.where(np.arange(50) == 7, 1.5, y))
    with pytest.raises(IngestError, match=r"line 9.*\[-1, 1\]") as refused:
        ingest(control=control, sensitive=sensitive, name="r2", kind="regression", path=path, label="y")
    assert "1.5" not in str(refused.value)
    # The same real targets are not 0/1 labels: as tabular data they are refused.
    with pytest.raises(IngestError, match="0 or 1"):
        ingest(control=control, sensitive=sensitive, name="r3", kind="tabular", path=path, label="y")
    assert row_count(sensitive) == 50
    with pytest.raises(BoundViolation, match="row 7"):
        InMemoryTabularStore("m", x, np.where(np.arange(50) == 7, -1.01, y), kind="regression")
    assert InMemoryTabularStore("m", x, y, kind="regression").info.kind == "regression"


def write_regression(path: Path, features: np.ndarray, targets: np.ndarray) -> Path:
    header = ",".join([f"x{j}" for j in range(features.shape[1])] + ["y"])
    body = [",".join(f"{v:.17g}" for v in [*row, t]) for row, t in zip(features, targets, strict=True)]
    path.write_text("\n".join([header, *body]) + "\n")
    return path


def test_a_full_pass_reads_in_blocks_what_reads_by_id_return(
    engines: tuple[Engine, Engine], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full pass decodes one block at a time (here of 7 rows, so 101 rows end in a partial block) into
    one array: the same rows as reading every id; rows past the population (a failed append's leftover)
    are not read."""
    from typing import Any

    from sqlalchemy import insert

    from privacy_wall.data import blocks as block_layout

    control, sensitive = engines
    monkeypatch.setattr(block_layout, "block_rows", lambda kind, dimension: 7)
    x, y = tabular_data(n=101, d=3, seed=8)
    ingest(
        control=control, sensitive=sensitive, name="t", kind="tabular", label="label",
        path=write_tabular(tmp_path / "t.csv", x, y),
    )  # fmt: skip
    bits = np.random.default_rng(2).integers(0, 2, size=(101, 5))
    binary = tmp_path / "bits.csv"
    binary.write_text("a,b,c,d,e\n" + "".join(",".join(map(str, r)) + "\n" for r in bits))
    ingest(control=control, sensitive=sensitive, name="bits", kind="binary", path=binary)
    with sensitive.begin() as conn:  # a leftover block beyond the population
        conn.execute(
            insert(blocks).values(
                dataset="t", first_row=101, row_count=1, features=np.ones(3).tobytes(), labels=b"\0" * 8
            )
        )
    for name, columns in (("t", 4), ("bits", 5)):
        store = DatabaseStore(sensitive, name)
        whole, by_id = store.take(slice(None)), store.take(np.arange(101))

        def table(batch: Any, columns: int = columns) -> np.ndarray:
            parts = [batch.features] if batch.labels is None else [batch.features, batch.labels]
            full = np.column_stack(parts)
            assert full.shape == (101, columns)
            return full[np.lexsort(full.T[::-1])]

        np.testing.assert_array_equal(table(whole), table(by_id))
    assert sorted(map(tuple, DatabaseStore(sensitive, "bits").take(slice(None)).features.tolist())) == sorted(
        map(tuple, bits.astype(float).tolist())
    )
