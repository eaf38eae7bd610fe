"""Strict readers for the input files of ingestion and of `vips fit --local` / `predict` / `evaluate`.

Tabular CSV: a header row of unique, non-empty column names, then one row per record, comma separated,
every cell a finite decimal number, the same number of cells on every line; blank lines only at the end.
With a label column, its cells must be 0 or 1; it is split off the features.

Errors are FormatError (a ValueError) naming the file, the line number and the column by its NAME, but
never a cell's value: this reader also runs behind the privacy wall, where errors must not leak data.
"""

from __future__ import annotations

import csv
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np
from numpy.typing import NDArray

#: The line of the first data row (line 1 is the header).
FIRST_DATA_LINE = 2

# A decimal number as numpy's parser accepts it (used only to locate a cell that numpy rejected).
_NUMBER = re.compile(r"\s*[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?\s*")
_NON_FINITE = re.compile(r"\s*[+-]?(?:nan|inf|infinity)\s*", re.IGNORECASE)


class FormatError(ValueError):
    """An input file that breaks its format. The message never contains a cell's value."""


@dataclass(frozen=True, eq=False)
class TabularFile:
    """A numeric table: features (rows x columns), optional 0/1 labels, and the feature columns' names.

    Data row r (counted from 0) is on line r + FIRST_DATA_LINE of the file.
    """

    features: NDArray[np.float64]
    labels: NDArray[np.float64] | None
    feature_names: tuple[str, ...]
    label_name: str | None = None

    @property
    def rows(self) -> int:
        return int(self.features.shape[0])

    @property
    def dimension(self) -> int:
        return int(self.features.shape[1])


def _where(path: Path, line: int, column: str | None = None) -> str:
    return f"{path}: line {line}" + ("" if column is None else f", column {column!r}")


#: Input files above this many bytes are refused before they are read (VIPS_MAX_INPUT_BYTES overrides it):
#: the readers hold a file's parsed values in memory, so the limit bounds what one file can take.
MAX_INPUT_BYTES = 256 * 1024 * 1024
#: A single line longer than this is refused while reading (the reader holds at most one line and a chunk).
MAX_LINE_BYTES = 16 * 1024 * 1024
READ_CHUNK_BYTES = 1 << 20


def max_input_bytes() -> int:
    text = os.environ.get("VIPS_MAX_INPUT_BYTES", "")
    return int(text) if text.isdigit() else MAX_INPUT_BYTES


def _open(path: Path) -> BinaryIO:
    try:
        size = path.stat().st_size
        if path.is_dir():
            raise IsADirectoryError
        if size > max_input_bytes():
            raise FormatError(
                f"{path}: {size} bytes, above the input limit of {max_input_bytes()} bytes "
                "(VIPS_MAX_INPUT_BYTES); split the file or raise the limit"
            )
        return path.open("rb")
    except FileNotFoundError:
        raise FormatError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise FormatError(f"{path}: is a directory, not a file") from None
    except OSError as exc:
        raise FormatError(f"{path}: cannot be read ({exc.strerror})") from None


def iter_lines(
    path: Path, *, chunk_bytes: int = READ_CHUNK_BYTES, max_line_bytes: int = MAX_LINE_BYTES
) -> Iterator[str]:
    """The file's lines (without their line ends), read `chunk_bytes` at a time: memory is bounded by a
    chunk plus the longest line, whatever the file's size. A UTF-8 BOM is dropped. Bad UTF-8, a NUL byte
    or an over-long line is a FormatError naming the line (and byte position), never its content."""
    path = Path(path)
    with _open(path) as stream:
        number = 0
        pending = b""
        while chunk := stream.read(chunk_bytes):
            *lines, pending = (pending + chunk).split(b"\n")
            for raw in lines:
                number += 1
                yield _decode(path, number, raw, max_line_bytes)
            if len(pending) > max_line_bytes:
                raise FormatError(f"{_where(path, number + 1)}: longer than {max_line_bytes} bytes")
        if pending:
            yield _decode(path, number + 1, pending, max_line_bytes)


def _decode(path: Path, number: int, raw: bytes, max_line_bytes: int) -> str:
    if len(raw) > max_line_bytes:
        raise FormatError(f"{_where(path, number)}: longer than {max_line_bytes} bytes")
    if raw.endswith(b"\r"):
        raw = raw[:-1]
    if number == 1 and raw.startswith(b"\xef\xbb\xbf"):
        raw = raw[3:]
    nul = raw.find(b"\x00")
    if nul >= 0:
        raise FormatError(f"{_where(path, number)}: a NUL byte at byte {nul + 1} of the line")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        where = _where(path, number)
        raise FormatError(f"{where}: not UTF-8 text (bad byte at byte {exc.start + 1})") from None


