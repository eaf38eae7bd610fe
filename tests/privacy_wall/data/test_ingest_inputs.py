"""Bounded inputs on the command line (issue 11.4): `vips data ingest` reads its file in chunks with bounded
memory, refuses files above the input limit before reading them, reports every format error (csv.Error,
NUL bytes, bad UTF-8, over-long lines) as one `vips: error:` line naming the line and never a value, and
stores nothing when it fails; every verb that takes a dataset name checks it against the one pattern.
"""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import pytest
from sqlalchemy import func, select

from privacy_wall.data.formats import FormatError, iter_lines, read_tabular_csv
from privacy_wall.data.schema import blocks, stored_datasets
from privacy_wall.names import is_dataset_name
from privacy_wall.sqlengine import create_db_engine
from vips.cli import main

SECRET = "7.31415"  # a value that must never appear in an error


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    monkeypatch.setenv("VIPS_HOME", str(home))
    for name in ("VIPS_CONTROL_DATABASE_URL", "VIPS_SENSITIVE_DATABASE_URL", "VIPS_MAX_INPUT_BYTES"):
        monkeypatch.delenv(name, raising=False)
    assert main(["migrate", "all"]) == 0
    return home


def _error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    capsys.readouterr()
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("vips: error: "), err
    assert len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err and SECRET not in err
    return err


def _stored(home: Path) -> int:
    engine = create_db_engine(f"sqlite:///{home / 'sensitive.db'}")
    try:
        with engine.connect() as conn:
            return int(
                conn.execute(select(func.coalesce(func.sum(blocks.c.row_count), 0))).scalar_one()
            ) + int(conn.execute(select(func.count()).select_from(stored_datasets)).scalar_one())
    finally:
        engine.dispose()


GOOD = "a,b,label\n0.1,0.2,1\n0.3,0.4,0\n"


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (b"a,b,label\n0.1,0.2,1\n0.1,\x000.2,0\n", "line 3: a NUL byte"),
        (b"a,b,label\n0.1,0.2,1\n0.1,0.2,1\n0.1,\xff" + SECRET.encode() + b",0\n", "line 4: not UTF-8"),
        (b'a,"' + b"x" * 200_000 + b'",label\n0.1,0.2,1\n', "line 1: the header row is not valid CSV"),
        (b"\x00a,b,label\n", "line 1: a NUL byte"),
        (b"a,b,label\n0.1," + SECRET.encode() + b"x,1\n", "line 2, column 'b': not a number"),
    ],
)
def test_format_errors_are_one_line_naming_the_line_and_nothing_is_stored(
    capsys: pytest.CaptureFixture[str], home: Path, tmp_path: Path, content: bytes, words: str
) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_bytes(content)
    err = _error(
        capsys, ["data", "ingest", "d1", "--kind", "tabular", "--input", str(bad), "--label", "label"]
    )
    assert words in err, err
    assert _stored(home) == 0
    # The same file through fit --local is the same clean error.
    err = _error(
        capsys, ["fit", "--local", "--kind", "tabular", "--input", str(bad), "--model", "blr", "--sigma", "1"]
    )
    assert words in err, err


