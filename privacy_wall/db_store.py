"""Row stores over the sensitive database: a uniform minibatch of exactly S distinct rows, drawn by id.

Row ids are 0..N-1 per dataset, so the gate's generator picks S distinct ids and the database returns
exactly those rows through the primary key, without scanning the table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp
from numpy.typing import NDArray
from sqlalchemy import Connection, CursorResult, Integer, any_, bindparam, select
from sqlalchemy.dialects.postgresql import ARRAY

from privacy_wall.dataset_cache import DatasetCache, Version, rows_of
from privacy_wall.sensitive_schema import rows, stored_datasets
from privacy_wall.sqlengine import Bind, reading
from privacy_wall.store import Batch, DatasetInfo, Rows, uniform_rows

#: Ids per IN (...) list: below SQLite's and PostgreSQL's bound-parameter limits.
ID_CHUNK = 10_000
#: Rows decoded at once by a full pass (their Python objects are alive together).
PART_ROWS = 1 << 15


class UnknownStoredDataset(LookupError):
    """The sensitive database holds no dataset of that name."""


def _stored(bind: Bind, name: str) -> Any:
    with reading(bind) as conn:
        row = conn.execute(select(stored_datasets).where(stored_datasets.c.name == name)).one_or_none()
    if row is None:
        raise UnknownStoredDataset(f"no stored dataset named {name!r}")
    return row


def load_info(bind: Bind, name: str) -> DatasetInfo:
    row = _stored(bind, name)
    return DatasetInfo(row.name, row.kind, row.population, row.dimension, row.public)


def decode_tabular(payloads: list[bytes], dimension: int) -> NDArray[np.float64]:
    """float64 feature rows from their little-endian encodings, as one (S, d) array."""
    return np.frombuffer(b"".join(payloads), dtype="<f8").reshape(len(payloads), dimension).astype(np.float64)


def decode_bow(payloads: list[bytes], dimension: int) -> sp.csr_array:
    """Documents from their encodings (ingest.py: m int32 word ids, then their m int32 counts), as one
    (S, V) CSR matrix of int32 counts; an empty payload is an empty document."""
    lengths = np.fromiter((len(p) for p in payloads), dtype=np.int64, count=len(payloads))
    if np.any(lengths % 8):
        raise ValueError("a stored document is not a whole number of (word id, count) pairs")
    entries = lengths // 8
    indptr = np.zeros(len(payloads) + 1, dtype=np.int64)
    np.cumsum(entries, out=indptr[1:])
    flat = np.frombuffer(b"".join(payloads), dtype="<i4")
    # Document d's ids start at 2 indptr[d] in `flat`, its counts m_d = entries[d] further on.
    starts = np.repeat(2 * indptr[:-1], entries)
    within = np.arange(int(indptr[-1]), dtype=np.int64) - np.repeat(indptr[:-1], entries)
    ids = flat[starts + within]
    counts = flat[starts + within + np.repeat(entries, entries)]
    if ids.size and (ids.min() < 0 or ids.max() >= dimension):
        raise ValueError("a stored document has a word id outside the vocabulary")
    return sp.csr_array(
        (counts.astype(np.int32), ids.astype(np.int32), indptr), shape=(len(payloads), dimension)
    )


def decode_binary(payloads: list[bytes], dimension: int) -> NDArray[np.float64]:
    """0/1 rows from their bit-packed encodings (np.packbits per row), as one (S, d) float array."""
    packed = np.frombuffer(b"".join(payloads), dtype=np.uint8).reshape(len(payloads), -1)
    return np.unpackbits(packed, axis=1, count=dimension).astype(np.float64)


#: A minibatch's rows on PostgreSQL: the ids as one array parameter (`= ANY(:ids)`), which plans and binds
#: in a fraction of the time of a list of S parameters; built once.
_ROWS_BY_ID_ARRAY = select(rows.c.payload, rows.c.label).where(
    rows.c.dataset == bindparam("p_dataset"),
    rows.c.row_id == any_(bindparam("p_ids", type_=ARRAY(Integer))),
)


def _rows_by_id(conn: Connection, dataset: str, ids: list[int]) -> CursorResult[Any]:
    if conn.dialect.name == "postgresql":
        return conn.execute(_ROWS_BY_ID_ARRAY, {"p_dataset": dataset, "p_ids": ids})
    return conn.execute(
        select(rows.c.payload, rows.c.label).where(rows.c.dataset == dataset, rows.c.row_id.in_(ids))
    )


@dataclass
class DatabaseStore:
    """A dataset in the sensitive database, of the kind it was ingested as (tabular, regression, bow or
    binary). With a `cache`, full passes decode the rows once per dataset version and minibatches of a
    cached version are taken from memory (privacy_wall.dataset_cache)."""

    bind: Bind
    name: str
    cache: DatasetCache | None = None

    def __post_init__(self) -> None:
        row = _stored(self.bind, self.name)
        self._info = DatasetInfo(row.name, row.kind, row.population, row.dimension, row.public)
        self._version: Version = (row.name, int(row.population), row.created_at)
        if self._info.kind not in ("tabular", "regression", "bow", "binary"):
            raise ValueError(f"dataset {self.name!r} is {self._info.kind}: no database store reads it yet")

    @property
    def info(self) -> DatasetInfo:
        return self._info

    def sample(self, size: int, rng: np.random.Generator) -> Batch:
        return self.take(uniform_rows(self._info.population, size, rng))

    def take(self, selected: Rows) -> Batch:
        if self.cache is not None:
            if isinstance(selected, slice):
                return self.cache.full(self._version, lambda: self._read(selected))
            cached = self.cache.get(self._version)
            if cached is not None:
                return rows_of(cached, np.asarray(selected))
        return self._read(selected)

    def _read(self, selected: Rows) -> Batch:
        if isinstance(selected, slice) and self._info.kind != "bow":
            return self._read_all()
        payloads, labels = self._fetch(selected)
        if self._info.kind == "binary":
            return Batch(decode_binary(payloads, self._info.dimension))
        if self._info.kind == "bow":
            return Batch.of_documents(decode_bow(payloads, self._info.dimension))
        features = decode_tabular(payloads, self._info.dimension)
        return Batch(features, np.asarray(labels, dtype=np.float64))

    def _read_all(self) -> Batch:
        """Every row (ids 0..N-1), decoded PART_ROWS at a time into arrays allocated once: the peak is
        the data plus one part's Python objects, whatever N."""
        n, d = self._info.population, self._info.dimension
        features = np.empty((n, d), dtype=np.float64)
        labels = np.empty(n, dtype=np.float64)
        filled = 0
        with reading(self.bind) as conn:
            for start in range(0, n, PART_ROWS):  # one range of the primary key per part
                stop = min(n, start + PART_ROWS)
                part = conn.execute(
                    select(rows.c.payload, rows.c.label).where(
                        rows.c.dataset == self.name, rows.c.row_id >= start, rows.c.row_id < stop
                    )
                ).all()
                if len(part) != stop - start:
                    break
                payloads = [payload for payload, _ in part]
                if self._info.kind == "binary":
                    features[start:stop] = decode_binary(payloads, d)
                else:
                    features[start:stop] = np.frombuffer(b"".join(payloads), dtype="<f8").reshape(-1, d)
                    labels[start:stop] = [label for _, label in part]
                filled = stop
        if filled != n:
            raise RuntimeError(f"dataset {self.name!r}: the store returned a batch of the wrong size")
        return Batch(features) if self._info.kind == "binary" else Batch(features, labels)

    def _fetch(self, selected: Rows) -> tuple[list[bytes], list[float]]:
        """The payloads and labels of the selected rows, looked up by id (the primary key)."""
        n = self._info.population
        query = select(rows.c.payload, rows.c.label).where(rows.c.dataset == self.name, rows.c.row_id < n)
        payloads: list[bytes] = []
        labels: list[float] = []
        with reading(self.bind) as conn:
            if isinstance(selected, slice):
                size = self._info.population
                chunks = [conn.execute(query)]
            else:
                ids = np.sort(selected).tolist()
                size = len(ids)
                chunks = [
                    _rows_by_id(conn, self.name, ids[start : start + ID_CHUNK])
                    for start in range(0, size, ID_CHUNK)
                ]
            for result in chunks:
                for payload, label in result:
                    payloads.append(payload)
                    labels.append(label)
        if len(payloads) != size:
            raise RuntimeError(f"dataset {self.name!r}: the store returned a batch of the wrong size")
        return payloads, labels
