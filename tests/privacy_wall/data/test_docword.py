"""Streaming docword reading (issue 22): the UCI docword reader parses blocks of lines and yields whole
documents, so `vips data ingest --kind bow` holds a block at a time. The result equals the whole-file
reader's it replaced (kept below as the reference) on every file and every block size, including blocks
that end inside a document; every error names the same line whatever the block size, and carries no value;
a failed ingest leaves nothing. On SQLite and PostgreSQL where the store is involved."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import Engine, func, select

import privacy_wall.data.docword as reader
import privacy_wall.data.ingest as ingest_module
from privacy_wall.data import blocks as block_layout
from privacy_wall.data.docword import BagOfWords, DocwordStream, read_docword, read_vocabulary
from privacy_wall.data.formats import FormatError
from privacy_wall.data.ingest import IngestError, encode_bag_of_words, ingest, store_encoded
from privacy_wall.data.schema import blocks, stored_datasets

#: Block sizes from one byte (a block per line) to the whole file at once.
BLOCKS = (1, 7, 64, 1000, 1 << 20)


def whole_file_read(path: Path, vocabulary: tuple[str, ...]) -> BagOfWords:
    """The reader before streaming (commit f84481d), its checks left out: every line in memory, np.loadtxt,
    one lexsort of (docID, wordID). The reference for well-formed files."""
    lines = path.read_text().splitlines()
    documents = int(lines[0])
    body = lines[3:]
    while body and not body[-1].strip():
        body.pop()
    triples = np.loadtxt(body, dtype=np.int64, ndmin=2, comments=None) if body else np.zeros((0, 3), np.int64)
    doc, word, count = triples[:, 0], triples[:, 1], triples[:, 2]
    order = np.lexsort((word, doc))
    doc, word, count = doc[order] - 1, word[order] - 1, count[order]
    indptr = np.zeros(documents + 1, dtype=np.int64)
    np.add.at(indptr, doc + 1, 1)
    return BagOfWords(np.cumsum(indptr), word.astype(np.int32), count.astype(np.int32), vocabulary)


def assert_same(got: BagOfWords, expected: BagOfWords) -> None:
    for name in ("indptr", "word_ids", "counts"):
        a, b = getattr(got, name), getattr(expected, name)
        assert a.dtype == b.dtype, name
        np.testing.assert_array_equal(a, b, err_msg=name)
    assert got.vocabulary == expected.vocabulary


def vocabulary(words: int) -> tuple[str, ...]:
    return tuple(f"w{j}" for j in range(words))


def write_docword(
    path: Path,
    entries: list[tuple[int, int, int]],
    documents: int,
    words: int,
    *,
    end: str = "\n",
    nnz: int | None = None,
) -> Path:
    lines = [str(documents), str(words), str(len(entries) if nnz is None else nnz)]
    lines += [f"{d} {w} {c}" for d, w, c in entries]
    path.write_bytes((end.join(lines) + end).encode())
    return path


def random_entries(
    rng: np.random.Generator, documents: int, words: int, *, shuffle_words: bool, long_every: int = 0
) -> list[tuple[int, int, int]]:
    """Documents sorted by docID, some empty (first, last and in between), some long (spanning many
    blocks), each document's words in ascending or shuffled order."""
    entries = []
    for d in range(1, documents + 1):
        if d in (1, documents) or rng.random() < 0.2:
            continue
        size = int(rng.integers(1, min(words, 12)))
        if long_every and d % long_every == 0:
            size = words // 2
        ids = rng.choice(words, size=size, replace=False) + 1
        ids = ids if shuffle_words else np.sort(ids)
        entries += [(d, int(w), int(rng.integers(1, 9))) for w in ids]
    return entries