def _read_lines(path: Path) -> list[str]:
    return list(iter_lines(path))


def _header(path: Path, first_line: str) -> tuple[str, ...]:
    try:
        names = tuple(name.strip() for name in next(csv.reader([first_line])))
    except csv.Error:  # e.g. a field above csv's size limit; its message is not repeated
        raise FormatError(f"{_where(path, 1)}: the header row is not valid CSV") from None
    # Checked first: a file without a header must not have its first data row echoed as column names.
    if all(_NUMBER.fullmatch(name) or _NON_FINITE.fullmatch(name) for name in names):
        raise FormatError(f"{_where(path, 1)}: a header row of column names is required (line 1 is numeric)")
    for index, name in enumerate(names):
        if not name:
            raise FormatError(f"{_where(path, 1)}: column {index + 1} of the header has no name")
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise FormatError(f"{_where(path, 1)}: column name {name!r} appears more than once")
        seen.add(name)
    return names


def _data_lines(path: Path, lines: list[str], width: int) -> list[str]:
    """The data lines, with blank lines allowed only at the end and the cell count checked on each."""
    end = len(lines)
    while end > 1 and not lines[end - 1].strip():
        end -= 1
    data = lines[1:end]
    if not data:
        raise FormatError(f"{path}: the header is not followed by any data row")
    commas = width - 1
    for offset, line in enumerate(data):
        if not line.strip():
            raise FormatError(f"{_where(path, offset + FIRST_DATA_LINE)}: empty line between data rows")
        if line.count(",") != commas:
            number = offset + FIRST_DATA_LINE
            raise FormatError(
                f"{_where(path, number)}: {line.count(',') + 1} cells, but the header has {width} columns"
            )
    return data


def _locate_bad_cell(path: Path, data: list[str], names: tuple[str, ...]) -> FormatError:
    """The first cell numpy could not parse, as an error naming its line and column (not its value)."""
    for offset, line in enumerate(data):
        for name, cell in zip(names, line.split(","), strict=True):
            if _NUMBER.fullmatch(cell) or _NON_FINITE.fullmatch(cell):
                continue
            what = "empty cell" if not cell.strip() else "not a number"
            return FormatError(f"{_where(path, offset + FIRST_DATA_LINE, name)}: {what}")
    return FormatError(f"{path}: the data rows could not be parsed as numbers")


def read_tabular_csv(path: Path, label: str | None, *, binary_label: bool = True) -> TabularFile:
    """Read a numeric CSV with a header; split off the label column when `label` is given: 0/1 values,
    or any finite numbers when `binary_label` is False (regression targets)."""
    path = Path(path)
    lines = _read_lines(path)
    if not lines:
        raise FormatError(f"{path}: empty file (a header row of column names is required on line 1)")
    if not lines[0].strip():
        raise FormatError(f"{_where(path, 1)}: empty line where the header row of column names belongs")
    names = _header(path, lines[0])
    if label is not None and label not in names:
        raise FormatError(
            f"{path}: no label column {label!r}; the header has {len(names)} columns"
            + (f" ({', '.join(names)})" if len(names) <= 20 else "")
        )
    if label is not None and len(names) == 1:
        raise FormatError(f"{path}: the label column {label!r} is the only column: no features")
    data = _data_lines(path, lines, len(names))
    try:
        table = np.loadtxt(data, delimiter=",", comments=None, quotechar=None, dtype=np.float64, ndmin=2)
    except ValueError:
        # numpy's message quotes the cell: find it ourselves and name only its line and column.
        raise _locate_bad_cell(path, data, names) from None

    finite = np.isfinite(table)
    if not finite.all():
        row, column = (int(i) for i in np.argwhere(~finite)[0])
        raise FormatError(f"{_where(path, row + FIRST_DATA_LINE, names[column])}: non-finite value")

    if label is None:
        return TabularFile(np.ascontiguousarray(table), None, names)
    column = names.index(label)
    labels = np.ascontiguousarray(table[:, column])
    bad = (labels != 0) & (labels != 1) if binary_label else np.zeros(labels.shape, dtype=bool)
    if bad.any():
        row = int(np.argmax(bad))
        raise FormatError(
            f"{_where(path, row + FIRST_DATA_LINE, label)}: a label must be 0 or 1 "
            f"({int(bad.sum())} rows break this)"
        )
    features = np.ascontiguousarray(np.delete(table, column, axis=1))
    feature_names = names[:column] + names[column + 1 :]
    return TabularFile(features, labels, feature_names, label)


