"""Custodian-side ingestion: files into the sensitive database, public metadata into the control database.

The wall enforces the bounds the sensitivities assume and rejects, never repairs: tabular rows must have
L2 norm <= 1 and labels in {0, 1} (regression: real targets in [-1, 1]); binary data must be 0/1;
bag-of-words ids must match the public vocabulary. Errors name the file line, never a value.

Files are read and written in chunks (privacy_wall.data.formats.TabularStream, DocwordStream; one bounded
transaction of rows per chunk), so memory does not grow with the file. The commit point is the
population: the sensitive `stored_datasets` row and the rows are written first, the control database's
catalogue entry (or, for an append, the new population) last; any failure removes what was written, and
the leftover of a killed ingest (a stored dataset the catalogue does not list, rows at or above the
population) is removed by the next ingest of that name. Appending rows is allowed only while the dataset
has no charge and no open reservation: its population is part of every charged event.

When the dataset has a budget (set before its first ingest, or before an append) and is private, its
delta must stay below 1/N (privacy_wall.ledger.delta_policy): the rows stop at the most that delta allows (no
chunk past it is written, the rest of the file is only counted, for the refusal's N) and the budget is
read again at the commit point, in its transaction; a refusal leaves the dataset as it was.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, cast

import numpy as np
import scipy.sparse as sp
from numpy.typing import NDArray
from sqlalchemy import Connection, Engine, delete, func, insert, select, text, update

from privacy_wall.data import blocks as block_layout
from privacy_wall.data.docword import BagOfWords, DocumentChunk, DocwordStream, read_vocabulary
from privacy_wall.data.formats import TABLE_BLOCK_BYTES, FormatError, TabularChunk, TabularStream
from privacy_wall.data.schema import blocks, stored_datasets
from privacy_wall.data.store import ROW_NORM_TOLERANCE, Batch
from privacy_wall.data.vocabulary import DECLARED, public_construction
from privacy_wall.ledger.delta_policy import delta_problem, largest_population, suggested_delta, within_bound
from privacy_wall.ledger.schema import budgets, charges, datasets, reservations
from privacy_wall.names import NAME_RULE, is_dataset_name

Kind = Literal["tabular", "regression", "bow", "binary"]
KINDS: tuple[Kind, ...] = ("tabular", "regression", "bow", "binary")
#: Documents per write transaction for an in-memory corpus (files are written a parsed block at a time).
WRITE_ROWS = 65_536
#: Entries of documents a bag-of-words file's ingest holds back to fill a block with the next chunk's.
HELD_ENTRIES = 1 << 22


class IngestError(ValueError):
    """A file or request that cannot be ingested. Never carries data values."""


@dataclass(frozen=True)
class Ingested:
    """The public metadata of a newly ingested dataset."""

    name: str
    kind: Kind
    population: int
    dimension: int
    schema: dict[str, Any]
    public: bool


@dataclass(frozen=True)
class _Encoded:
    """A file's public shape and its checked rows, chunk by chunk as they are read (an iterator: once)."""

    chunks: Iterator[Batch]
    dimension: int
    schema: dict[str, Any]


def _tabular(path: Path, label: str | None, *, regression: bool = False, block_bytes: int) -> _Encoded:
    if label is None:
        what = "real target column (|y| <= 1)" if regression else "0/1 label column"
        raise IngestError(
            f"{'regression' if regression else 'tabular'} data needs --label: the name of its {what}"
        )
    stream = TabularStream(path, label, binary_label=not regression, block_bytes=block_bytes)
    return _Encoded(
        _tabular_chunks(path, label, stream.chunks()),
        stream.dimension,
        {"features": list(stream.feature_names), "label": label},
    )


def _tabular_chunks(path: Path, label: str, chunks: Iterator[TabularChunk]) -> Iterator[Batch]:
    for chunk in chunks:
        assert chunk.labels is not None
        too_large = np.abs(chunk.labels) > 1.0
        if too_large.any():
            line = int(np.argmax(too_large)) + chunk.first_line
            total = int(too_large.sum()) + _count_rest(chunks, _target_too_large)
            raise IngestError(
                f"{path}: line {line}: the target {label!r} is outside [-1, 1] ({total} rows in "
                "all); scale targets with public bounds before ingesting"
            )
        too_long = _too_long(chunk.features)
        if too_long.any():
            line = int(np.argmax(too_long)) + chunk.first_line
            total = int(too_long.sum()) + _count_rest(chunks, lambda c: _too_long(c.features))
            raise IngestError(
                f"{path}: line {line}: the row's L2 norm is above 1 ({total} rows in all); "
                "scale rows to norm <= 1 with public bounds before ingesting"
            )
        yield Batch(chunk.features, chunk.labels)