@pytest.fixture
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunks of 3 documents: chunk boundaries everywhere, runs of empty documents split."""
    monkeypatch.setattr(reader, "CHUNK_DOCUMENTS", 3)


def files(tmp_path: Path) -> list[tuple[Path, tuple[str, ...]]]:
    rng = np.random.default_rng(7)
    made = []
    for index, (documents, words, shuffle, long_every) in enumerate(
        [(1, 3, False, 0), (5, 4, False, 0), (40, 30, False, 0), (60, 50, True, 0), (30, 400, True, 7)]
    ):
        entries = random_entries(rng, documents, words, shuffle_words=shuffle, long_every=long_every)
        made.append((write_docword(tmp_path / f"r{index}.txt", entries, documents, words), vocabulary(words)))
    made.append((write_docword(tmp_path / "none.txt", [], 4, 2), vocabulary(2)))  # NNZ 0: 4 empty documents
    made.append(
        (write_docword(tmp_path / "crlf.txt", [(1, 2, 3), (3, 1, 1)], 3, 2, end="\r\n"), vocabulary(2))
    )
    trailing = write_docword(tmp_path / "trailing.txt", [(2, 1, 5), (2, 2, 1)], 2, 2)
    trailing.write_bytes(trailing.read_bytes().removesuffix(b"\n") + b"\n\n  \n\n")  # blank lines at the end
    made.append((trailing, vocabulary(2)))
    unterminated = write_docword(tmp_path / "unterminated.txt", [(1, 1, 2), (2, 2, 1)], 2, 2)
    unterminated.write_bytes(unterminated.read_bytes().removesuffix(b"\n"))
    made.append((unterminated, vocabulary(2)))
    return made


@pytest.mark.slow
@pytest.mark.usefixtures("small_chunks")
@pytest.mark.parametrize("small", [0, 1 << 30], ids=["pyarrow", "numpy"])
def test_the_streamed_corpus_is_the_whole_file_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, small: int
) -> None:
    monkeypatch.setattr(reader, "SMALL_DOCWORD_BYTES", small)
    for path, words in files(tmp_path):
        expected = whole_file_read(path, words)
        for block in BLOCKS:
            assert_same(read_docword(path, words, block_bytes=block), expected)


@pytest.mark.usefixtures("small_chunks")
def test_chunks_are_whole_documents_in_order(tmp_path: Path) -> None:
    path, words = files(tmp_path)[4]  # long documents: many blocks end inside one
    expected = whole_file_read(path, words)
    stream = DocwordStream(path, words, block_bytes=64)
    next_document = 0
    for chunk in stream.chunks():
        assert chunk.first_document == next_document and 1 <= chunk.documents <= 3
        stop = chunk.first_document + chunk.documents
        np.testing.assert_array_equal(
            chunk.indptr, expected.indptr[next_document : stop + 1] - expected.indptr[next_document]
        )
        lo, hi = expected.indptr[next_document], expected.indptr[stop]
        np.testing.assert_array_equal(chunk.word_ids, expected.word_ids[lo:hi])
        np.testing.assert_array_equal(chunk.counts, expected.counts[lo:hi])
        next_document = stop
    assert next_document == stream.documents == expected.documents


def test_tabs_plus_signs_and_extra_spaces_are_read_as_before(tmp_path: Path) -> None:
    """What numpy's whitespace-splitting reader accepted goes to the line-by-line reader: same values."""
    path = tmp_path / "spaces.txt"
    path.write_bytes(b" 3\n2 \n4\n1\t2\t+3\n  1 1  4  \n3 2 007\r\n3 1 1\n")
    expected = whole_file_read(path, vocabulary(2))
    for block in BLOCKS:
        assert_same(read_docword(path, vocabulary(2), block_bytes=block), expected)


@pytest.mark.slow
def test_the_bundled_corpus_reads_as_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, small_chunks: None
) -> None:
    """The Wikipedia corpus `make run`'s LDA and bench.lda use, both parts, each fast parser, one block
    and blocks of 100 kB."""
    from vips.datasets.wikipedia import load_wikipedia, write_bag_of_words

    corpus = load_wikipedia()
    for part in (corpus.train, corpus.test):
        docword, vocab = tmp_path / "docword.txt", tmp_path / "vocab.txt"
        write_bag_of_words(part, corpus.vocabulary, docword, vocab)
        words = read_vocabulary(vocab)
        expected = whole_file_read(docword, words)
        assert expected.documents == part.shape[0] and expected.word_ids.size == part.nnz
        for small, block in [(1 << 30, None), (0, None), (0, 100_003)]:
            monkeypatch.setattr(reader, "SMALL_DOCWORD_BYTES", small)
            assert_same(read_docword(docword, words, block_bytes=block), expected)