def test_a_file_above_the_input_limit_is_refused_before_it_is_read(
    capsys: pytest.CaptureFixture[str], home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "big.csv"
    path.write_text(GOOD + "0.1,0.1,1\n" * 1000)
    monkeypatch.setenv("VIPS_MAX_INPUT_BYTES", "4096")
    err = _error(
        capsys, ["data", "ingest", "big", "--kind", "tabular", "--input", str(path), "--label", "label"]
    )
    assert "above the input limit of 4096 bytes" in err and "VIPS_MAX_INPUT_BYTES" in err
    assert not (home / "sensitive.db").exists() or _stored(home) == 0
    monkeypatch.delenv("VIPS_MAX_INPUT_BYTES")
    capsys.readouterr()
    assert main(["data", "ingest", "big", "--kind", "tabular", "--input", str(path), "--label", "label"]) == 0
    assert json.loads(capsys.readouterr().out)["population"] == 1002


@pytest.mark.slow
def test_the_chunked_reader_holds_a_chunk_and_a_line_not_the_file(tmp_path: Path) -> None:
    path = tmp_path / "lines.csv"
    line = b"0.125,0.25,0.5,1\n"
    count = 400_000  # 6.8 MB
    with path.open("wb") as out:
        out.write(b"\xef\xbb\xbfa,b,c,label\r\n")
        for _ in range(count // 10_000):
            out.write(line * 10_000)
        out.write(b"0,0,0,0")  # no final newline
    tracemalloc.start()
    try:
        seen = 0
        for seen, text in enumerate(iter_lines(path, chunk_bytes=64 * 1024), start=1):
            assert seen > 1 or text == "a,b,c,label"
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert seen == count + 2
    assert peak < 1 << 20, peak  # the file is 6.8 MB; a chunk is 64 KiB


def test_the_chunked_reader_splits_lines_across_chunks_like_splitlines(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    text = "a,b\r\n1,2\n\n3,4\r\n" + "5," * 50 + "6\n"
    path.write_text(text, newline="")
    for chunk in (1, 2, 3, 7, 1 << 20):
        assert list(iter_lines(path, chunk_bytes=chunk)) == text.splitlines()
    path.write_bytes(b"a\n" + b"x" * 100 + b"\n")
    with pytest.raises(FormatError, match="line 2: longer than 50 bytes"):
        list(iter_lines(path, chunk_bytes=8, max_line_bytes=50))
    path.write_bytes(b"a\nb\n\xc3(\n")
    with pytest.raises(FormatError, match="line 3: not UTF-8"):
        list(iter_lines(path, chunk_bytes=1))


def test_readers_report_csv_errors_as_format_errors(tmp_path: Path) -> None:
    path = tmp_path / "h.csv"
    path.write_text('a,"' + "y" * 200_000 + '"\n1,2\n')
    with pytest.raises(FormatError, match="line 1: the header row is not valid CSV"):
        read_tabular_csv(path, None)


@pytest.mark.parametrize("name", ["a b", "a\x00b", ".hidden", "x" * 129, "a/b", "trail\n", ""])
def test_every_verb_that_takes_a_dataset_name_checks_it(
    capsys: pytest.CaptureFixture[str], home: Path, tmp_path: Path, name: str
) -> None:
    assert not is_dataset_name(name)
    data = tmp_path / "d.csv"
    data.write_text(GOOD)
    for argv in (
        ["data", "ingest", name, "--kind", "tabular", "--input", str(data)],
        ["budget", "set", name, "--epsilon", "1", "--delta", "1e-5"],
        ["budget", "show", name],
        ["admin", "create-key", "--role", "custodian", "--dataset", name],
        ["fit", "--dataset", name, "--model", "blr"],
    ):
        err = _error(capsys, argv)
        assert "a dataset name is 1-128 letters" in err, (argv, err)


def test_good_names_pass(capsys: pytest.CaptureFixture[str], home: Path, tmp_path: Path) -> None:
    for name in ("a", "A.b-c_9", "9" * 128):
        assert is_dataset_name(name)
    data = tmp_path / "d.csv"
    data.write_text(GOOD)
    capsys.readouterr()
    assert (
        main(["data", "ingest", "A.b-c_9", "--kind", "tabular", "--input", str(data), "--label", "label"])
        == 0
    )
    assert json.loads(capsys.readouterr().out)["dataset"] == "A.b-c_9"


def test_the_label_column_defaults_to_label(
    capsys: pytest.CaptureFixture[str], home: Path, tmp_path: Path
) -> None:
    """docs/design.md section 6: `vips data ingest NAME --kind tabular --input FILE [--label COLUMN]`, default
    label."""
    data = tmp_path / "d.csv"
    data.write_text(GOOD)
    capsys.readouterr()
    assert main(["data", "ingest", "nolabel", "--kind", "tabular", "--input", str(data)]) == 0
    stored = json.loads(capsys.readouterr().out)
    assert stored["dataset"] == "nolabel" and "label" not in json.dumps(stored.get("schema", {}))
