"""The sensitive database's layout of a dataset: its rows in blocks of columns (issue 22).

A dataset of N rows is a sequence of blocks; a block holds rows first_row .. first_row + row_count - 1,
and the blocks tile 0..N-1 in order. A full pass is a few large reads; a minibatch reads the blocks its
sampled ids fall in. Each block is two little-endian blobs, by kind:

- tabular, regression: `features` float64 (row_count x d, row-major), `labels` float64 (row_count)
- binary: `features` uint8 (row_count x ceil(d / 8)), each row `np.packbits` of its 0/1 values
- bow: `features` int64 indptr (row_count + 1, from 0), then int32 word ids, then int32 counts (CSR)

Blocks are written whole by ingest (`split`) and never updated; an append adds blocks after the last.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from privacy_wall.data.store import Batch

#: About this many bytes of encoded rows per block: large reads for full passes, few wasted bytes when
#: a minibatch needs one row of a block.
BLOCK_BYTES = 1 << 20
#: Bounds on rows per block, whatever the row width.
MIN_BLOCK_ROWS, MAX_BLOCK_ROWS = 64, 1 << 16
#: Documents per bag-of-words block (their length is not public before reading them).
BOW_BLOCK_ROWS = 4096


def row_bytes(kind: str, dimension: int) -> int:
    """Encoded bytes of one dense row (features and label); bag-of-words rows vary."""
    if kind == "binary":
        return (dimension + 7) // 8
    return 8 * dimension + 8


def block_rows(kind: str, dimension: int) -> int:
    """Rows per block: a power of two near BLOCK_BYTES of rows, within the bounds."""
    if kind == "bow":
        return BOW_BLOCK_ROWS
    rows = max(1, BLOCK_BYTES // row_bytes(kind, dimension))
    return int(min(MAX_BLOCK_ROWS, max(MIN_BLOCK_ROWS, 1 << (rows.bit_length() - 1))))


def encode(kind: str, batch: Batch) -> tuple[bytes, bytes | None]:
    """One block's blobs (features, labels) from its rows."""
    if kind == "bow":
        assert batch.counts is not None
        counts = sp.csr_array(batch.counts)
        return (
            np.asarray(counts.indptr, dtype="<i8").tobytes()
            + np.asarray(counts.indices, dtype="<i4").tobytes()
            + np.asarray(counts.data, dtype="<i4").tobytes(),
            None,
        )
    if kind == "binary":
        return np.packbits(np.asarray(batch.features, dtype=np.uint8), axis=1).tobytes(), None
    assert batch.labels is not None
    features = np.ascontiguousarray(batch.features, dtype="<f8").tobytes()
    return features, np.ascontiguousarray(batch.labels, dtype="<f8").tobytes()


def decode(kind: str, dimension: int, rows: int, features: bytes, labels: bytes | None) -> Batch:
    """A block's rows from its blobs (arrays over the blobs where the layout allows: read-only)."""
    if kind == "bow":
        indptr = np.frombuffer(features, dtype="<i8", count=rows + 1)
        entries = int(indptr[-1])
        if indptr[0] != 0 or len(features) != 8 * (rows + 1) + 8 * entries or np.any(np.diff(indptr) < 0):
            raise ValueError("a stored block of documents is not a CSR layout")
        ids = np.frombuffer(features, dtype="<i4", count=entries, offset=8 * (rows + 1))
        counts = np.frombuffer(features, dtype="<i4", count=entries, offset=8 * (rows + 1) + 4 * entries)
        if entries and (ids.min() < 0 or ids.max() >= dimension):
            raise ValueError("a stored document has a word id outside the vocabulary")
        return Batch.of_documents(
            sp.csr_array(
                (counts.astype(np.int32), ids.astype(np.int32), indptr.copy()), shape=(rows, dimension)
            )
        )
    if kind == "binary":
        packed = np.frombuffer(features, dtype=np.uint8).reshape(rows, (dimension + 7) // 8)
        return Batch(np.unpackbits(packed, axis=1, count=dimension).astype(np.float64))
    if labels is None or len(features) != 8 * rows * dimension or len(labels) != 8 * rows:
        raise ValueError("a stored block of rows does not have its declared shape")
    return Batch(
        np.frombuffer(features, dtype="<f8").reshape(rows, dimension), np.frombuffer(labels, dtype="<f8")
    )


def split(batch: Batch, rows_per_block: int) -> list[Batch]:
    """Consecutive parts of at most `rows_per_block` rows (views)."""
    return [
        batch.rows(start, min(start + rows_per_block, batch.size))
        for start in range(0, batch.size, rows_per_block)
    ]
