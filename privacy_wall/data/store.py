"""Where sensitive rows live, and the one way the gate reads them: a uniform minibatch of S distinct rows.

A store holds one dataset: a dense feature matrix with its labels (tabular), sparse word counts (bag of
words) or binary rows. Only the gate calls `sample`. The in-memory store serves the in-process estimator
and `vips fit --local`; the database store comes with the service.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Protocol

import numpy as np
import scipy.sparse as sp
from numpy.typing import NDArray


class BoundViolation(ValueError):
    """Rows break a bound that a declared sensitivity assumes. Never carries data values."""


@dataclass(frozen=True)
class Batch:
    """A minibatch of rows as one query sees it: features (S x d) and, for supervised data, labels (S,).

    A bag-of-words batch carries its documents as `counts` (S x V sparse word counts, one row per
    document) and an empty (S x 0) `features`; build it with `Batch.of_documents`.
    """

    features: NDArray[np.float64]
    labels: NDArray[np.float64] | None = None
    counts: sp.csr_array | None = None

    @property
    def size(self) -> int:
        if self.counts is not None:
            return int(self.counts.shape[0])
        return int(self.features.shape[0])

    def rows(self, start: int, stop: int) -> Batch:
        """Rows start..stop-1 of the batch (views of its arrays)."""
        labels = None if self.labels is None else self.labels[start:stop]
        counts = None if self.counts is None else self.counts[start:stop]
        return Batch(self.features[start:stop], labels, counts)

    @classmethod
    def of_documents(cls, counts: sp.csr_array) -> Batch:
        """A bag-of-words batch: document d's word counts are row d of `counts` (S x V)."""
        return cls(np.zeros((counts.shape[0], 0)), counts=counts)


@dataclass(frozen=True)
class DatasetInfo:
    """Public metadata about a stored dataset: what a job may know without touching rows."""

    name: str
    kind: str
    population: int
    dimension: int
    public: bool = False


#: Which rows a batch holds: distinct row indices, or every row (slice(None)).
Rows = NDArray[np.int64] | slice


class RowStore(Protocol):
    """A dataset's sensitive rows, read as minibatches that the gate chooses by row index."""

    @property
    def info(self) -> DatasetInfo: ...

    def sample(self, size: int, rng: np.random.Generator) -> Batch:
        """Exactly `size` distinct rows drawn uniformly without replacement: `take(uniform_rows(...))`."""
        ...

    def take(self, rows: Rows) -> Batch:
        """The rows with these distinct indices (0..N-1), in any order."""
        ...


@dataclass
class InMemoryTabularStore:
    """Tabular rows held in memory, checked against the sensitivity bounds on construction: kind "tabular"
    (labels in {0, 1}) or "regression" (real labels with |y| <= 1)."""

    name: str
    features: NDArray[np.float64]
    labels: NDArray[np.float64]
    public: bool = False
    kind: Literal["tabular", "regression"] = "tabular"
    _info: DatasetInfo = field(init=False)

    def __post_init__(self) -> None:
        features = np.ascontiguousarray(self.features, dtype=np.float64)
        labels = np.ascontiguousarray(self.labels, dtype=np.float64).reshape(-1)
        if features.ndim != 2 or features.shape[0] == 0:
            raise BoundViolation("features must be a non-empty 2-D array")
        if labels.shape[0] != features.shape[0]:
            raise BoundViolation("features and labels have different numbers of rows")
        if self.kind == "regression":
            check_regression_bounds(features, labels)
        else:
            check_tabular_bounds(features, labels)
        self.features, self.labels = features, labels
        self._info = DatasetInfo(
            self.name, self.kind, int(features.shape[0]), int(features.shape[1]), self.public
        )

    @property
    def info(self) -> DatasetInfo:
        return self._info

    def sample(self, size: int, rng: np.random.Generator) -> Batch:
        return self.take(uniform_rows(self._info.population, size, rng))

    def take(self, rows: Rows) -> Batch:
        return Batch(self.features[rows], self.labels[rows])


@dataclass
class InMemoryBinaryStore:
    """Binary rows (0/1 values, no labels: the sigmoid belief network's images) held in memory."""

    name: str
    features: NDArray[np.float64]
    public: bool = False
    _info: DatasetInfo = field(init=False)

    def __post_init__(self) -> None:
        features = np.ascontiguousarray(self.features, dtype=np.float64)
        if features.ndim != 2 or features.shape[0] == 0:
            raise BoundViolation("binary rows must be a non-empty 2-D array")
        check_binary_bounds(features)
        self.features = features
        self._info = DatasetInfo(
            self.name, "binary", int(features.shape[0]), int(features.shape[1]), self.public
        )

    @property
    def info(self) -> DatasetInfo:
        return self._info

    def sample(self, size: int, rng: np.random.Generator) -> Batch:
        return self.take(uniform_rows(self._info.population, size, rng))

    def take(self, rows: Rows) -> Batch:
        return Batch(self.features[rows])