HEADER = "4\n3\n"
#: (entry lines, NNZ, the error: the same line whatever the block size)
BAD_FILES = [
    ("1 1 2\n1 2 0\n", 2, r"line 5: a count must be a positive whole number"),
    ("1 1 2\n2 2 -4\n", 2, r"line 5: a count must be a positive whole number"),
    ("1 1 2\n2 2 4294967297\n", 2, r"line 5: a count above 2147483647"),
    ("1 1 2\n2 2 99999999999999999999999\n", 2, r"line 5: a count above 2147483647"),
    ("1 1 2\n2 2 " + "9" * 5000 + "\n", 2, r"line 5: a count above 2147483647"),
    ("1 1 2\n-" + "9" * 5000 + " 2 1\n", 2, r"line 5: docID outside 1\.\.4"),
    ("1 1 2\n2 4 1\n", 2, r"line 5: wordID outside 1\.\.3"),
    ("1 1 2\n2 0 1\n", 2, r"line 5: wordID outside 1\.\.3"),
    ("1 1 2\n5 1 1\n", 2, r"line 5: docID outside 1\.\.4"),
    ("0 1 2\n", 1, r"line 4: docID outside 1\.\.4"),
    ("1 1 2\n1 2 1\n3 1 1\n2 3 1\n", 4, r"line 7: the entries are not sorted by docID.*sort -n -k1,1 -k2,2"),
    ("1 1 2\n2 3 1\n2 1 1\n2 3 4\n", 4, r"line 7: a \(docID, wordID\) pair appears twice"),
    ("1 1 2\n2 1 x\n", 2, r"line 5: expected three whole numbers: docID wordID count"),
    ("1 1 2\n2 1 2.0\n", 2, r"line 5: expected three whole numbers: docID wordID count"),
    ("1 1 2\n2 1 0x2\n", 2, r"line 5: expected three whole numbers: docID wordID count"),
    ("1 1 2\n2 1\n", 2, r"line 5: expected three whole numbers: docID wordID count"),
    ("1 1 2\n2 1 1 1\n", 2, r"line 5: expected three whole numbers: docID wordID count"),
    ("1 1 2\n\n2 1 1\n", 3, r"line 5: empty line between entries"),
    ("1 1 2\n2 1 1\n", 3, r"NNZ on line 3 says 3 entries, the file has 2"),
    ("1 1 2\n2 1 1\n3 1 1\n", 2, r"line 6: more entries than NNZ on line 3 says \(2\)"),
    ("1 1 2\n2 1\x00 1\n", 2, r"line 5: a NUL byte at byte 4 of the line"),
    ("1 1 2\n2 1 \xff\n", 2, r"line 5: not UTF-8 text"),
    # The first problem in file order wins, whichever check finds it.
    ("1 1 2\n3 1 1\n2 1 1\n4 9 0\n", 4, r"line 6: the entries are not sorted"),
    ("1 1 2\n3 1 1\n2 1 0\n", 3, r"line 6: a count must be"),  # one line, two problems: in this order
    ("1 1 2\n1 1 2\n2 1 x\n", 3, r"line 5: a \(docID, wordID\) pair appears twice"),
]


@pytest.mark.parametrize(("entries", "nnz", "message"), BAD_FILES, ids=[m for _, _, m in BAD_FILES])
def test_each_error_names_its_line_in_every_block_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, entries: str, nnz: int, message: str, small_chunks: None
) -> None:
    path = tmp_path / "bad.txt"
    path.write_bytes(f"{HEADER}{nnz}\n{entries}".encode("latin-1"))
    for small in (0, 1 << 30):
        monkeypatch.setattr(reader, "SMALL_DOCWORD_BYTES", small)
        for block in BLOCKS:
            with pytest.raises(FormatError, match=message) as caught:
                read_docword(path, vocabulary(3), block_bytes=block)
            assert caught.value.__cause__ is None and caught.value.__context__ is None