def _target_too_large(chunk: TabularChunk) -> NDArray[np.bool_]:
    return np.zeros(chunk.rows, dtype=bool) if chunk.labels is None else np.abs(chunk.labels) > 1.0


def _too_long(features: NDArray[np.float64]) -> NDArray[np.bool_]:
    return np.asarray(np.linalg.norm(features, axis=1) > 1.0 + ROW_NORM_TOLERANCE)


def _count_rest(chunks: Iterator[TabularChunk], bad: Callable[[TabularChunk], NDArray[np.bool_]]) -> int:
    """Rows of the remaining chunks that break a bound (for an error's "n rows in all"), as far as the
    file parses."""
    total = 0
    try:
        for chunk in chunks:
            total += int(np.count_nonzero(bad(chunk)))
    except FormatError:
        pass
    return total


def _bow(path: Path, vocab: Path | None) -> _Encoded:
    if vocab is None:
        raise IngestError("bag-of-words data needs --vocab: the public vocabulary, one word per line")
    stream = DocwordStream(path, read_vocabulary(vocab))
    words = len(stream.vocabulary)
    return _Encoded(_document_batches(stream.chunks(), words), words, {"vocabulary": list(stream.vocabulary)})


def _document_batches(
    chunks: Iterator[DocumentChunk], words: int, block_rows: int | None = None
) -> Iterator[Batch]:
    """The documents as sparse count rows, a chunk of the file at a time, in whole blocks of `block_rows`
    (default blocks.BOW_BLOCK_ROWS) documents, as encode_bag_of_words writes them: the documents of a
    partial block wait for the next chunk, unless they hold more than HELD_ENTRIES entries (then the block
    is written short)."""
    block_rows = block_layout.BOW_BLOCK_ROWS if block_rows is None else block_rows
    held: sp.csr_array | None = None
    for chunk in chunks:
        counts = sp.csr_array((chunk.counts, chunk.word_ids, chunk.indptr), shape=(chunk.documents, words))
        if held is not None:
            counts = sp.csr_array(sp.vstack([held, counts], format="csr"))
        total = int(counts.shape[0])
        cut = total - total % block_rows
        if cut < total and int(counts.indptr[-1] - counts.indptr[cut]) > HELD_ENTRIES:
            cut = total
        if cut:
            yield Batch.of_documents(sp.csr_array(counts[:cut]))
        held = sp.csr_array(counts[cut:]) if cut < total else None
    if held is not None:
        yield Batch.of_documents(held)


def encode_bag_of_words(corpus: BagOfWords, chunk_rows: int = WRITE_ROWS) -> _Encoded:
    """The corpus's documents as sparse count rows, `chunk_rows` documents at a time."""
    indptr = np.asarray(corpus.indptr, dtype=np.int64)

    def chunks() -> Iterator[Batch]:
        for first in range(0, corpus.documents, chunk_rows):
            last = min(first + chunk_rows, corpus.documents)
            lo, hi = int(indptr[first]), int(indptr[last])
            counts = sp.csr_array(
                (
                    corpus.counts[lo:hi].astype(np.int32),
                    corpus.word_ids[lo:hi].astype(np.int32),
                    indptr[first : last + 1] - lo,
                ),
                shape=(last - first, len(corpus.vocabulary)),
            )
            yield Batch.of_documents(counts)

    return _Encoded(chunks(), len(corpus.vocabulary), {"vocabulary": list(corpus.vocabulary)})


def _binary(path: Path, block_bytes: int) -> _Encoded:
    stream = TabularStream(path, None, binary_values=True, block_bytes=block_bytes)

    def chunks() -> Iterator[Batch]:
        for chunk in stream.chunks():
            yield Batch(chunk.features)

    return _Encoded(chunks(), stream.dimension, {"columns": list(stream.feature_names)})