@dataclass
class InMemoryBowStore:
    """Bag-of-words documents held in memory: row d of `counts` (D x V, sparse) is document d's word counts.

    Counts must be whole numbers >= 0 (the ingestion bound); empty documents are kept, so D is as declared.
    Stored as CSR with int32 counts (what ingestion writes) to keep large corpora small.
    """

    name: str
    counts: sp.csr_array
    public: bool = False
    _info: DatasetInfo = field(init=False)

    def __post_init__(self) -> None:
        counts = sp.csr_array(self.counts)
        if counts.ndim != 2 or counts.shape[0] == 0 or counts.shape[1] == 0:
            raise BoundViolation("documents must be a non-empty 2-D sparse matrix (documents x vocabulary)")
        counts.sum_duplicates()
        check_bow_bounds(counts)
        counts.eliminate_zeros()
        self.counts = counts.astype(np.int32, copy=False)  # int32 already (ingestion's, generators'): shared
        self._info = DatasetInfo(self.name, "bow", int(counts.shape[0]), int(counts.shape[1]), self.public)

    @property
    def info(self) -> DatasetInfo:
        return self._info

    def sample(self, size: int, rng: np.random.Generator) -> Batch:
        return self.take(uniform_rows(self._info.population, size, rng))

    def take(self, rows: Rows) -> Batch:
        counts = self.counts if isinstance(rows, slice) else self.counts[rows]
        return Batch.of_documents(sp.csr_array(counts))


def uniform_rows(population: int, size: int, rng: np.random.Generator) -> Rows:
    """Row indices of a uniform batch of `size` distinct rows (a whole-population slice when size = N)."""
    if not 0 < size <= population:
        raise ValueError(f"batch size must be between 1 and the population {population}")
    if size == population:  # the whole dataset: order is irrelevant to sums, skip the copy
        return slice(None)
    return np.asarray(rng.choice(population, size=size, replace=False), dtype=np.int64)


ROW_NORM_TOLERANCE = 1e-9


def check_binary_bounds(features: NDArray[np.float64]) -> None:
    """Every value is 0 or 1. Raises BoundViolation naming the first offending row index, never its values."""
    bad = ((features != 0) & (features != 1)).any(axis=1)
    if bad.any():
        raise BoundViolation(f"row {int(np.argmax(bad))} has a value other than 0 or 1")


def _check_rows(features: NDArray[np.float64], labels: NDArray[np.float64]) -> None:
    finite = np.isfinite(features).all(axis=1) & np.isfinite(labels)
    if not finite.all():
        raise BoundViolation(f"row {int(np.argmin(finite))} has a non-finite value")
    norms = np.linalg.norm(features, axis=1)
    too_long = norms > 1.0 + ROW_NORM_TOLERANCE
    if too_long.any():
        raise BoundViolation(
            f"row {int(np.argmax(too_long))} has L2 norm above 1 "
            f"({int(too_long.sum())} rows in all); scale rows to norm <= 1"
        )


def check_tabular_bounds(features: NDArray[np.float64], labels: NDArray[np.float64]) -> None:
    """Rows have L2 norm <= 1 and labels are in {0, 1}; finite values only.

    Raises BoundViolation naming the first offending row index, never its values.
    """
    _check_rows(features, labels)
    bad_label = (labels != 0) & (labels != 1)
    if bad_label.any():
        raise BoundViolation(f"row {int(np.argmax(bad_label))} has a label outside {{0, 1}}")


def check_regression_bounds(features: NDArray[np.float64], labels: NDArray[np.float64]) -> None:
    """Rows have L2 norm <= 1 and targets |y| <= 1 (regression); finite values only.

    Raises BoundViolation naming the first offending row index, never its values.
    """
    _check_rows(features, labels)
    too_large = np.abs(labels) > 1.0
    if too_large.any():
        raise BoundViolation(
            f"row {int(np.argmax(too_large))} has a target with |y| > 1 ({int(too_large.sum())} rows in "
            "all); scale targets to [-1, 1] with public bounds"
        )


#: Largest count a bag-of-words entry may have (ingestion stores counts as int32).
MAX_COUNT = 2**31 - 1


def check_bow_bounds(counts: sp.csr_array) -> None:
    """Every count is a finite whole number in [0, MAX_COUNT].

    Raises BoundViolation naming the first offending document (row) index, never its values.
    """
    data = np.asarray(counts.data)
    if np.issubdtype(data.dtype, np.integer):  # whole and finite already: no float64 copy of a large corpus
        bad = (data < 0) | (data > MAX_COUNT)
    else:
        bad = ~np.isfinite(data) | (data < 0) | (data > MAX_COUNT) | (np.floor(data) != data)
    if bad.any():
        entry = int(np.argmax(bad))
        row = int(np.searchsorted(np.asarray(counts.indptr), entry, side="right")) - 1
        raise BoundViolation(f"document {row} has a count that is not a whole number in [0, 2^31 - 1]")