def test_header_errors(tmp_path: Path) -> None:
    path = tmp_path / "h.txt"
    for text, message in [
        ("4\n3\n", "starts with three lines D, W and NNZ"),
        ("4\nx\n1\n1 1 1\n", "line 2: expected a non-negative whole number"),
        ("4\n3\n\n", "line 3: expected a non-negative whole number"),
        ("4\n5\n1\n1 1 1\n", "line 2: W = 5 but the vocabulary has 3 words"),
        ("4294967296\n3\n0\n", "line 1: D is above 2147483647 documents"),
    ]:
        path.write_text(text)
        with pytest.raises(FormatError, match=message):
            read_docword(path, vocabulary(3))
    path.write_text("4\n3\n" + "1" * 40 + "\n")
    with pytest.raises(FormatError, match="line 3: longer than 30 bytes"):
        DocwordStream(path, vocabulary(3), max_line_bytes=30)


def test_an_over_long_entry_line_is_refused_in_any_block(tmp_path: Path) -> None:
    path = tmp_path / "long.txt"
    path.write_text("4\n3\n3\n1 1 1\n2 1 " + "0" * 40 + "1\n3 1 1\n")
    for block in BLOCKS:
        with pytest.raises(FormatError, match="line 5: longer than 30 bytes"):
            list(DocwordStream(path, vocabulary(3), block_bytes=block, max_line_bytes=30).chunks())


def test_no_error_carries_a_value(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The parsers' messages quote the cell: the errors raised name the line, and no exception in their
    chain holds a value of the file."""
    secret = "7777777"
    for bad in (f"2 1 {secret}x", f"2 1 {secret}{secret}{secret}", f"9{secret} 1 1", f"2 {secret} 1"):
        path = tmp_path / "secret.txt"
        path.write_text(f"{HEADER}2\n1 1 2\n{bad}\n")
        for small in (0, 1 << 30):
            monkeypatch.setattr(reader, "SMALL_DOCWORD_BYTES", small)
            with pytest.raises(FormatError) as caught:
                read_docword(path, vocabulary(3))
            seen: BaseException | None = caught.value
            while seen is not None:
                assert secret not in str(seen)
                seen = seen.__cause__ or seen.__context__


def stored_documents(sensitive: Engine, name: str) -> list[tuple[int, int, bytes]]:
    """Every stored block of a dataset, byte for byte (first row, row count, features blob)."""
    with sensitive.connect() as conn:
        found = conn.execute(
            select(blocks.c.first_row, blocks.c.row_count, blocks.c.features)
            .where(blocks.c.dataset == name)
            .order_by(blocks.c.first_row)
        ).all()
    return [(int(r.first_row), int(r.row_count), bytes(r.features)) for r in found]


def test_streamed_ingest_stores_the_blocks_of_the_whole_file(
    engines: tuple[Engine, Engine], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Blocks of 4 documents, chunks of 3 and 64-byte reads: the stored blocks are byte for byte those the
    whole-file reader's corpus gives (full blocks; a chunk's partial block waits for the next chunk)."""
    control, sensitive = engines
    monkeypatch.setattr(reader, "CHUNK_DOCUMENTS", 3)
    monkeypatch.setattr(reader, "DOCWORD_BLOCK_BYTES", 64)
    monkeypatch.setattr(block_layout, "BOW_BLOCK_ROWS", 4)
    rng = np.random.default_rng(3)
    entries = random_entries(rng, 41, 30, shuffle_words=True, long_every=5)
    path = write_docword(tmp_path / "d.txt", entries, 41, 30)
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(vocabulary(30)) + "\n")
    meta = ingest(control=control, sensitive=sensitive, name="streamed", kind="bow", path=path, vocab=vocab,
                  vocabulary_public=True)  # fmt: skip
    assert (meta.population, meta.dimension) == (41, 30)
    store_encoded(
        control=control,
        sensitive=sensitive,
        name="whole",
        kind="bow",
        encoded=encode_bag_of_words(whole_file_read(path, vocabulary(30))),
        public=False,
        owner=None,
    )
    streamed = stored_documents(sensitive, "streamed")
    assert streamed == stored_documents(sensitive, "whole")
    assert [count for _, count, _ in streamed] == [4] * 10 + [1]