def encode_file(
    kind: str,
    path: Path,
    label: str | None = None,
    vocab: Path | None = None,
    *,
    block_bytes: int = TABLE_BLOCK_BYTES,
) -> _Encoded:
    """The file's shape (its header is read and checked now) and its rows as they are read."""
    if kind == "tabular":
        return _tabular(path, label, block_bytes=block_bytes)
    if kind == "regression":
        return _tabular(path, label, regression=True, block_bytes=block_bytes)
    if kind == "bow":
        return _bow(path, vocab)
    if kind == "binary":
        return _binary(path, block_bytes)
    raise IngestError(f"unknown kind {kind!r}; expected one of {', '.join(KINDS)}")


#: The source recorded for the vocabulary of a dataset ingested as public (--public) as a whole.
PUBLIC_DATASET = "part of a dataset ingested as public"


def vocabulary_source(vocabulary: list[str], *, confirmed: bool, public_dataset: bool) -> str:
    """Where a new bag-of-words dataset's vocabulary comes from, for its schema: a construction from public
    facts the service recognises (privacy_wall.data.vocabulary), else the custodian's confirmation, else
    the dataset's own public status; a vocabulary with none of them is refused (its words would be shown
    to analysts). The message names no word."""
    recognised = public_construction(vocabulary)
    if recognised is not None:
        return recognised
    if confirmed:
        return DECLARED
    if public_dataset:
        return PUBLIC_DATASET
    raise IngestError(
        f"the vocabulary ({len(vocabulary)} words) is not one the service can tell is public, and analysts "
        "see it: a vocabulary built from the sensitive texts (their words that occur, in their order) tells "
        "which words they use. Build a public one with `vips data prepare-text --vocab-size N` (wordfreq's "
        "N most frequent English words) or from a public corpus (--vocab-from), or confirm that this list "
        "is public, not derived from the sensitive texts, with --vocab-is-public"
    )


def _check_name(name: str) -> None:
    if not is_dataset_name(name):
        raise IngestError(NAME_RULE)


def ingest(
    *,
    control: Engine,
    sensitive: Engine,
    name: str,
    kind: str,
    path: Path,
    label: str | None = None,
    vocab: Path | None = None,
    vocabulary_public: bool = False,
    public: bool = False,
    owner: str | None = None,
    append: bool = False,
    block_bytes: int = TABLE_BLOCK_BYTES,
) -> Ingested:
    """Validate and store a dataset (or, with `append`, add a file's rows to an existing one that has no
    charge and no open reservation); on any failure nothing stays written (an appended-to dataset stays
    as it was). A new bag-of-words dataset's vocabulary must be public by construction or confirmed public
    by the custodian (`vocabulary_public`; vocabulary_source)."""
    _check_name(name)
    if kind not in KINDS:
        raise IngestError(f"unknown kind {kind!r}; expected one of {', '.join(KINDS)}")
    if append:
        _appendable(control, name, kind)  # before reading the file: a refusal costs nothing
    try:
        encoded = encode_file(kind, Path(path), label, vocab, block_bytes=block_bytes)
        if kind == "bow" and not append:
            encoded.schema["vocabulary_source"] = vocabulary_source(
                encoded.schema["vocabulary"], confirmed=vocabulary_public, public_dataset=public
            )
        if append:
            return append_encoded(control=control, sensitive=sensitive, name=name, kind=kind, encoded=encoded)
        return store_encoded(
            control=control,
            sensitive=sensitive,
            name=name,
            kind=kind,
            encoded=encoded,
            public=public,
            owner=owner,
        )
    except FormatError as exc:
        raise IngestError(str(exc)) from None


def _check_corpus(corpus: BagOfWords) -> None:
    """What read_docword guarantees of a parsed file: a well-formed CSR layout, word ids inside the
    vocabulary, each (document, word) once, positive counts. Messages name the document, never a value."""
    indptr = np.asarray(corpus.indptr, dtype=np.int64)
    ids = np.asarray(corpus.word_ids, dtype=np.int64)
    counts = np.asarray(corpus.counts, dtype=np.int64)
    if (
        indptr.ndim != 1
        or indptr.size < 1
        or indptr[0] != 0
        or indptr[-1] != ids.size
        or ids.shape != counts.shape
        or np.any(np.diff(indptr) < 0)
    ):
        raise IngestError("the corpus is not a well-formed CSR layout (indptr, word_ids, counts)")
    entries = np.diff(indptr)
    documents = np.repeat(np.arange(indptr.size - 1), entries)
    for problem, bad in (
        ("a word id outside the vocabulary", (ids < 0) | (ids >= len(corpus.vocabulary))),
        ("a count that is not a positive whole number", counts < 1),
    ):
        if bad.any():
            raise IngestError(f"document {int(documents[np.argmax(bad)])} has {problem}")
    merged = sp.csr_array((counts, ids, indptr), shape=(indptr.size - 1, len(corpus.vocabulary)))
    merged.sum_duplicates()  # sorts each document's words; fewer entries where a word was listed twice
    shrunk = np.diff(merged.indptr) != entries
    if shrunk.any():
        raise IngestError(f"document {int(np.argmax(shrunk))} lists a word twice")


