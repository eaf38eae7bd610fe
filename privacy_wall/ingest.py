"""Custodian-side ingestion: files into the sensitive database, public metadata into the control database.

The wall enforces the bounds the sensitivities assume and rejects, never repairs: tabular rows must have
L2 norm <= 1 and labels in {0, 1} (regression: real targets in [-1, 1]); binary data must be 0/1;
bag-of-words ids must match the public vocabulary. Errors name the file line, never a value. Nothing is
written when anything fails: the rows go in one transaction, the catalogue entry in another, and a failure
of the second removes the first.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, cast

import numpy as np
import scipy.sparse as sp
from sqlalchemy import Engine, delete, insert, select, text

from privacy_wall.control_schema import datasets
from privacy_wall.formats import (
    FIRST_DATA_LINE,
    BagOfWords,
    FormatError,
    read_binary_csv,
    read_docword,
    read_tabular_csv,
    read_vocabulary,
)
from privacy_wall.names import NAME_RULE, is_dataset_name
from privacy_wall.sensitive_schema import rows, stored_datasets
from privacy_wall.store import ROW_NORM_TOLERANCE

Kind = Literal["tabular", "regression", "bow", "binary"]
KINDS: tuple[Kind, ...] = ("tabular", "regression", "bow", "binary")
INSERT_CHUNK = 5_000


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
    payloads: list[bytes]
    labels: list[float] | None
    dimension: int
    schema: dict[str, Any]


def _tabular(path: Path, label: str | None, *, regression: bool = False) -> _Encoded:
    if label is None:
        what = "real target column (|y| <= 1)" if regression else "0/1 label column"
        raise IngestError(
            f"{'regression' if regression else 'tabular'} data needs --label: the name of its {what}"
        )
    table = read_tabular_csv(path, label, binary_label=not regression)
    assert table.labels is not None
    too_large = np.abs(table.labels) > 1.0
    if too_large.any():
        line = int(np.argmax(too_large)) + FIRST_DATA_LINE
        raise IngestError(
            f"{path}: line {line}: the target {label!r} is outside [-1, 1] ({int(too_large.sum())} rows in "
            "all); scale targets with public bounds before ingesting"
        )
    norms = np.linalg.norm(table.features, axis=1)
    too_long = norms > 1.0 + ROW_NORM_TOLERANCE
    if too_long.any():
        line = int(np.argmax(too_long)) + FIRST_DATA_LINE
        raise IngestError(
            f"{path}: line {line}: the row's L2 norm is above 1 ({int(too_long.sum())} rows in all); "
            "scale rows to norm <= 1 with public bounds before ingesting"
        )
    features = np.ascontiguousarray(table.features, dtype="<f8")
    return _Encoded(
        [row.tobytes() for row in features],
        [float(v) for v in table.labels],
        table.dimension,
        {"features": list(table.feature_names), "label": label},
    )


def _bow(path: Path, vocab: Path | None) -> _Encoded:
    if vocab is None:
        raise IngestError("bag-of-words data needs --vocab: the public vocabulary, one word per line")
    return encode_bag_of_words(read_docword(path, read_vocabulary(vocab)))


def encode_bag_of_words(corpus: BagOfWords) -> _Encoded:
    """Each document as its m int32 word ids then their m int32 counts (db_store.decode_bow reads them)."""
    payloads = []
    for d in range(corpus.documents):
        lo, hi = corpus.indptr[d], corpus.indptr[d + 1]
        ids = corpus.word_ids[lo:hi].astype("<i4")
        counts = corpus.counts[lo:hi].astype("<i4")
        payloads.append(ids.tobytes() + counts.tobytes())
    return _Encoded(payloads, None, len(corpus.vocabulary), {"vocabulary": list(corpus.vocabulary)})


def _binary(path: Path) -> _Encoded:
    table = read_binary_csv(path)
    packed = np.packbits(table.features.astype(np.uint8), axis=1)
    return _Encoded(
        [row.tobytes() for row in packed], None, table.dimension, {"columns": list(table.feature_names)}
    )


def encode_file(kind: str, path: Path, label: str | None = None, vocab: Path | None = None) -> _Encoded:
    if kind == "tabular":
        return _tabular(path, label)
    if kind == "regression":
        return _tabular(path, label, regression=True)
    if kind == "bow":
        return _bow(path, vocab)
    if kind == "binary":
        return _binary(path)
    raise IngestError(f"unknown kind {kind!r}; expected one of {', '.join(KINDS)}")


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
    public: bool = False,
    owner: str | None = None,
) -> Ingested:
    """Validate and store a dataset; on any failure nothing stays written."""
    _check_name(name)
    try:
        encoded = encode_file(kind, Path(path), label, vocab)
    except FormatError as exc:
        raise IngestError(str(exc)) from None
    return store_encoded(
        control=control,
        sensitive=sensitive,
        name=name,
        kind=kind,
        encoded=encoded,
        public=public,
        owner=owner,
    )


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
    public: bool = False,
    owner: str | None = None,
) -> Ingested:
    """A corpus the custodian already holds in memory (e.g. generated), stored as `vips data ingest
    --kind bow` would store its docword file; the same checks, the same all-or-nothing writes."""
    _check_name(name)
    _check_corpus(corpus)
    return store_encoded(
        control=control,
        sensitive=sensitive,
        name=name,
        kind="bow",
        encoded=encode_bag_of_words(corpus),
        public=public,
        owner=owner,
    )


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
    """Write encoded rows and their catalogue entry: rows in one transaction, the entry in another, and a
    failure of the second removes the first."""
    population = len(encoded.payloads)
    now = datetime.now(UTC)
    with control.connect() as conn:
        if conn.execute(select(datasets.c.name).where(datasets.c.name == name)).first() is not None:
            raise IngestError(f"dataset {name!r} already exists")
    with sensitive.begin() as conn:
        if conn.execute(select(stored_datasets.c.name).where(stored_datasets.c.name == name)).first():
            raise IngestError(f"dataset {name!r} already exists in the sensitive store")
        conn.execute(
            insert(stored_datasets).values(
                name=name,
                kind=kind,
                population=population,
                dimension=encoded.dimension,
                public=public,
                created_at=now,
            )
        )
        for start in range(0, population, INSERT_CHUNK):
            stop = min(start + INSERT_CHUNK, population)
            conn.execute(
                insert(rows),
                [
                    {
                        "dataset": name,
                        "row_id": i,
                        "payload": encoded.payloads[i],
                        "label": None if encoded.labels is None else encoded.labels[i],
                    }
                    for i in range(start, stop)
                ],
            )
        if conn.dialect.name == "postgresql":
            # Fresh statistics, so minibatch lookups use the (dataset, row_id) key for both columns
            # instead of filtering the dataset's rows (the planner assumes an empty table until then).
            conn.execute(text("ANALYZE rows"))
    try:
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
    except Exception:
        with sensitive.begin() as conn:
            conn.execute(delete(rows).where(rows.c.dataset == name))
            conn.execute(delete(stored_datasets).where(stored_datasets.c.name == name))
        raise
    return Ingested(name, cast(Kind, kind), population, encoded.dimension, encoded.schema, public)
