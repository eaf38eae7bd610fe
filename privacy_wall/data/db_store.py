"""Row stores over the sensitive database: full passes and uniform minibatches over a dataset's blocks.

Rows are kept in blocks of columns (privacy_wall.data.blocks; row ids 0..N-1): a full pass reads the blocks in
order into arrays allocated once, a minibatch of S distinct ids reads only the blocks they fall in. With
a worker's cache, a dataset whose decoded arrays fit it is read once per version and every later pass or
minibatch is served from memory.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.sparse as sp
from numpy.typing import NDArray
from sqlalchemy import Connection, Integer, Select, any_, bindparam, func, select
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.exc import InterfaceError, OperationalError

from privacy_wall.data import blocks as block_layout
from privacy_wall.data.dataset_cache import DatasetCache, Version, rows_of
from privacy_wall.data.schema import blocks, stored_datasets
from privacy_wall.data.store import Batch, DatasetInfo, Rows, uniform_rows
from privacy_wall.sqlengine import Bind, reading

#: Blocks fetched per statement by a minibatch (their blobs are alive together: at most about 64 MB).
FETCH_BLOCKS = 64
#: Blocks fetched per statement by a full pass (about 8 MB of blobs alive at a time).
PASS_BLOCKS = 8


def shard_blocks(blocks: int, shard: int, shards: int) -> tuple[int, int]:
    """The blocks [start, stop) of shard `shard` of `shards`: consecutive runs of whole blocks, as even as
    the count allows (a shard may be empty when there are fewer blocks than shards)."""
    if not 0 <= shard < shards:
        raise ValueError(f"shard {shard} is not in 0..{shards - 1}")
    return blocks * shard // shards, blocks * (shard + 1) // shards


class UnknownStoredDataset(LookupError):
    """The sensitive database holds no dataset of that name."""


def _stored(bind: Bind, name: str) -> Any:
    with reading(bind) as conn:
        row = conn.execute(select(stored_datasets).where(stored_datasets.c.name == name)).one_or_none()
    if row is None:
        raise UnknownStoredDataset(f"no stored dataset named {name!r}")
    return row


@dataclass(frozen=True)
class BlockIndex:
    """Where a dataset's rows are: the blocks' first rows (ascending), row counts and stored bytes."""

    first_rows: NDArray[np.int64]
    row_counts: NDArray[np.int64]
    stored_bytes: int

    def blocks_of(self, ids: NDArray[np.int64]) -> NDArray[np.int64]:
        """The position of the block each (sorted) id falls in."""
        return np.searchsorted(self.first_rows, ids, side="right").astype(np.int64) - 1


#: A minibatch's blocks on PostgreSQL: their first rows as one array parameter (`= ANY(:firsts)`); built
#: once.
_BLOCK_COLUMNS = (blocks.c.first_row, blocks.c.row_count, blocks.c.features, blocks.c.labels)
_BLOCKS_BY_FIRST_ROW = select(*_BLOCK_COLUMNS).where(
    blocks.c.dataset == bindparam("p_dataset"),
    blocks.c.first_row == any_(bindparam("p_firsts", type_=ARRAY(Integer))),
)


def _blocks_by_first_row(conn: Connection, dataset: str, firsts: list[int]) -> list[Any]:
    if conn.dialect.name == "postgresql":
        return _fetch_blocks(conn, _BLOCKS_BY_FIRST_ROW.params(p_dataset=dataset, p_firsts=firsts))
    return _fetch_blocks(
        conn, select(*_BLOCK_COLUMNS).where(blocks.c.dataset == dataset, blocks.c.first_row.in_(firsts))
    )


def _fetch_blocks(conn: Connection, statement: Select[Any]) -> list[Any]:
    """The rows of a select of blocks. On PostgreSQL through a binary-format cursor: bytea arrives as its
    bytes instead of hex text (a third of the time for a full pass)."""
    if conn.dialect.name != "postgresql":
        return list(conn.execute(statement).all())
    import psycopg  # the PostgreSQL driver: loaded when a PostgreSQL connection exists

    compiled = statement.compile(dialect=conn.dialect)
    driver = conn.connection.driver_connection
    assert driver is not None
    try:
        with driver.cursor(binary=True) as cursor:
            cursor.execute(str(compiled), compiled.params)
            return list(cursor.fetchall())
    except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
        # As SQLAlchemy reports them (the gate withdraws the charge of a release the database could not
        # read); the statement, never its parameters.
        kind = OperationalError if isinstance(exc, psycopg.OperationalError) else InterfaceError
        raise kind(str(compiled), None, exc, hide_parameters=True) from None


@dataclass
class DatabaseStore:
    """A dataset in the sensitive database, of the kind it was ingested as (tabular, regression, bow or
    binary). With a `cache`, a dataset whose decoded arrays fit it is decoded once per version and every
    pass or minibatch of that version is taken from memory (privacy_wall.data.dataset_cache). No read uses a
    row at or past the stored population."""

    bind: Bind
    name: str
    cache: DatasetCache | None = None
    _index: BlockIndex | None = field(default=None, init=False, repr=False)

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
                return self.cache.full(self._version, self._read_all)
            cached = self.cache.get(self._version)
            if cached is None and self._decoded_bytes() <= self.cache.budget_bytes:
                cached = self.cache.full(self._version, self._read_all)
            if cached is not None:
                return rows_of(cached, np.asarray(selected))
        if isinstance(selected, slice):
            return self._read_all()
        return self._read_rows(np.sort(np.asarray(selected, dtype=np.int64)))

    def _decoded_bytes(self) -> int:
        """Bytes of the decoded arrays of the whole dataset (binary rows unpack to float64)."""
        if self._info.kind == "binary":
            return 8 * self._info.population * self._info.dimension
        return self._block_index().stored_bytes

    def _block_index(self) -> BlockIndex:
        """The blocks below the population, checked to tile rows 0..N-1 (read once per store)."""
        if self._index is None:
            with reading(self.bind) as conn:
                found = conn.execute(
                    select(
                        blocks.c.first_row,
                        blocks.c.row_count,
                        func.length(blocks.c.features) + func.coalesce(func.length(blocks.c.labels), 0),
                    )
                    .where(blocks.c.dataset == self.name, blocks.c.first_row < self._info.population)
                    .order_by(blocks.c.first_row)
                ).all()
            firsts = np.array([r[0] for r in found], dtype=np.int64)
            counts = np.array([r[1] for r in found], dtype=np.int64)
            expected = np.concatenate([[0], np.cumsum(counts)[:-1]]) if len(found) else firsts
            if not np.array_equal(firsts, expected) or int(counts.sum()) != self._info.population:
                raise RuntimeError(f"dataset {self.name!r}: the stored blocks do not hold its population")
            self._index = BlockIndex(firsts, counts, int(sum(int(r[2]) for r in found)))
        return self._index

    def _decode(self, row_count: int, features: bytes, labels: bytes | None) -> Batch:
        return block_layout.decode(self._info.kind, self._info.dimension, row_count, features, labels)

    def block_count(self) -> int:
        """How many blocks hold the dataset's rows."""
        return len(self._block_index().first_rows)

    def shard_rows(self, shard: int, shards: int) -> tuple[int, int]:
        """The row ids [first, stop) of shard `shard` of `shards` (`shard_blocks`)."""
        start, stop = shard_blocks(self.block_count(), shard, shards)
        bounds = [*self._block_index().first_rows.tolist(), self._info.population]
        return bounds[start], bounds[stop]

    def fits_cache(self) -> bool:
        """Whether this dataset's decoded arrays fit the cache (then every read of it is from memory)."""
        return self.cache is not None and self._decoded_bytes() <= self.cache.budget_bytes

    def shard(self, shard: int, shards: int) -> Batch:
        """Shard `shard` of `shards`: the rows of its whole blocks (`shard_blocks`), ids rebased to 0. With
        a cache, decoded once per version and shard (its key names the shard)."""
        start, stop = shard_blocks(self.block_count(), shard, shards)
        if self.cache is None:
            return self._read_blocks(start, stop)
        name, population, created = self._version
        key: Version = (f"{name}#shard{shard}/{shards}", population, created)
        return self.cache.full(key, lambda: self._read_blocks(start, stop))

    def _blocks_in_order(self, first: int = 0, last: int | None = None) -> Iterator[tuple[int, Batch]]:
        """The blocks first..last - 1 (default: every block below the population), decoded, in row order:
        PASS_BLOCKS blocks per statement (a range of the primary key), so a few blocks' blobs are alive at
        a time."""
        index = self._block_index()
        bounds = [*index.first_rows.tolist(), self._info.population]
        last = len(index.first_rows) if last is None else last
        with reading(self.bind) as conn:
            for start in range(first, last, PASS_BLOCKS):
                stop = min(start + PASS_BLOCKS, last)
                part = _fetch_blocks(
                    conn,
                    select(*_BLOCK_COLUMNS)
                    .where(
                        blocks.c.dataset == self.name,
                        blocks.c.first_row >= bounds[start],
                        blocks.c.first_row < bounds[stop],
                    )
                    .order_by(blocks.c.first_row),
                )
                found = [(int(row[0]), int(row[1])) for row in part]
                expected = list(zip(bounds[start:stop], index.row_counts[start:stop].tolist(), strict=True))
                if found != expected:
                    raise RuntimeError(f"dataset {self.name!r} changed while it was read")
                for first, count, features, labels in part:
                    yield int(first), self._decode(int(count), features, labels)
                del part

    def _read_all(self) -> Batch:
        """Every row (ids 0..N-1), block by block into arrays allocated once: the peak is the data plus
        one block, whatever N."""
        return self._read_blocks(0, len(self._block_index().first_rows))

    def _read_blocks(self, start: int, stop: int) -> Batch:
        """The rows of blocks start..stop - 1 (ids rebased to 0), block by block into arrays allocated
        once: the peak is those rows plus one block."""
        index = self._block_index()
        bounds = [*index.first_rows.tolist(), self._info.population]
        offset, n = bounds[start], bounds[stop] - bounds[start]
        d, kind = self._info.dimension, self._info.kind
        if kind == "bow":
            parts = [b.counts for _, b in self._blocks_in_order(start, stop) if b.counts is not None]
            counts = sp.csr_array(sp.vstack(parts, format="csr")) if parts else None
            if counts is None or counts.shape[0] != n:
                raise RuntimeError(f"dataset {self.name!r}: the store returned a batch of the wrong size")
            counts.indices = counts.indices.astype(np.int32)
            return Batch.of_documents(counts)
        features = np.empty((n, d), dtype=np.float64)
        labels = None if kind == "binary" else np.empty(n, dtype=np.float64)
        filled = 0
        for first, batch in self._blocks_in_order(start, stop):
            first -= offset
            features[first : first + batch.size] = batch.features
            if labels is not None and batch.labels is not None:
                labels[first : first + batch.size] = batch.labels
            filled += batch.size
        if filled != n:
            raise RuntimeError(f"dataset {self.name!r}: the store returned a batch of the wrong size")
        return Batch(features, labels)

    def _read_rows(self, ids: NDArray[np.int64]) -> Batch:
        """The rows with these sorted distinct ids, in that order, from the blocks they fall in."""
        if ids.size and (ids[0] < 0 or ids[-1] >= self._info.population):
            raise IndexError(f"dataset {self.name!r}: a row id outside 0..N-1")
        index = self._block_index()
        positions = index.blocks_of(ids)  # sorted, as the ids are
        wanted = np.unique(positions)
        # The ids of block wanted[k] are ids[lo[k]:hi[k]].
        lo, hi = np.searchsorted(positions, wanted, "left"), np.searchsorted(positions, wanted, "right")
        span = {int(index.first_rows[p]): (int(a), int(b)) for p, a, b in zip(wanted, lo, hi, strict=True)}
        parts: dict[int, Batch] = {}
        with reading(self.bind) as conn:
            for start in range(0, wanted.size, FETCH_BLOCKS):
                chosen = wanted[start : start + FETCH_BLOCKS]
                firsts = index.first_rows[chosen].tolist()
                for first, count, features, labels in _blocks_by_first_row(conn, self.name, firsts):
                    position = int(np.searchsorted(index.first_rows, first))
                    if int(count) != int(index.row_counts[position]):
                        raise RuntimeError(f"dataset {self.name!r} changed while it was read")
                    block = self._decode(int(count), features, labels)
                    a, b = span[int(first)]
                    local = ids[a:b] - int(first)
                    parts[int(first)] = _rows_at(block, local)
        if len(parts) != wanted.size:
            raise RuntimeError(f"dataset {self.name!r}: the store returned a batch of the wrong size")
        return _concatenate([parts[first] for first in sorted(parts)], self._info.kind)


def _rows_at(block: Batch, local: NDArray[np.int64]) -> Batch:
    """Rows `local` of one decoded block (copies: the block's blobs are released)."""
    if block.counts is not None:
        return Batch.of_documents(sp.csr_array(block.counts[local]))
    labels = None if block.labels is None else block.labels[local].copy()
    return Batch(block.features[local].copy(), labels)


def _concatenate(parts: list[Batch], kind: str) -> Batch:
    """One batch of the parts' rows, in order."""
    if kind == "bow":
        return Batch.of_documents(
            sp.csr_array(sp.vstack([p.counts for p in parts if p.counts is not None], format="csr"))
        )
    labels = None if kind == "binary" else np.concatenate([p.labels for p in parts if p.labels is not None])
    return Batch(np.concatenate([p.features for p in parts]), labels)