def ingest_bag_of_words(
    *,
    control: Engine,
    sensitive: Engine,
    name: str,
    corpus: BagOfWords,
    vocabulary_public: bool = False,
    public: bool = False,
    owner: str | None = None,
) -> Ingested:
    """A corpus the custodian already holds in memory (e.g. generated), stored as `vips data ingest
    --kind bow` would store its docword file; the same checks (its vocabulary's source included), the same
    all-or-nothing writes."""
    _check_name(name)
    _check_corpus(corpus)
    encoded = encode_bag_of_words(corpus)
    encoded.schema["vocabulary_source"] = vocabulary_source(
        encoded.schema["vocabulary"], confirmed=vocabulary_public, public_dataset=public
    )
    return store_encoded(
        control=control,
        sensitive=sensitive,
        name=name,
        kind="bow",
        encoded=encoded,
        public=public,
        owner=owner,
    )


def write_blocks(conn: Connection, name: str, kind: str, first_row: int, chunk: Batch) -> None:
    """Consecutive checked rows of dataset `name`, ids first_row, first_row + 1, ..., as whole blocks of
    `blocks.block_rows` rows (the last may be shorter); one executemany with the blobs as binary
    parameters."""
    dimension = chunk.counts.shape[1] if chunk.counts is not None else chunk.features.shape[1]
    per_block = block_layout.block_rows(kind, int(dimension))
    values = []
    offset = first_row
    for part in block_layout.split(chunk, per_block):
        features, labels = block_layout.encode(kind, part)
        values.append((name, offset, part.size, features, labels))
        offset += part.size
    marks = ", ".join(["?" if conn.dialect.paramstyle == "qmark" else "%s"] * 5)
    conn.exec_driver_sql(
        f'INSERT INTO "blocks" (dataset, first_row, row_count, features, labels) VALUES ({marks})', values
    )


@dataclass(frozen=True)
class _DeltaBound:
    """The delta of a private dataset's budget and the most rows it allows (delta < 1/N)."""

    name: str
    delta: float
    rows: int

    def refusal(self, population: int, exact: bool = True) -> IngestError:
        problem = delta_problem(self.delta, population)
        counted = "" if exact else f" (at least N = {population}: the rest of the file does not parse)"
        return IngestError(
            f"dataset {self.name!r}: its budget's {problem}{counted}; nothing was stored. Set a smaller "
            f"delta first (vips budget set {self.name} --epsilon E --delta {suggested_delta(population):g}), "
            "possible while nothing is charged against it"
        )

    def check(self, population: int) -> None:
        if not within_bound(self.delta, population):
            raise self.refusal(population)


def _delta_bound(conn: Connection, name: str, public: bool) -> _DeltaBound | None:
    """The bound a private dataset's budget puts on its population; None when public or without one."""
    if public:
        return None
    delta = conn.execute(select(budgets.c.delta).where(budgets.c.dataset == name)).scalar_one_or_none()
    return None if delta is None else _DeltaBound(name, float(delta), largest_population(float(delta)))


def _rows_left(chunks: Iterator[Batch]) -> tuple[int, bool]:
    """The rows of the remaining chunks, only counted; and whether the rest parsed (else a lower bound)."""
    total = 0
    try:
        for chunk in chunks:
            total += chunk.size
    except (FormatError, IngestError):
        return total, False
    return total, True


def _write_chunks(
    sensitive: Engine,
    name: str,
    kind: str,
    first_row: int,
    chunks: Iterator[Batch],
    bound: _DeltaBound | None = None,
) -> int:
    """Every chunk in its own transaction; the number of rows written. With a `bound`, a chunk that
    would take the population (first_row + rows) above the rows its delta allows is not written: the rest
    is counted and the bound's refusal raised."""
    written = 0
    for chunk in chunks:
        if chunk.size:
            if bound is not None and first_row + written + chunk.size > bound.rows:
                left, exact = _rows_left(chunks)
                raise bound.refusal(first_row + written + chunk.size + left, exact)
            with sensitive.begin() as conn:
                write_blocks(conn, name, kind, first_row + written, chunk)
            written += chunk.size
    return written


