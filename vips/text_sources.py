"""The texts `vips data prepare-text` reads: a folder of .txt files or one column of a CSV file.

Folder: every file whose name ends in .txt, in subfolders too, one document each, in the order of their
paths relative to the folder (sorted by code point), so document d of the output is the d-th such file.
CSV: a header row naming the columns, then one document per row (the cell of the text column; quoted
cells may span lines), rows without any cell skipped. Both are UTF-8 (a leading BOM is dropped). Errors name
the file (and CSV line), never any of its text.
"""

from __future__ import annotations

import csv
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from privacy_wall.names import did_you_mean
from vips.errors import UsageError


def text_files(folder: Path) -> list[Path]:
    """The folder's .txt files (recursively), sorted by their relative paths; UsageError if there are none."""
    if not folder.is_dir():
        raise UsageError(f"{folder}: not a directory")
    files = sorted(
        (path for path in folder.rglob("*.txt") if path.is_file()),
        key=lambda path: path.relative_to(folder).as_posix(),
    )
    if not files:
        raise UsageError(f"{folder}: no .txt files (in it or its subfolders)")
    return files


def read_text(path: Path) -> str:
    """A whole UTF-8 file as text (a leading BOM dropped); UsageError naming the file, never its content."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise UsageError(f"{path}: cannot be read ({exc.strerror})") from None
    try:
        return raw.removeprefix(b"\xef\xbb\xbf").decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"{path}: not UTF-8 text (bad byte at byte {exc.start + 1})") from None


def folder_texts(folder: Path) -> Iterator[str]:
    """Each .txt file's text, in text_files' order, one file in memory at a time."""
    for path in text_files(folder):
        yield read_text(path)


@contextmanager
def _restored_field_limit(limit: int) -> Iterator[None]:
    try:
        yield
    finally:
        csv.field_size_limit(limit)


def csv_texts(path: Path, column: str) -> Iterator[str]:
    """The `column` cell of each row of a CSV file with a header, in file order (a document may be longer
    than the csv module's field limit, which is raised while this reads and restored after)."""
    try:
        handle = path.open(encoding="utf-8-sig", newline="")
    except OSError as exc:
        raise UsageError(f"{path}: cannot be read ({exc.strerror})") from None
    limit = csv.field_size_limit(sys.maxsize)
    with handle, _restored_field_limit(limit):
        reader = csv.reader(handle)
        try:
            header = next(reader, None)
            if header is None:
                raise UsageError(f"{path}: empty file (a header row naming the columns is required)")
            names = [name.strip() for name in header]
            if column not in names:
                # The cells are not listed: in a file without a header, line 1 is a document's text.
                # A close name is shown: it is what the user typed, give or take a letter or two.
                raise UsageError(
                    f"{path}: no column {column!r}{did_you_mean(column, names)} in line 1 ({len(names)} "
                    "cells, not listed: in a file without a header, line 1 is a document; a header row "
                    "naming the columns is required)"
                )
            index = names.index(column)
            for row in reader:
                if not row:
                    continue
                if len(row) <= index:
                    raise UsageError(f"{path}: line {reader.line_num}: no cell for column {column!r}")
                yield row[index]
        except UnicodeDecodeError as exc:
            raise UsageError(
                f"{path}: not UTF-8 text (bad byte at byte {exc.start + 1} of a block)"
            ) from None
        except csv.Error:  # its message may quote the text: name the line only
            raise UsageError(f"{path}: line {reader.line_num}: not valid CSV") from None


def texts_of(path: Path, column: str | None) -> Iterator[str]:
    """A folder's .txt files, or with `column` a CSV file's column, or else one .txt file as one document."""
    if column is not None:
        return csv_texts(path, column)
    if path.is_dir():
        return folder_texts(path)
    return iter([read_text(path)])
