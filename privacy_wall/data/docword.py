"""The strict reader of UCI bag-of-words files (a vocabulary file and a docword file) for ingestion and
`vips data prepare-text`: documents read whole, block by block (DocwordStream; the file must be sorted by
docID), every count a whole number within the ingestion bounds. Errors are FormatError naming the file
and the line, never a value (privacy_wall.data.formats, whose line reading it shares).
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from privacy_wall.data.formats import (
    MAX_LINE_BYTES,
    READ_CHUNK_BYTES,
    FormatError,
    decode_line,
    file_position,
    line_blocks,
    open_input,
    read_lines,
)


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
    lines = read_lines(path)
    while lines and not lines[-1].strip():
        lines.pop()
    if not lines:
        raise FormatError(f"{path}: empty vocabulary")
    words = tuple(line.strip() for line in lines)
    seen: set[str] = set()
    for number, word in enumerate(words, start=1):
        if not word:
            raise FormatError(f"{file_position(path, number)}: empty vocabulary entry")
        if word in seen:
            raise FormatError(f"{file_position(path, number)}: a word appears twice in the vocabulary")
        seen.add(word)
    return words


#: The first entry line of a docword file (lines 1-3 are D, W and NNZ).
FIRST_ENTRY_LINE = 4
#: Bytes of a docword file's entries parsed at once (whole lines; about 350,000 entries): with their
#: values (about 100 MB in all), what a streaming read holds at a time, besides the one document that
#: continues past it. 16 MiB blocks held 270 MB and were no faster (bench/bow_ingest.py).
DOCWORD_BLOCK_BYTES = 4 * 1024 * 1024
#: Files of fewer bytes are parsed by numpy, larger ones by pyarrow's CSV parser: pyarrow is 3x faster
#: (0.20 s against 0.59 s for 25 MB) but its import costs 0.05 s, more than numpy needs for the bundled
#: corpus (1.2 MB: 0.016 s against pyarrow's 0.009 s).
SMALL_DOCWORD_BYTES = 4 * 1024 * 1024
#: Documents per DocumentChunk at most (a long run of empty documents comes in parts); a multiple of
#: privacy_wall.data.blocks.BOW_BLOCK_ROWS.
CHUNK_DOCUMENTS = 65_536
#: The largest count and the most documents the store holds (int32 counts, 32-bit row ids).
MAX_COUNT = MAX_DOCUMENTS = 2**31 - 1
_INT64_MAX = 2**63 - 1
_ENTRY = re.compile(r"\s*([+-]?[0-9]+)\s+([+-]?[0-9]+)\s+([+-]?[0-9]+)\s*", re.ASCII)
#: The only bytes of entry lines the fast parsers are given; a block with any other byte is read line by
#: line (which finds what is wrong, or accepts the tabs, plus signs and extra spaces numpy's reader took).
_FAST_BYTES = b"0123456789 -\r\n"


def _unsorted(path: Path) -> str:
    file = shlex.quote(str(path))
    return (
        "the entries are not sorted by docID (each line's docID must be at least the previous line's); "
        f"sort them after the three header lines: (head -n 3 {file}; tail -n +4 {file} | sort -n -k1,1 "
        "-k2,2) > sorted.txt"
    )


_Columns = tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.int64]]


@dataclass(frozen=True, eq=False)
class DocumentChunk:
    """Consecutive whole documents of a docword file, first_document, first_document + 1, ... (0-based):
    document first_document + i has word_ids[indptr[i]:indptr[i+1]] (0-based, ascending) and counts[...]."""

    first_document: int
    indptr: NDArray[np.int64]
    word_ids: NDArray[np.int32]
    counts: NDArray[np.int32]

    @property
    def documents(self) -> int:
        return int(self.indptr.shape[0] - 1)


class DocwordStream:
    """A UCI docword file read in blocks of whole lines (`block_bytes`, default DOCWORD_BLOCK_BYTES, at a
    time): lines D, W and NNZ, then NNZ lines "docID wordID count" (1-based ids) sorted by docID, as UCI
    files are (words within a document in any order). Memory holds a block, its values and the one
    document that continues past it.

    Opening it reads and checks lines 1-3 (W must be the vocabulary's size); `chunks()` yields documents
    0..D-1 in order, whole, with every check of the format: UTF-8 without NUL bytes, lines of at most
    `max_line_bytes`, three whole numbers per line, blank lines only at the end, docIDs in 1..D and never
    smaller than the line before's, wordIDs in 1..W, counts in 1..MAX_COUNT, each (docID, wordID) once,
    NNZ entries. Documents without entries are yielded as empty documents, so D stays as declared. The
    first problem in file order is raised, as an error naming its line (never a value), when its block is
    reached: after the documents before it were yielded.
    """

    def __init__(
        self,
        path: Path,
        vocabulary: tuple[str, ...],
        *,
        block_bytes: int | None = None,
        max_line_bytes: int = MAX_LINE_BYTES,
    ) -> None:
        self.path = Path(path)
        self.vocabulary = vocabulary
        self._block_bytes = max(1, DOCWORD_BLOCK_BYTES if block_bytes is None else block_bytes)
        self._max_line_bytes = max_line_bytes
        (self.documents, words, self.entries), self._data_offset = self._read_header()
        self._with_numpy = self.path.stat().st_size < SMALL_DOCWORD_BYTES
        if words != len(vocabulary):
            raise FormatError(
                f"{file_position(self.path, 2)}: W = {words} but the vocabulary has {len(vocabulary)} words"
            )
        if self.documents > MAX_DOCUMENTS:
            raise FormatError(f"{file_position(self.path, 1)}: D is above {MAX_DOCUMENTS} documents")

    def _read_header(self) -> tuple[tuple[int, int, int], int]:
        """Lines 1-3 as numbers, and the byte offset where line 4 starts."""
        path = self.path
        raw: list[bytes] = []
        offset = 0
        with open_input(path) as stream:
            head = b""
            while len(raw) < 3:
                cut = head.find(b"\n", offset)
                if cut >= 0:
                    raw.append(head[offset:cut])
                    offset = cut + 1
                    continue
                if len(head) - offset > self._max_line_bytes:
                    raise FormatError(
                        f"{file_position(path, len(raw) + 1)}: longer than {self._max_line_bytes} bytes"
                    )
                more = stream.read(READ_CHUNK_BYTES)
                if not more:
                    if offset < len(head):
                        raw.append(head[offset:])
                        offset = len(head)
                    break
                head += more
        if len(raw) < 3:
            raise FormatError(f"{path}: a docword file starts with three lines D, W and NNZ")
        header: list[int] = []
        for number, line in enumerate(raw, start=1):
            text = decode_line(path, number, line, self._max_line_bytes).strip()
            if not (text.isascii() and text.isdigit()):
                raise FormatError(f"{file_position(path, number)}: expected a non-negative whole number")
            header.append(int(text))
        return (header[0], header[1], header[2]), offset

    def _blocks(self) -> Iterator[tuple[int, bytes, int]]:
        """(number of the block's first line, bytes of whole lines, their number) from line 4 to the end."""
        return line_blocks(
            self.path, self._data_offset, FIRST_ENTRY_LINE, self._block_bytes, self._max_line_bytes
        )

    def read_lines(
        self, first_line: int, block: bytes, blank_from: int | None
    ) -> tuple[_Columns, tuple[int, str] | None, int | None]:
        """The block read line by line: the entries of its lines up to the first problem (they are the
        lines first_line, first_line + 1, ...), that problem (its line and message) if any, and the first
        blank line so far (only blank lines may follow it)."""
        path = self.path
        rows: list[tuple[int, int, int]] = []
        problem: tuple[int, str] | None = None
        lines = block.split(b"\n")
        if block.endswith(b"\n"):
            lines.pop()
        for offset, raw in enumerate(lines):
            number = first_line + offset
            try:
                text = decode_line(path, number, raw, self._max_line_bytes)
            except FormatError as exc:
                problem = (number, str(exc).removeprefix(f"{file_position(path, number)}: "))
                break
            if not text.strip():
                if blank_from is None:
                    blank_from = number
                continue
            if blank_from is not None:
                problem = (blank_from, "empty line between entries")
                break
            match = _ENTRY.fullmatch(text)
            if match is None:
                problem = (number, "expected three whole numbers: docID wordID count")
                break
            doc, word, count = (_whole(v) for v in match.groups())
            rows.append((doc, word, count))
        values = np.array(rows, dtype=np.int64).reshape(len(rows), 3)
        return (values[:, 0], values[:, 1], values[:, 2]), problem, blank_from

    def chunks(self) -> Iterator[DocumentChunk]:
        """Documents 0..D-1 in order, whole, about a block of entries at a time (see the class)."""
        path = self.path
        documents, words = self.documents, len(self.vocabulary)
        none = np.zeros(0, dtype=np.int64)
        held: _Columns = (none, none, none)  # the last document so far: it may go on in the next block
        held_from = FIRST_ENTRY_LINE  # the line of its first entry
        next_document = 0  # the first document (0-based) not yet yielded
        entries = 0
        blank_from: int | None = None
        for first_line, block, lines in self._blocks():
            columns = None
            if blank_from is None:
                columns = _parse_fast(block, lines, self._max_line_bytes, with_numpy=self._with_numpy)
            problem: tuple[int, str] | None = None
            if columns is None:
                columns, problem, blank_from = self.read_lines(first_line, block, blank_from)
            doc, word, count = columns
            rows = int(doc.size)
            before = int(held[0][-1]) if held[0].size else 0
            checks = (
                ((doc < 1) | (doc > documents), f"docID outside 1..{documents}"),
                ((word < 1) | (word > words), f"wordID outside 1..{words}"),
                (count < 1, "a count must be a positive whole number"),
                (count > MAX_COUNT, f"a count above {MAX_COUNT}"),
                (np.diff(doc, prepend=before) < 0, _unsorted(path)),
            )
            first_bad = rows
            for bad, message in checks:
                hits = np.flatnonzero(bad[:first_bad])
                if hits.size:
                    first_bad = int(hits[0])
                    problem = (first_line + first_bad, message)
            if entries + first_bad > self.entries:
                first_bad = self.entries - entries
                problem = (first_line + first_bad, f"more entries than NNZ on line 3 says ({self.entries})")
            entries += first_bad
            joined: _Columns = (
                np.concatenate([held[0], doc[:first_bad]]),
                np.concatenate([held[1], word[:first_bad]]),
                np.concatenate([held[2], count[:first_bad]]),
            )
            order, repeated = _word_order(joined[0], joined[1], words)
            if repeated is not None:  # before any problem found above: an earlier line
                problem = (
                    _line_of(repeated, held[0].size, held_from, first_line),
                    "a (docID, wordID) pair appears twice",
                )
            if problem is not None:
                raise FormatError(f"{file_position(path, problem[0])}: {problem[1]}")
            if not joined[0].size:
                continue
            last = int(joined[0][-1]) - 1  # the last document so far, 0-based
            cut = int(np.searchsorted(joined[0], last + 1))
            if cut:
                yield from _documents(next_document, last, joined, cut, order)
                next_document = last
            held_from = _line_of(cut, held[0].size, held_from, first_line)
            # Copies, so that this block's arrays are freed before the next block is read.
            held = (joined[0][cut:].copy(), joined[1][cut:].copy(), joined[2][cut:].copy())
            del columns, doc, word, count, joined, order
        if entries != self.entries:
            raise FormatError(f"{path}: NNZ on line 3 says {self.entries} entries, the file has {entries}")
        order, _ = _word_order(held[0], held[1], words)
        yield from _documents(next_document, documents, held, held[0].size, order)


def _parse_fast(block: bytes, lines: int, max_line_bytes: int, *, with_numpy: bool) -> _Columns | None:
    """The entries of a block of `lines` lines when a fast parser (numpy's or pyarrow's) reads each line as
    three whole numbers separated by single spaces; None otherwise (another byte, a blank line, a bad line,
    one above `max_line_bytes`: the line-by-line reader then finds what is wrong)."""
    if block.translate(None, _FAST_BYTES):
        return None
    if len(block) > max_line_bytes:
        ends = np.flatnonzero(np.frombuffer(block, dtype=np.uint8) == 10)
        if np.diff(ends, prepend=-1, append=len(block)).max() > max_line_bytes + 1:
            return None
    columns: _Columns | None = None
    if with_numpy:
        # numpy's message quotes the cell: the line-by-line reader raises outside this block, so that no
        # error carries numpy's exception as its context.
        with contextlib.suppress(ValueError, OverflowError), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "input contained no data"
            values = np.loadtxt(
                io.BytesIO(block), delimiter=" ", comments=None, quotechar=None, dtype=np.int64, ndmin=2
            )
            if values.shape == (lines, 3):
                columns = (values[:, 0], values[:, 1], values[:, 2])
        return columns
    import pyarrow as pa  # here, not at the top: see TabularStream._parse
    import pyarrow.csv as pa_csv

    names = ["doc", "word", "count"]
    with contextlib.suppress(pa.ArrowInvalid, pa.ArrowException):
        table = pa_csv.read_csv(
            pa.py_buffer(block),
            # One chunk per column (arrays over pyarrow's buffers, no copy): the block is parsed whole.
            read_options=pa_csv.ReadOptions(
                column_names=names, use_threads=False, block_size=min(len(block) + 1, 2**31 - 1)
            ),
            parse_options=pa_csv.ParseOptions(delimiter=" ", quote_char=False, ignore_empty_lines=False),
            convert_options=pa_csv.ConvertOptions(
                column_types=dict.fromkeys(names, pa.int64()),
                null_values=[],
                strings_can_be_null=False,
                quoted_strings_can_be_null=False,
            ),
        )
        if table.num_rows == lines and not any(column.null_count for column in table.columns):
            doc, word, count = (np.asarray(column.to_numpy(), dtype=np.int64) for column in table.columns)
            columns = (doc, word, count)
    return columns


def _whole(text: str) -> int:
    """A whole number ([+-]digits), clamped into int64: one that large is outside every range checked
    (and Python's int() refuses strings of more than 4,300 digits)."""
    if len(text.lstrip("+-").lstrip("0")) > 19:
        return -_INT64_MAX if text.startswith("-") else _INT64_MAX
    return max(-_INT64_MAX, min(_INT64_MAX, int(text)))


def _line_of(index: int, held: int, held_from: int, first_line: int) -> int:
    """The line of entry `index` of a block's entries joined after the `held` ones (from line held_from)."""
    return held_from + index if index < held else first_line + index - held


def _word_order(
    doc: NDArray[np.int64], word: NDArray[np.int64], words: int
) -> tuple[NDArray[np.int64] | None, int | None]:
    """For entries sorted by document: the order that sorts each document's words (None: already sorted),
    and the index of the first entry (in file order) that repeats an earlier (document, word), if any."""
    if doc.size < 2:
        return None, None
    new_document = doc[1:] != doc[:-1]
    if np.all(new_document | (word[1:] > word[:-1])):
        return None, None
    rank = np.concatenate([[0], np.cumsum(new_document)])  # the document's rank among these
    key = rank * (words + 1) + word
    order = np.argsort(key, kind="stable")
    ordered = key[order]
    repeats = order[1:][ordered[1:] == ordered[:-1]]  # the later entry of each equal pair
    return order, (int(repeats.min()) if repeats.size else None)


def _documents(
    first: int, stop: int, entries: _Columns, cut: int, order: NDArray[np.int64] | None
) -> Iterator[DocumentChunk]:
    """Documents first..stop-1 (0-based) from the first `cut` entries (1-based ids; sorted by document,
    each document's words by `order`), CHUNK_DOCUMENTS documents at a time."""
    doc, word, count = (column[:cut] for column in entries)
    if order is not None:
        keep = order[:cut]  # the entries before `cut` are whole documents: they sort first
        doc, word, count = doc[keep], word[keep], count[keep]
    word_ids, counts = (word - 1).astype(np.int32), count.astype(np.int32)
    for start in range(first, stop, CHUNK_DOCUMENTS):
        end = min(stop, start + CHUNK_DOCUMENTS)
        bounds = np.searchsorted(doc, np.arange(start + 1, end + 2, dtype=np.int64))
        lo, hi = int(bounds[0]), int(bounds[-1])
        yield DocumentChunk(start, bounds - lo, word_ids[lo:hi], counts[lo:hi])


def read_docword(path: Path, vocabulary: tuple[str, ...], *, block_bytes: int | None = None) -> BagOfWords:
    """A UCI docword file (see DocwordStream), read in blocks; only the values are held.

    Documents with no entries are kept (as empty documents) so D stays as declared.
    """
    stream = DocwordStream(path, vocabulary, block_bytes=block_bytes)
    lengths: list[NDArray[np.int64]] = []
    word_ids: list[NDArray[np.int32]] = []
    counts: list[NDArray[np.int32]] = []
    for chunk in stream.chunks():
        lengths.append(np.diff(chunk.indptr))
        word_ids.append(chunk.word_ids)
        counts.append(chunk.counts)
    indptr = np.zeros(stream.documents + 1, dtype=np.int64)
    if lengths:
        np.cumsum(np.concatenate(lengths), out=indptr[1:])
    return BagOfWords(
        indptr,
        np.concatenate(word_ids) if word_ids else np.zeros(0, dtype=np.int32),
        np.concatenate(counts) if counts else np.zeros(0, dtype=np.int32),
        vocabulary,
    )