def _stored_rows(conn: Connection, name: str) -> int:
    """Rows in the dataset's blocks."""
    return int(
        conn.execute(
            select(func.coalesce(func.sum(blocks.c.row_count), 0)).where(blocks.c.dataset == name)
        ).scalar_one()
    )


def _analyze(sensitive: Engine) -> None:
    if sensitive.dialect.name == "postgresql":
        # Fresh statistics, so minibatch lookups use the (dataset, row_id) key for both columns
        # instead of filtering the dataset's rows (the planner assumes an empty table until then).
        with sensitive.begin() as conn:
            conn.execute(text("ANALYZE blocks"))


def _catalogued(control: Engine, name: str) -> bool:
    with control.connect() as conn:
        return conn.execute(select(datasets.c.name).where(datasets.c.name == name)).first() is not None


def _remove_stored(sensitive: Engine, name: str) -> None:
    with sensitive.begin() as conn:
        conn.execute(delete(blocks).where(blocks.c.dataset == name))
        conn.execute(delete(stored_datasets).where(stored_datasets.c.name == name))


def store_encoded(
    *,
    control: Engine,
    sensitive: Engine,
    name: str,
    kind: str,
    encoded: _Encoded,
    public: bool,
    owner: str | None,
) -> Ingested:
    """Write a new dataset: its stored_datasets row (population 0), the rows chunk by chunk, its
    population, and last its catalogue entry in the control database (the commit point); a failure
    anywhere removes what was written. A stored dataset of that name the catalogue does not list is the
    leftover of a killed ingest: it is removed first."""
    now = datetime.now(UTC)
    if _catalogued(control, name):
        raise IngestError(
            f"dataset {name!r} already exists (vips data ingest {name} --append adds rows to it)"
        )
    with control.connect() as conn:
        bound = _delta_bound(conn, name, public)  # a budget set before the dataset's first ingest
    _remove_stored(sensitive, name)  # a killed ingest's leftover, if any
    # Until the population is set, the stored row's population is a negative token of this ingest: a
    # second ingest of the same name meanwhile replaces it, and this one then fails instead of committing
    # rows that are not all its own.
    token = -secrets.randbelow(2**31 - 1) - 1
    with sensitive.begin() as conn:
        conn.execute(
            insert(stored_datasets).values(
                name=name,
                kind=kind,
                population=token,
                dimension=encoded.dimension,
                public=public,
                created_at=now,
            )
        )
    try:
        population = _write_chunks(sensitive, name, kind, 0, encoded.chunks, bound)
        if population == 0:
            raise IngestError(f"dataset {name!r}: no rows to store")
        with sensitive.begin() as conn:
            ours = conn.execute(
                update(stored_datasets)
                .where(stored_datasets.c.name == name, stored_datasets.c.population == token)
                .values(population=population)
            ).rowcount
            if ours != 1 or _stored_rows(conn, name) != population:
                raise IngestError(f"dataset {name!r} was being ingested twice at once: nothing stored")
        with control.begin() as conn:
            conn.execute(
                insert(datasets).values(
                    name=name,
                    kind=kind,
                    population=population,
                    dimension=encoded.dimension,
                    schema=encoded.schema,
                    public=public,
                    owner=owner,
                    created_at=now,
                )
            )
            now_bound = _delta_bound(conn, name, public)  # read after the catalogue row is written: a
            if now_bound is not None:  # budget set meanwhile is seen here, or sees this dataset
                now_bound.check(population)
    except BaseException:
        if not _catalogued(control, name):  # never remove a dataset that a concurrent ingest committed
            _remove_stored(sensitive, name)
        raise
    _analyze(sensitive)
    return Ingested(name, cast(Kind, kind), population, encoded.dimension, encoded.schema, public)