@dataclass(frozen=True, eq=False)
class BagOfWords:
    """A UCI bag-of-words corpus in CSR form: document d's word ids (0-based) and counts are
    word_ids[indptr[d]:indptr[d+1]] and counts[...]; `vocabulary` has one word per id."""

    indptr: NDArray[np.int64]
    word_ids: NDArray[np.int32]
    counts: NDArray[np.int32]
    vocabulary: tuple[str, ...]

    @property
    def documents(self) -> int:
        return int(self.indptr.shape[0] - 1)


def read_vocabulary(path: Path) -> tuple[str, ...]:
    """One word per line; blank lines only at the end; words unique."""
    path = Path(path)
    lines = _read_lines(path)
    while lines and not lines[-1].strip():
        lines.pop()
    if not lines:
        raise FormatError(f"{path}: empty vocabulary")
    words = tuple(line.strip() for line in lines)
    seen: set[str] = set()
    for number, word in enumerate(words, start=1):
        if not word:
            raise FormatError(f"{_where(path, number)}: empty vocabulary entry")
        if word in seen:
            raise FormatError(f"{_where(path, number)}: a word appears twice in the vocabulary")
        seen.add(word)
    return words


def read_docword(path: Path, vocabulary: tuple[str, ...]) -> BagOfWords:
    """A UCI docword file: lines D, W, NNZ, then NNZ lines "docID wordID count" (1-based ids).

    Documents with no entries are kept (as empty documents) so D stays as declared.
    """
    path = Path(path)
    lines = _read_lines(path)
    if len(lines) < 3:
        raise FormatError(f"{path}: a docword file starts with three lines D, W and NNZ")
    header: list[int] = []
    for number in (1, 2, 3):
        text = lines[number - 1].strip()
        if not text.isdigit():
            raise FormatError(f"{_where(path, number)}: expected a non-negative whole number")
        header.append(int(text))
    documents, words, nnz = header
    if words != len(vocabulary):
        raise FormatError(f"{_where(path, 2)}: W = {words} but the vocabulary has {len(vocabulary)} words")
    body = [line for line in lines[3:]]
    while body and not body[-1].strip():
        body.pop()
    if len(body) != nnz:
        raise FormatError(f"{path}: NNZ on line 3 says {nnz} entries, the file has {len(body)}")
    if nnz == 0:
        triples = np.zeros((0, 3), dtype=np.int64)
    else:
        try:
            triples = np.loadtxt(body, dtype=np.int64, ndmin=2, comments=None)
        except ValueError:
            for offset, line in enumerate(body):
                parts = line.split()
                if len(parts) != 3 or not all(p.isdigit() for p in parts):
                    raise FormatError(
                        f"{_where(path, offset + 4)}: expected three whole numbers: docID wordID count"
                    ) from None
            raise FormatError(f"{path}: entries could not be parsed") from None
        if triples.shape[1] != 3:
            raise FormatError(f"{path}: every entry line has three numbers: docID wordID count")
    doc, word, count = triples[:, 0], triples[:, 1], triples[:, 2]
    for name, values, upper in (("docID", doc, documents), ("wordID", word, words)):
        bad = (values < 1) | (values > upper)
        if bad.any():
            raise FormatError(f"{_where(path, int(np.argmax(bad)) + 4)}: {name} outside 1..{upper}")
    bad = count < 1
    if bad.any():
        raise FormatError(f"{_where(path, int(np.argmax(bad)) + 4)}: a count must be a positive whole number")
    order = np.lexsort((word, doc))
    doc, word, count = doc[order] - 1, word[order] - 1, count[order]
    if doc.size > 1:
        repeated = (np.diff(doc) == 0) & (np.diff(word) == 0)
        if repeated.any():
            raise FormatError(f"{path}: a (docID, wordID) pair appears twice")
    indptr = np.zeros(documents + 1, dtype=np.int64)
    np.add.at(indptr, doc + 1, 1)
    return BagOfWords(np.cumsum(indptr), word.astype(np.int32), count.astype(np.int32), vocabulary)


def read_binary_csv(path: Path) -> TabularFile:
    """A CSV of 0/1 columns with a header (the sigmoid belief network's images)."""
    table = read_tabular_csv(path, label=None)
    bad = (table.features != 0) & (table.features != 1)
    if bad.any():
        row, column = (int(i) for i in np.argwhere(bad)[0])
        raise FormatError(
            f"{_where(Path(path), row + FIRST_DATA_LINE, table.feature_names[column])}: "
            "binary data must be 0 or 1"
        )
    return table
