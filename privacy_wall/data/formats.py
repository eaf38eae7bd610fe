"""Strict readers for the input files of ingestion and of `vips fit --local` / `predict` / `evaluate`.

Tabular CSV: a header row of unique, non-empty column names, then one row per record, comma separated,
every cell a finite decimal number, the same number of cells on every line; blank lines only at the end.
With a label column, its cells must be 0 or 1; it is split off the features.

Tabular and binary CSV files are read in blocks of whole lines, each parsed by pyarrow's CSV parser
(TabularStream): memory holds a block at a time (read_tabular_csv then holds the values, nothing per line).
UCI docword files likewise (privacy_wall.data.docword: whole documents, block by block, sorted by docID).

Errors are FormatError (a ValueError) naming the file, the line number and the column by its NAME, but
never a cell's value: this reader also runs behind the privacy wall, where errors must not leak data.
"""

from __future__ import annotations

import contextlib
import csv
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np
from numpy.typing import NDArray

from privacy_wall.names import did_you_mean

#: The line of the first data row (line 1 is the header).
FIRST_DATA_LINE = 2

# A decimal number as numpy's parser accepts it (used only to locate a cell that numpy rejected).
_NUMBER = re.compile(r"\s*[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?\s*")
_NON_FINITE = re.compile(r"\s*[+-]?(?:nan|inf|infinity)\s*", re.IGNORECASE)


class FormatError(ValueError):
    """An input file that breaks its format. The message never contains a cell's value."""


class MissingHeader(FormatError):
    """A tabular CSV whose line 1 is numeric: a header row of column names was required."""


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


def file_position(path: Path, line: int, column: str | None = None) -> str:
    return f"{path}: line {line}" + ("" if column is None else f", column {column!r}")


#: Input files above this many bytes are refused before they are read (VIPS_MAX_INPUT_BYTES overrides it):
#: a guard against reading the wrong file by accident, not a memory bound (the tabular readers stream a
#: file in blocks, and ingestion writes it block by block), so a custodian may raise it.
MAX_INPUT_BYTES = 16 * 1024**3
#: A single line longer than this is refused while reading (the reader holds at most one line and a chunk).
MAX_LINE_BYTES = 16 * 1024 * 1024
READ_CHUNK_BYTES = 1 << 20
#: Bytes of a tabular CSV parsed at once (whole lines; about 37,000 rows of 21 numbers): with the block's
#: values, what a streaming read holds at a time.
TABLE_BLOCK_BYTES = 16 * 1024 * 1024


def max_input_bytes() -> int:
    text = os.environ.get("VIPS_MAX_INPUT_BYTES", "")
    return int(text) if text.isdigit() else MAX_INPUT_BYTES