def _appendable(control: Connection | Engine, name: str, kind: str) -> Any:
    """The catalogue entry of a dataset rows may be appended to: it exists, is of `kind`, and has no
    charge and no open reservation. Otherwise an IngestError saying why."""
    if isinstance(control, Engine):
        with control.connect() as conn:
            return _appendable(conn, name, kind)
    entry = control.execute(select(datasets).where(datasets.c.name == name)).one_or_none()
    if entry is None:
        raise IngestError(f"no dataset {name!r} to append to (ingest it first, without --append)")
    if entry.kind != kind:
        raise IngestError(f"dataset {name!r} is {entry.kind} data: --kind {kind} rows cannot be appended")
    charged = control.execute(select(charges.c.id).where(charges.c.dataset == name).limit(1)).first()
    reserved = control.execute(
        select(reservations.c.job_id)
        .where(reservations.c.dataset == name, reservations.c.open.is_(True))
        .limit(1)
    ).first()
    if charged is not None or reserved is not None:
        why = "has been charged for" if charged is not None else "has a job with an open reservation"
        raise IngestError(
            f"dataset {name!r} {why}: rows cannot be appended (its population is part of every charged "
            "event); ingest them as a new dataset"
        )
    return entry


def append_encoded(
    *, control: Engine, sensitive: Engine, name: str, kind: str, encoded: _Encoded
) -> Ingested:
    """Add rows to an existing dataset with the same kind and columns (or vocabulary), ids continuing
    after its population, while it has no charge and no open reservation. The rows are written chunk by
    chunk; then, holding the control database's lock on the budget (what admission takes), the absence of
    charges and reservations is checked again and the population is updated in the sensitive database and
    last in the control database (the commit point). A failure anywhere leaves the dataset as it was."""
    entry = _appendable(control, name, kind)
    kept = {key: value for key, value in entry.schema.items() if key != "vocabulary_source"}
    if kept != encoded.schema or entry.dimension != encoded.dimension:
        what = {"bow": "vocabulary", "binary": "columns"}.get(kind, "columns (and label)")
        raise IngestError(f"dataset {name!r}: the file's {what} differ from the dataset's: cannot append")
    before = int(entry.population)
    with control.connect() as conn:
        bound = _delta_bound(conn, name, bool(entry.public))
    with sensitive.begin() as conn:
        stored = conn.execute(
            select(stored_datasets).where(stored_datasets.c.name == name).with_for_update()
        ).one_or_none()
        if stored is None:
            raise IngestError(f"dataset {name!r} is in the catalogue but not in the sensitive store")
        # The catalogue's population is the truth: undo what a killed append left behind.
        conn.execute(delete(blocks).where(blocks.c.dataset == name, blocks.c.first_row >= before))
        conn.execute(update(stored_datasets).where(stored_datasets.c.name == name).values(population=before))

    def restore() -> None:
        """Back to `before`, unless a concurrent append committed meanwhile (then its rows stay)."""
        with control.connect() as conn:
            now = conn.execute(select(datasets.c.population).where(datasets.c.name == name)).scalar_one()
        if int(now) != before:
            return
        with sensitive.begin() as conn:
            conn.execute(delete(blocks).where(blocks.c.dataset == name, blocks.c.first_row >= before))
            conn.execute(
                update(stored_datasets).where(stored_datasets.c.name == name).values(population=before)
            )

    try:
        added = _write_chunks(sensitive, name, kind, before, encoded.chunks, bound)
        if added == 0:
            raise IngestError(f"dataset {name!r}: no rows to append")
        population = before + added
        with control.begin() as conn:
            # Admission locks the budget row: take it too, so no job is admitted until both populations
            # are updated (on SQLite the transaction holds the control database's write lock).
            conn.execute(select(budgets.c.dataset).where(budgets.c.dataset == name).with_for_update()).first()
            _appendable(conn, name, kind)
            changed = conn.execute(
                update(datasets)
                .where(datasets.c.name == name, datasets.c.population == before)
                .values(population=population)
            ).rowcount
            if changed != 1:
                raise IngestError(f"dataset {name!r} changed during the append: nothing appended")
            now_bound = _delta_bound(conn, name, bool(entry.public))  # read after the update: a budget
            if now_bound is not None:  # set meanwhile is seen here, or sees the new population
                now_bound.check(population)
            with sensitive.begin() as stored_conn:
                if _stored_rows(stored_conn, name) != population:
                    raise IngestError(f"dataset {name!r} was appended to twice at once: nothing appended")
                stored_conn.execute(
                    update(stored_datasets)
                    .where(stored_datasets.c.name == name)
                    .values(population=population)
                )
    except BaseException:
        restore()
        raise
    _analyze(sensitive)
    schema = dict(entry.schema)  # the dataset's, its vocabulary's source included
    return Ingested(name, cast(Kind, kind), population, encoded.dimension, schema, bool(entry.public))
