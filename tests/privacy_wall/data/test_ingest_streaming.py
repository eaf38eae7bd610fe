"""Streaming ingestion (issue 22.1): files parsed block by block and written chunk by chunk give the same
stored rows and the same errors (naming the same line) as one block; `--append` adds rows while the dataset
has no charge and no open reservation; a failed ingest or append leaves nothing (or the dataset as it was);
the leftover of a killed ingest does not block the next one. On SQLite and PostgreSQL."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sqlalchemy import Engine, func, insert, select

import privacy_wall.data.ingest as ingest_module
from privacy_wall.accounting.events import SubsampledGaussianEvent
from privacy_wall.data import blocks as block_layout
from privacy_wall.data.db_store import DatabaseStore
from privacy_wall.data.docword import read_docword, read_vocabulary
from privacy_wall.data.formats import FormatError, TabularStream, read_binary_csv, read_tabular_csv
from privacy_wall.data.ingest import IngestError, encode_bag_of_words, ingest, store_encoded
from privacy_wall.data.schema import blocks, stored_datasets
from privacy_wall.gate import Gate
from privacy_wall.ledger import database as ledger_db
from privacy_wall.ledger.schema import datasets
from privacy_wall.queries.blr import LogisticRegressionQuery
from vips.cli import main

#: Block sizes from one byte (every block a line) to the whole file at once.
BLOCKS = (1, 7, 100, 1 << 20)
SECRET = "0.7777"


def tabular_data(n: int, d: int = 3, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d))
    x /= np.maximum(1.0, np.linalg.norm(x, axis=1, keepdims=True))
    return x, (rng.random(n) < 0.5).astype(float)


def write_tabular(path: Path, x: np.ndarray, y: np.ndarray, *, crlf: bool = False) -> Path:
    lines = [",".join([f"x{j}" for j in range(x.shape[1])] + ["label"])]
    lines += [",".join(f"{v:.17g}" for v in row) + f",{int(t)}" for row, t in zip(x, y, strict=True)]
    end = "\r\n" if crlf else "\n"
    path.write_bytes((end.join(lines) + end).encode())
    return path


def stored(sensitive: Engine, name: str) -> tuple[int, list[tuple[int, bytes, float | None]]]:
    """The stored population and every stored row (id, its features' bytes, label) of a dense dataset,
    read from its blocks, leftovers past the population included."""
    with sensitive.connect() as conn:
        meta = conn.execute(select(stored_datasets).where(stored_datasets.c.name == name)).one()
        found = conn.execute(
            select(blocks).where(blocks.c.dataset == name).order_by(blocks.c.first_row)
        ).all()
    rows = []
    for block in found:
        batch = block_layout.decode(meta.kind, meta.dimension, block.row_count, block.features, block.labels)
        for r in range(batch.size):
            label = None if batch.labels is None else float(batch.labels[r])
            rows.append((block.first_row + r, batch.features[r].tobytes(), label))
    return int(meta.population), rows


def leftover_block(first_row: int, row_count: int = 7) -> dict[str, object]:
    """A killed ingest's block of dataset "t" (3 features), its values junk."""
    return {
        "dataset": "t",
        "first_row": first_row,
        "row_count": row_count,
        "features": b"junk",
        "labels": b"\0" * 8 * row_count,
    }


def catalogued(control: Engine, name: str) -> int | None:
    with control.connect() as conn:
        found = conn.execute(
            select(datasets.c.population).where(datasets.c.name == name)
        ).scalar_one_or_none()
    return None if found is None else int(found)


def counts(control: Engine, sensitive: Engine) -> tuple[int, int, int]:
    with control.connect() as conn:
        entries = int(conn.execute(select(func.count()).select_from(datasets)).scalar_one())
    with sensitive.connect() as conn:
        stores = int(conn.execute(select(func.count()).select_from(stored_datasets)).scalar_one())
        written = int(conn.execute(select(func.coalesce(func.sum(blocks.c.row_count), 0))).scalar_one())
    return entries, stores, written


def test_readers_give_the_same_values_for_every_block_size(tmp_path: Path) -> None:
    x, y = tabular_data(40)
    path = write_tabular(tmp_path / "t.csv", x, y, crlf=True)
    with path.open("ab") as out:
        out.write(b"\r\n  \n\n")  # trailing blank lines, split across blocks for small ones
    for block in BLOCKS:
        table = read_tabular_csv(path, "label", block_bytes=block)
        np.testing.assert_array_equal(table.features, x)
        assert table.labels is not None
        np.testing.assert_array_equal(table.labels, y)
        assert table.feature_names == ("x0", "x1", "x2")
    binary = tmp_path / "b.csv"
    bits = (np.arange(60).reshape(20, 3) % 4 == 1).astype(int)
    binary.write_text("p,q,r\n" + "".join(",".join(map(str, r)) + "\n" for r in bits))
    for block in BLOCKS:
        np.testing.assert_array_equal(read_binary_csv(binary, block_bytes=block).features, bits)
    stream = TabularStream(path, "label", block_bytes=200)
    chunks = list(stream.chunks())
    assert len(chunks) > 5
    assert [c.first_line for c in chunks] == list(np.cumsum([2] + [c.rows for c in chunks[:-1]]))


def _with_line(tmp_path: Path, line: int, text: str, *, header: str = "a,b,label", rows: int = 30) -> Path:
    """A valid 0/1-labelled file of `rows` data rows whose file line `line` is replaced by `text`."""
    lines = [header] + [f"0.{i % 9},0.1,{i % 2}" for i in range(rows)]
    lines[line - 1] = text
    path = tmp_path / f"bad{line}.csv"
    path.write_bytes(("\n".join(lines) + "\n").encode("utf-8", "surrogateescape"))
    return path


@pytest.mark.parametrize(
    ("text", "words"),
    [
        (f"0.1,{SECRET}x,1", "line 27, column 'b': not a number"),
        ("0.1,,1", "line 27, column 'b': empty cell"),
        ("0.1, ,1", "line 27, column 'b': empty cell"),
        (f'"{SECRET}",0.1,1', "line 27, column 'a': not a number"),
        ("0.1,inf,1", "line 27, column 'b': non-finite value"),
        ("0.1,1e999,1", "line 27, column 'b': non-finite value"),
        ("0.1,0.2", "line 27: 2 cells, but the header has 3 columns"),
        (f"0.1,0.2,{SECRET},1", "line 27: 4 cells, but the header has 3 columns"),
        ("", "line 27: empty line between data rows"),
        ("   ", "line 27: empty line between data rows"),
        (f"0.1,{SECRET},2", "line 27, column 'label': a label must be 0 or 1 (1 rows break this)"),
        ("0.1,\x00,1", "line 27: a NUL byte at byte 5 of the line"),
        ("0.1,\udcff,1", "line 27: not UTF-8 text (bad byte at byte 5)"),
    ],
)
def test_an_error_in_a_later_block_names_its_line(tmp_path: Path, text: str, words: str) -> None:
    path = _with_line(tmp_path, 27, text)
    messages = set()
    for block in BLOCKS:
        with pytest.raises(FormatError) as err:
            read_tabular_csv(path, "label", block_bytes=block)
        messages.add(str(err.value))
    assert len(messages) == 1, messages  # the same error whatever the block size
    (message,) = messages
    assert words in message and SECRET not in message, message


def test_label_errors_count_every_block(tmp_path: Path) -> None:
    lines = ["a,label"] + [f"0.1,{2 if i in (3, 17, 29) else 1}" for i in range(30)]
    path = tmp_path / "l.csv"
    path.write_text("\n".join(lines) + "\n")
    for block in BLOCKS:
        with pytest.raises(FormatError, match=r"line 5, column 'label'.*\(3 rows break this\)"):
            read_tabular_csv(path, "label", block_bytes=block)


def test_chunked_ingest_stores_what_one_block_stores(engines: tuple[Engine, Engine], tmp_path: Path) -> None:
    control, sensitive = engines
    x, y = tabular_data(60)
    path = write_tabular(tmp_path / "t.csv", x, y)
    ingest(control=control, sensitive=sensitive, name="whole", kind="tabular", path=path, label="label")
    ingest(
        control=control,
        sensitive=sensitive,
        name="parts",
        kind="tabular",
        path=path,
        label="label",
        block_bytes=300,  # about five rows a block: a dozen transactions
    )
    assert stored(sensitive, "parts") == stored(sensitive, "whole")
    assert stored(sensitive, "parts")[0] == 60 == catalogued(control, "parts")
    batch = DatabaseStore(sensitive, "parts").take(slice(None))
    np.testing.assert_array_equal(batch.features, x)
    np.testing.assert_array_equal(batch.labels, y)
    # Binary data too.
    binary = tmp_path / "b.csv"
    bits = (np.arange(90).reshape(30, 3) % 4 == 1).astype(int)
    binary.write_text("p,q,r\n" + "".join(",".join(map(str, r)) + "\n" for r in bits))
    ingest(control=control, sensitive=sensitive, name="b1", kind="binary", path=binary)
    ingest(control=control, sensitive=sensitive, name="b2", kind="binary", path=binary, block_bytes=20)
    assert stored(sensitive, "b1") == stored(sensitive, "b2")


def test_a_bad_row_in_the_last_block_writes_nothing(engines: tuple[Engine, Engine], tmp_path: Path) -> None:
    control, sensitive = engines
    x, y = tabular_data(60)
    x[58] = [0.9, 0.9, 0.0]  # norm > 1 on line 60
    path = write_tabular(tmp_path / "t.csv", x, y)
    with pytest.raises(IngestError, match=r"line 60: the row's L2 norm is above 1 \(1 rows in all\)"):
        ingest(
            control=control,
            sensitive=sensitive,
            name="t",
            kind="tabular",
            path=path,
            label="label",
            block_bytes=300,
        )
    assert counts(control, sensitive) == (0, 0, 0)


def test_a_failed_catalogue_insert_writes_nothing(
    engines: tuple[Engine, Engine], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    control, sensitive = engines
    path = write_tabular(tmp_path / "t.csv", *tabular_data(30))
    real_insert = ingest_module.insert

    def failing_insert(table: Any) -> Any:
        if table is datasets:
            raise RuntimeError("the control database went away")
        return real_insert(table)

    monkeypatch.setattr(ingest_module, "insert", failing_insert)
    with pytest.raises(RuntimeError, match="went away"):
        ingest(
            control=control,
            sensitive=sensitive,
            name="t",
            kind="tabular",
            path=path,
            label="label",
            block_bytes=200,
        )
    assert counts(control, sensitive) == (0, 0, 0)


def test_the_leftover_of_a_killed_ingest_is_removed_by_the_next(
    engines: tuple[Engine, Engine], tmp_path: Path
) -> None:
    control, sensitive = engines
    x, y = tabular_data(20)
    with sensitive.begin() as conn:  # what a kill between the rows and the catalogue entry leaves
        conn.execute(
            insert(stored_datasets).values(
                name="t",
                kind="tabular",
                population=0,
                dimension=3,
                public=False,
                created_at=datetime.now(UTC),
            )
        )
        conn.execute(insert(blocks), [leftover_block(first) for first in range(0, 50, 10)])
    path = write_tabular(tmp_path / "t.csv", x, y)
    meta = ingest(control=control, sensitive=sensitive, name="t", kind="tabular", path=path, label="label")
    assert meta.population == 20 == catalogued(control, "t")
    population, found = stored(sensitive, "t")
    assert population == 20 and [i for i, _, _ in found] == list(range(20))
    np.testing.assert_array_equal(DatabaseStore(sensitive, "t").take(slice(None)).features, x)


def _ingest_two(engines: tuple[Engine, Engine], tmp_path: Path) -> tuple[np.ndarray, np.ndarray, Path]:
    control, sensitive = engines
    x, y = tabular_data(50)
    first, second = (
        write_tabular(tmp_path / "a.csv", x[:30], y[:30]),
        write_tabular(tmp_path / "b.csv", x[30:], y[30:]),
    )
    ingest(control=control, sensitive=sensitive, name="t", kind="tabular", path=first, label="label")
    return x, y, second


EVENT = SubsampledGaussianEvent(noise_multiplier=1.0, sample_size=10, population=30)


def test_append_adds_rows_until_the_first_charge(engines: tuple[Engine, Engine], tmp_path: Path) -> None:
    control, sensitive = engines
    x, y, second = _ingest_two(engines, tmp_path)
    ledger_db.set_budget(control, "t", 10.0, 1e-5)  # a budget alone does not stop an append
    meta = ingest(
        control=control,
        sensitive=sensitive,
        name="t",
        kind="tabular",
        path=second,
        label="label",
        append=True,
        block_bytes=250,
    )
    assert meta.population == 50 == catalogued(control, "t") == stored(sensitive, "t")[0]
    whole = DatabaseStore(sensitive, "t").take(slice(None))
    np.testing.assert_array_equal(whole.features, x)
    np.testing.assert_array_equal(whole.labels, y)
    # Another kind or other columns are refused.
    with pytest.raises(IngestError, match="is tabular data"):
        ingest(
            control=control,
            sensitive=sensitive,
            name="t",
            kind="regression",
            path=second,
            label="label",
            append=True,
        )
    other = tmp_path / "other.csv"
    other.write_text("a,b,c,label\n0.1,0.1,0.1,1\n")
    with pytest.raises(IngestError, match="columns"):
        ingest(
            control=control,
            sensitive=sensitive,
            name="t",
            kind="tabular",
            path=other,
            label="label",
            append=True,
        )
    with pytest.raises(IngestError, match="no dataset 'u' to append to"):
        ingest(
            control=control,
            sensitive=sensitive,
            name="u",
            kind="tabular",
            path=second,
            label="label",
            append=True,
        )
    # An open reservation (a job admitted) stops it; closed, and before any charge, it is allowed again.
    ledger_db.reserve(control, "t", "job1", EVENT, 3)
    with pytest.raises(IngestError, match=r"open reservation.*population is part of every charged event"):
        ingest(
            control=control,
            sensitive=sensitive,
            name="t",
            kind="tabular",
            path=second,
            label="label",
            append=True,
        )
    ledger_db.refund(control, "job1")
    ingest(
        control=control,
        sensitive=sensitive,
        name="t",
        kind="tabular",
        path=second,
        label="label",
        append=True,
    )
    assert catalogued(control, "t") == 70
    # After a charge, never.
    Gate(DatabaseStore(sensitive, "t"), ledger_db.SqlLedger(control)).release(
        LogisticRegressionQuery(),
        {"second_moment": np.eye(3)},
        job_id="j",
        iteration=1,
        sigma=2.0,
        batch_size=10,
    )
    with pytest.raises(IngestError, match="has been charged for: rows cannot be appended"):
        ingest(
            control=control,
            sensitive=sensitive,
            name="t",
            kind="tabular",
            path=second,
            label="label",
            append=True,
        )
    assert catalogued(control, "t") == 70 == stored(sensitive, "t")[0] == len(stored(sensitive, "t")[1])


def test_a_failed_append_leaves_the_dataset_as_it_was(
    engines: tuple[Engine, Engine], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    control, sensitive = engines
    x, y, second = _ingest_two(engines, tmp_path)
    before = stored(sensitive, "t")
    bad_x = x[30:].copy()
    bad_x[-1] = [0.9, 0.9, 0.9]
    bad = write_tabular(tmp_path / "bad.csv", bad_x, y[30:])
    with pytest.raises(IngestError, match="line 21: the row's L2 norm"):
        ingest(
            control=control,
            sensitive=sensitive,
            name="t",
            kind="tabular",
            path=bad,
            label="label",
            append=True,
            block_bytes=200,
        )
    assert stored(sensitive, "t") == before and catalogued(control, "t") == 30
    # The control database's update failing: the rows written are removed, the population restored.
    real_update = ingest_module.update

    def failing_update(table: Any) -> Any:
        if table is datasets:
            raise RuntimeError("the control database went away")
        return real_update(table)

    monkeypatch.setattr(ingest_module, "update", failing_update)
    with pytest.raises(RuntimeError, match="went away"):
        ingest(
            control=control,
            sensitive=sensitive,
            name="t",
            kind="tabular",
            path=second,
            label="label",
            append=True,
            block_bytes=200,
        )
    assert stored(sensitive, "t") == before and catalogued(control, "t") == 30
    monkeypatch.undo()
    # A killed append's leftover (rows at or above the population) is removed by the next append.
    with sensitive.begin() as conn:
        conn.execute(insert(blocks), [leftover_block(30)])
    ingest(
        control=control,
        sensitive=sensitive,
        name="t",
        kind="tabular",
        path=second,
        label="label",
        append=True,
    )
    np.testing.assert_array_equal(DatabaseStore(sensitive, "t").take(slice(None)).features, x)


def test_cli_append(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VIPS_HOME", str(tmp_path / "home"))
    for name in ("VIPS_CONTROL_DATABASE_URL", "VIPS_SENSITIVE_DATABASE_URL", "VIPS_MAX_INPUT_BYTES"):
        monkeypatch.delenv(name, raising=False)
    assert main(["migrate", "all"]) == 0
    x, y = tabular_data(30)
    first, second = (
        write_tabular(tmp_path / "a.csv", x[:20], y[:20]),
        write_tabular(tmp_path / "b.csv", x[20:], y[20:]),
    )
    capsys.readouterr()
    assert main(["data", "ingest", "d", "--kind", "tabular", "--input", str(first)]) == 0
    assert main(["data", "ingest", "d", "--kind", "tabular", "--input", str(second)]) == 2
    assert "--append" in capsys.readouterr().err
    assert main(["data", "ingest", "d", "--kind", "tabular", "--input", str(second), "--append"]) == 0
    assert json.loads(capsys.readouterr().out)["population"] == 30


def test_an_over_long_line_is_refused_in_any_block(tmp_path: Path) -> None:
    path = _with_line(tmp_path, 12, "0.1," + "1" * 40 + ",1")
    for block in BLOCKS:
        stream = TabularStream(path, "label", block_bytes=block, max_line_bytes=30)
        with pytest.raises(FormatError, match="line 12: longer than 30 bytes"):
            list(stream.chunks())


def test_bag_of_words_is_written_in_chunks(engines: tuple[Engine, Engine], tmp_path: Path) -> None:
    control, sensitive = engines
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("apple\nbanana\ncherry\n")
    docword = tmp_path / "docword.txt"
    docword.write_text("5\n3\n5\n1 1 2\n1 3 1\n3 2 5\n4 3 1\n5 1 7\n")
    ingest(control=control, sensitive=sensitive, name="one", kind="bow", path=docword, vocab=vocab,
           vocabulary_public=True)  # fmt: skip
    corpus = read_docword(docword, read_vocabulary(vocab))
    store_encoded(
        control=control,
        sensitive=sensitive,
        name="many",
        kind="bow",
        encoded=encode_bag_of_words(corpus, chunk_rows=2),
        public=False,
        owner=None,
    )
    assert stored(sensitive, "many") == stored(sensitive, "one")
    assert stored(sensitive, "many")[0] == 5 == catalogued(control, "many")


@pytest.mark.parametrize("block_bytes", [64, 1 << 20])
def test_no_error_carries_a_cell_in_its_chain(tmp_path: Path, block_bytes: int) -> None:
    """pyarrow's and numpy's messages quote the bad cell: the error raised names its line and column, and
    no exception in its chain (cause or context) holds the cell's text."""
    x, y = tabular_data(20, seed=3)
    path = write_tabular(tmp_path / "bad.csv", x, y)
    lines = path.read_text().splitlines()
    cells = lines[15].split(",")
    cells[1] = "SECRET42"
    lines[15] = ",".join(cells)
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(FormatError) as caught:
        read_tabular_csv(path, "label", block_bytes=block_bytes)
    assert "line 16" in str(caught.value)
    seen: BaseException | None = caught.value
    while seen is not None:
        assert "SECRET42" not in str(seen) and "SECRET42" not in repr(seen.args)
        seen = seen.__cause__ or seen.__context__