def open_input(path: Path) -> BinaryIO:
    try:
        size = path.stat().st_size
        if path.is_dir():
            raise IsADirectoryError
        if size > max_input_bytes():
            raise FormatError(
                f"{path}: {size} bytes, above the input limit of {max_input_bytes()} bytes "
                "(VIPS_MAX_INPUT_BYTES, a guard against the wrong file): raise the limit, or ingest "
                "the file in parts with `vips data ingest NAME --append`"
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
    with open_input(path) as stream:
        number = 0
        pending = b""
        while chunk := stream.read(chunk_bytes):
            *lines, pending = (pending + chunk).split(b"\n")
            for raw in lines:
                number += 1
                yield decode_line(path, number, raw, max_line_bytes)
            if len(pending) > max_line_bytes:
                raise FormatError(f"{file_position(path, number + 1)}: longer than {max_line_bytes} bytes")
        if pending:
            yield decode_line(path, number + 1, pending, max_line_bytes)


def decode_line(path: Path, number: int, raw: bytes, max_line_bytes: int) -> str:
    if len(raw) > max_line_bytes:
        raise FormatError(f"{file_position(path, number)}: longer than {max_line_bytes} bytes")
    if raw.endswith(b"\r"):
        raw = raw[:-1]
    if number == 1 and raw.startswith(b"\xef\xbb\xbf"):
        raw = raw[3:]
    nul = raw.find(b"\x00")
    if nul >= 0:
        raise FormatError(f"{file_position(path, number)}: a NUL byte at byte {nul + 1} of the line")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        where = file_position(path, number)
        raise FormatError(f"{where}: not UTF-8 text (bad byte at byte {exc.start + 1})") from None


def read_lines(path: Path) -> list[str]:
    return list(iter_lines(path))


def _header(path: Path, first_line: str) -> tuple[str, ...]:
    try:
        names = tuple(name.strip() for name in next(csv.reader([first_line])))
    except csv.Error:  # e.g. a field above csv's size limit; its message is not repeated
        raise FormatError(f"{file_position(path, 1)}: the header row is not valid CSV") from None
    # Checked first: a file without a header must not have its first data row echoed as column names.
    if all(_NUMBER.fullmatch(name) or _NON_FINITE.fullmatch(name) for name in names):
        raise MissingHeader(
            f"{file_position(path, 1)}: a header row of column names is required (line 1 is numeric)"
        )
    for index, name in enumerate(names):
        if not name:
            raise FormatError(f"{file_position(path, 1)}: column {index + 1} of the header has no name")
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise FormatError(f"{file_position(path, 1)}: column name {name!r} appears more than once")
        seen.add(name)
    return names


def _locate_bad_cell(
    path: Path, data: list[str], names: tuple[str, ...], first_line: int = FIRST_DATA_LINE
) -> FormatError:
    """The first cell the parser could not read, as an error naming its line and column (not its value).
    `data` are the lines from line `first_line` on."""
    for offset, line in enumerate(data):
        for name, cell in zip(names, line.split(","), strict=True):
            if _NUMBER.fullmatch(cell) or _NON_FINITE.fullmatch(cell):
                continue
            what = "empty cell" if not cell.strip() else "not a number"
            return FormatError(f"{file_position(path, offset + first_line, name)}: {what}")
    return FormatError(f"{path}: the data rows could not be parsed as numbers")


def line_blocks(
    path: Path, offset: int, first_line: int, block_bytes: int, max_line_bytes: int
) -> Iterator[tuple[int, bytes, int]]:
    """The file from byte `offset` (line `first_line`) in blocks of whole lines of about `block_bytes`:
    (number of the block's first line, its bytes, how many lines it holds); a last line without its end
    is a block of its own. A line longer than `max_line_bytes` is refused, naming it."""
    with open_input(path) as stream:
        stream.seek(offset)
        number = first_line
        pending = b""
        while chunk := stream.read(block_bytes):
            buffer = pending + chunk if pending else chunk
            cut = buffer.rfind(b"\n")
            if cut < 0:
                pending = buffer
                if len(pending) > max_line_bytes:
                    raise FormatError(f"{file_position(path, number)}: longer than {max_line_bytes} bytes")
                continue
            block, pending = buffer[: cut + 1], buffer[cut + 1 :]
            lines = block.count(b"\n")
            yield number, block, lines
            number += lines
        if pending:
            yield number, pending, 1


@dataclass(frozen=True, eq=False)
class TabularChunk:
    """Consecutive data rows of a tabular file: row i of the chunk is on line first_line + i."""

    first_line: int
    features: NDArray[np.float64]
    labels: NDArray[np.float64] | None

    @property
    def rows(self) -> int:
        return int(self.features.shape[0])


_WHITESPACE_BYTES = frozenset(b" \t\r\x0b\x0c")


class TabularStream:
    """A tabular CSV read in blocks of whole lines (`block_bytes` at a time), each parsed by pyarrow's CSV
    parser into float64 columns: memory holds a block and its values, whatever the file's size.

    Opening it reads and checks the header (and the label column); `chunks()` yields the rows block by
    block with every check of the format: UTF-8 without NUL bytes, lines of at most `max_line_bytes`, the
    header's number of cells on every line, blank lines only at the end, every cell a finite number,
    0/1 labels when `binary_label` (any finite target otherwise), 0/1 values everywhere when
    `binary_values`. Errors name the line (and column), never a value; an error in a later block is raised
    when that block is reached, after the earlier blocks were yielded.

    `names` given: the file has no header row (line 1 is data) and these are its columns' names.
    """

    def __init__(
        self,
        path: Path,
        label: str | None,
        *,
        binary_label: bool = True,
        binary_values: bool = False,
        block_bytes: int = TABLE_BLOCK_BYTES,
        max_line_bytes: int = MAX_LINE_BYTES,
        names: tuple[str, ...] | None = None,
    ) -> None:
        self.path = Path(path)
        self._binary_label = binary_label
        self._binary_values = binary_values
        self._block_bytes = max(1, block_bytes)
        self._max_line_bytes = max_line_bytes
        self.has_header = names is None
        if names is None:
            header, self._data_offset = self._read_header()
            names = _header(self.path, header)
        else:
            self._data_offset = 0
        self.first_data_line = FIRST_DATA_LINE if self.has_header else 1
        if label is not None and label not in names:
            raise FormatError(
                f"{self.path}: no label column {label!r}{did_you_mean(label, names)}; the header has "
                f"{len(names)} columns"
                + (f" ({', '.join(names)})" if len(names) <= 20 else "")
                + "; --label names the label column"
            )
        if label is not None and len(names) == 1:
            raise FormatError(f"{self.path}: the label column {label!r} is the only column: no features")
        self.names = names
        self.label_name = label
        self._label_column = None if label is None else names.index(label)
        self.feature_names = names if label is None else tuple(n for n in names if n != label)

    @property
    def dimension(self) -> int:
        return len(self.feature_names)

    def _read_header(self) -> tuple[str, int]:
        """Line 1, decoded and checked, and the byte offset where line 2 starts."""
        path = self.path
        with open_input(path) as stream:
            head = b""
            while (cut := head.find(b"\n")) < 0:
                if len(head) > self._max_line_bytes:
                    raise FormatError(f"{file_position(path, 1)}: longer than {self._max_line_bytes} bytes")
                more = stream.read(READ_CHUNK_BYTES)
                if not more:
                    break
                head += more
        if not head:
            raise FormatError(f"{path}: empty file (a header row of column names is required on line 1)")
        raw, offset = (head, len(head)) if cut < 0 else (head[:cut], cut + 1)
        line = decode_line(path, 1, raw, self._max_line_bytes)
        if not line.strip():
            raise FormatError(
                f"{file_position(path, 1)}: empty line where the header row of column names belongs"
            )
        return line, offset

    def _blocks(self) -> Iterator[tuple[int, bytes]]:
        """(number of the block's first line, bytes of whole lines) from line 2 to the end."""
        blocks = line_blocks(
            self.path, self._data_offset, self.first_data_line, self._block_bytes, self._max_line_bytes
        )
        for number, block, _ in blocks:
            yield number, block

    def _tables(self) -> Iterator[tuple[int, NDArray[np.float64]]]:
        """Each block's data rows as a (rows, columns) array, every check but labels' and values' done."""
        width = len(self.names)
        blank_from: int | None = None  # the first blank line seen: only blank lines may follow it
        rows = 0
        for first_line, block in self._blocks():
            data, count, blank_from = self._check_block(first_line, block, width, blank_from)
            if count:
                rows += count
                yield first_line, self._parse(first_line, data, count)
        if rows == 0:
            what = "the header is not followed by any data row" if self.has_header else "no data row"
            raise FormatError(f"{self.path}: {what}")

    def _check_block(
        self, first_line: int, block: bytes, width: int, blank_from: int | None
    ) -> tuple[bytes, int, int | None]:
        """The block's data lines (before any blank line) and their count, after the raw checks (NUL,
        UTF-8, line length) and the structural ones (cells per line, blank lines only at the end)."""
        path = self.path
        codes = np.frombuffer(block, dtype=np.uint8)
        ends = np.flatnonzero(codes == 10)  # each line's "\n"
        if not block.endswith(b"\n"):
            ends = np.append(ends, len(block))  # the last line, without a line end
        starts = np.empty_like(ends)
        starts[0] = 0
        starts[1:] = ends[:-1] + 1
        lines = int(ends.size)

        def line_of(position: int) -> int:
            return int(np.searchsorted(ends, position))

        problems: list[tuple[int, int, str]] = []  # (line index, byte in the line, message)
        nul = block.find(b"\x00")
        if nul >= 0:
            i = line_of(nul)
            problems.append((i, 0, f"a NUL byte at byte {nul - int(starts[i]) + 1} of the line"))
        if not block.isascii():
            try:
                block.decode("utf-8")
            except UnicodeDecodeError as exc:
                i = line_of(exc.start)
                problems.append((i, 1, f"not UTF-8 text (bad byte at byte {exc.start - int(starts[i]) + 1})"))
        lengths = ends - starts
        too_long = np.flatnonzero(lengths > self._max_line_bytes)
        if too_long.size:
            problems.append((int(too_long[0]), -1, f"longer than {self._max_line_bytes} bytes"))
        if problems:
            i, _, message = min(problems)
            raise FormatError(f"{file_position(path, first_line + i)}: {message}")

        commas = np.bincount(np.searchsorted(ends, np.flatnonzero(codes == 44)), minlength=lines)
        content = lengths - (lengths > 0) * (codes[np.maximum(ends - 1, 0)] == 13)  # without a final "\r"
        first = codes[np.minimum(starts, max(len(block) - 1, 0))]
        suspect = (commas != width - 1) | (content == 0) | np.isin(first, list(_WHITESPACE_BYTES))
        blank_here: int | None = None
        for i in np.flatnonzero(suspect).tolist():
            number = first_line + i
            text = block[int(starts[i]) : int(ends[i])].decode("utf-8")
            if not text.strip():
                if blank_here is None:
                    blank_here = i
                if blank_from is None:
                    blank_from = number
                continue
            if blank_from is not None:
                raise FormatError(f"{file_position(path, blank_from)}: empty line between data rows")
            if commas[i] != width - 1:
                expected = f"the header has {width} columns" if self.has_header else f"{width} are expected"
                raise FormatError(
                    f"{file_position(path, number)}: {int(commas[i]) + 1} cells, but {expected}"
                )
        if blank_from is not None and blank_here is None and lines:
            raise FormatError(f"{file_position(path, blank_from)}: empty line between data rows")
        if blank_here is None:
            return block, lines, blank_from
        blanks = int(np.count_nonzero(suspect[blank_here:]))
        if blanks != lines - blank_here:  # a non-blank line after the blank one (not a suspect: fine cells)
            raise FormatError(f"{file_position(path, first_line + blank_here)}: empty line between data rows")
        return block[: int(starts[blank_here])], blank_here, blank_from

    def _parse(self, first_line: int, data: bytes, count: int) -> NDArray[np.float64]:
        import pyarrow as pa  # here, not at the top: every CLI verb and the worker import this module
        import pyarrow.csv as pa_csv

        width = len(self.names)
        columns = [f"c{j}" for j in range(width)]
        table: NDArray[np.float64]
        parsed = None
        # pyarrow's message quotes the cell: the block is parsed again below, outside this block, so
        # that no error raised from there carries pyarrow's exception as its context. On the calling
        # thread: no faster on 2 cores here, and Arrow's thread pool can abort the process at exit
        # ("terminate called without an active exception", apache/arrow#34314).
        with contextlib.suppress(pa.ArrowInvalid, pa.ArrowException):
            parsed = pa_csv.read_csv(
                pa.py_buffer(data),
                read_options=pa_csv.ReadOptions(column_names=columns, use_threads=False),
                parse_options=pa_csv.ParseOptions(quote_char=False, ignore_empty_lines=False),
                convert_options=pa_csv.ConvertOptions(
                    column_types=dict.fromkeys(columns, pa.float64()),
                    null_values=[""],
                    strings_can_be_null=False,
                    quoted_strings_can_be_null=False,
                ),
            )
        if parsed is None:
            table = self._parse_slowly(first_line, data)
        else:
            if parsed.num_rows != count:
                table = self._parse_slowly(first_line, data)
            else:
                table = np.empty((count, width), dtype=np.float64)
                empty: list[tuple[int, int]] = []
                for j, column in enumerate(parsed.columns):
                    if column.null_count:
                        missing = np.asarray(column.is_null().to_numpy(zero_copy_only=False))
                        empty.append((int(np.argmax(missing)), j))
                        break
                    table[:, j] = column.to_numpy()
                if empty:
                    # Only empty cells (anything else fails the conversion): the first in file order.
                    del table
                    lines = data.decode("utf-8").split("\n")[:count]
                    raise _locate_bad_cell(
                        self.path, [x.removesuffix("\r") for x in lines], self.names, first_line
                    )
        finite = np.isfinite(table)
        if not finite.all():
            row, column = (int(i) for i in np.argwhere(~finite)[0])
            raise FormatError(
                f"{file_position(self.path, first_line + row, self.names[column])}: non-finite value"
            )
        return table

    def _parse_slowly(self, first_line: int, data: bytes) -> NDArray[np.float64]:
        lines = [x.removesuffix("\r") for x in data.decode("utf-8").split("\n")]
        if lines and lines[-1] == "" and data.endswith(b"\n"):
            lines.pop()
        table = None
        # numpy's message quotes the cell: the error below names only its line and column, raised outside
        # this block so that it does not carry numpy's exception as its context.
        with contextlib.suppress(ValueError):
            table = np.loadtxt(lines, delimiter=",", comments=None, quotechar=None, dtype=np.float64, ndmin=2)
        if table is None:
            raise _locate_bad_cell(self.path, lines, self.names, first_line)
        return table

    def chunks(self) -> Iterator[TabularChunk]:
        """The data rows, block by block, with the label split off."""
        tables = self._tables()
        for first_line, table in tables:
            labels: NDArray[np.float64] | None = None
            features = table
            if self._label_column is not None:
                column = self._label_column
                labels = np.ascontiguousarray(table[:, column])
                features = np.delete(table, column, axis=1)
                if self._binary_label:
                    bad = (labels != 0) & (labels != 1)
                    if bad.any():
                        rest = _count_rest(tables, column)
                        raise FormatError(
                            f"{file_position(self.path, int(np.argmax(bad)) + first_line, self.label_name)}: "
                            f"a label must be 0 or 1 ({int(bad.sum()) + rest} rows break this)"
                        )
            if self._binary_values:
                bad = (features != 0) & (features != 1)
                if bad.any():
                    row, column = (int(i) for i in np.argwhere(bad)[0])
                    raise FormatError(
                        f"{file_position(self.path, row + first_line, self.feature_names[column])}: "
                        "binary data must be 0 or 1"
                    )
            yield TabularChunk(first_line, np.ascontiguousarray(features), labels)


def _count_rest(tables: Iterator[tuple[int, NDArray[np.float64]]], column: int) -> int:
    """How many rows of the remaining blocks have a label other than 0/1 in `column` (for an error's
    "n rows break this"), as far as the file parses."""
    total = 0
    try:
        for _, table in tables:
            total += int(np.count_nonzero((table[:, column] != 0) & (table[:, column] != 1)))
    except FormatError:
        pass
    return total


def read_tabular_csv(
    path: Path,
    label: str | None,
    *,
    binary_label: bool = True,
    block_bytes: int = TABLE_BLOCK_BYTES,
    names: tuple[str, ...] | None = None,
) -> TabularFile:
    """Read a numeric CSV with a header (or, with `names`, one without: these are its columns); split off
    the label column when `label` is given: 0/1 values, or any finite numbers when `binary_label` is False
    (regression targets). The file is parsed in blocks (TabularStream); only the values are held."""
    stream = TabularStream(path, label, binary_label=binary_label, block_bytes=block_bytes, names=names)
    return _collect(stream)


def _collect(stream: TabularStream) -> TabularFile:
    features: list[NDArray[np.float64]] = []
    labels: list[NDArray[np.float64]] = []
    for chunk in stream.chunks():
        features.append(chunk.features)
        if chunk.labels is not None:
            labels.append(chunk.labels)
    joined = features[0] if len(features) == 1 else np.concatenate(features)
    del features
    return TabularFile(
        joined,
        None if stream.label_name is None else (labels[0] if len(labels) == 1 else np.concatenate(labels)),
        stream.feature_names,
        stream.label_name,
    )


def read_binary_csv(path: Path, *, block_bytes: int = TABLE_BLOCK_BYTES) -> TabularFile:
    """A CSV of 0/1 columns with a header (the sigmoid belief network's images)."""
    return _collect(TabularStream(path, None, binary_values=True, block_bytes=block_bytes))