def test_a_long_run_of_held_documents_is_written_short(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Documents held back to fill a block are bounded by entries, not only by documents."""
    rng = np.random.default_rng(5)
    entries = random_entries(rng, 30, 50, shuffle_words=False, long_every=2)
    path = write_docword(tmp_path / "d.txt", entries, 30, 50)
    monkeypatch.setattr(reader, "CHUNK_DOCUMENTS", 3)
    stream = DocwordStream(path, vocabulary(50), block_bytes=64)
    batches = list(ingest_module._document_batches(stream.chunks(), 50, block_rows=8))
    assert [b.size for b in batches] == [8, 8, 8, 6]
    monkeypatch.setattr(ingest_module, "HELD_ENTRIES", 10)
    stream = DocwordStream(path, vocabulary(50), block_bytes=64)
    short = list(ingest_module._document_batches(stream.chunks(), 50, block_rows=8))
    assert len(short) > 4 and sum(b.size for b in short) == 30
    expected = whole_file_read(path, vocabulary(50))
    for got in (batches, short):
        joined = np.concatenate([b.counts.toarray() for b in got if b.counts is not None])
        np.testing.assert_array_equal(joined, encode_counts(expected))


def encode_counts(corpus: BagOfWords) -> np.ndarray:
    dense = np.zeros((corpus.documents, len(corpus.vocabulary)), dtype=np.int32)
    for d in range(corpus.documents):
        lo, hi = corpus.indptr[d], corpus.indptr[d + 1]
        dense[d, corpus.word_ids[lo:hi]] = corpus.counts[lo:hi]
    return dense


@pytest.mark.parametrize(
    ("late", "message"),
    [("39 1 0", "line 82: a count must be"), ("38 1 1", "line 82: the entries are not sorted")],
)
def test_an_error_after_written_chunks_leaves_nothing(
    engines: tuple[Engine, Engine], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, late: str, message: str
) -> None:
    control, sensitive = engines
    monkeypatch.setattr(reader, "CHUNK_DOCUMENTS", 3)
    monkeypatch.setattr(reader, "DOCWORD_BLOCK_BYTES", 64)
    monkeypatch.setattr(block_layout, "BOW_BLOCK_ROWS", 4)
    entries = [(d, w, 1) for d in range(1, 40) for w in (1, 2)]
    path = write_docword(tmp_path / "d.txt", entries, 40, 3, nnz=len(entries) + 1)
    path.write_text(path.read_text() + late + "\n")
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(vocabulary(3)) + "\n")
    written: list[int] = []
    original = ingest_module.write_blocks

    def spy(conn, name, kind, first_row, chunk):  # type: ignore[no-untyped-def]
        written.append(chunk.size)
        original(conn, name, kind, first_row, chunk)

    monkeypatch.setattr(ingest_module, "write_blocks", spy)
    with pytest.raises(IngestError, match=message):
        ingest(control=control, sensitive=sensitive, name="d", kind="bow", path=path, vocab=vocab,
                  vocabulary_public=True)  # fmt: skip
    assert sum(written) >= 32  # several chunks were written before the error was read
    with sensitive.connect() as conn:
        assert conn.execute(select(func.count()).select_from(blocks)).scalar_one() == 0
        assert conn.execute(select(func.count()).select_from(stored_datasets)).scalar_one() == 0


def test_unsorted_error_gives_the_fix(tmp_path: Path) -> None:
    path = tmp_path / "my docword.txt"
    path.write_text("3\n3\n2\n2 1 1\n1 1 1\n")
    with pytest.raises(FormatError) as caught:
        read_docword(path, vocabulary(3))
    text = str(caught.value)
    assert "line 5" in text and "sort -n -k1,1 -k2,2" in text
    assert re.search(r"head -n 3 '[^']*my docword\.txt'", text)
