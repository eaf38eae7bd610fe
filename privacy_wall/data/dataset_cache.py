"""Decoded datasets kept in a worker's memory between iterations and jobs, inside the wall (issue 22).

A full pass decodes every row once per dataset version, not once per iteration: the first full read of a
version stores its decoded batch (features and labels, a CSR matrix of counts, or 0/1 rows; read-only) in
an LRU bounded by the bytes of its arrays (VIPS_WORKER_CACHE_MB, passed in by the worker). Later full
passes get that batch; minibatches of a cached version are rows of it. The key is the dataset's version
(name, population, creation time): an append or a re-ingest is a new version, and caching one drops the
name's older ones. Nothing here leaves the worker process (no file, no shared memory, no other process).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from datetime import datetime

import numpy as np
import scipy.sparse as sp

from privacy_wall.data.store import Batch

#: A dataset version: its name, population and creation time in the sensitive store.
Version = tuple[str, int, datetime]


def batch_bytes(batch: Batch) -> int:
    """Bytes of a batch's arrays."""
    size = batch.features.nbytes + (0 if batch.labels is None else batch.labels.nbytes)
    if batch.counts is not None:
        counts = batch.counts
        size += counts.data.nbytes + counts.indices.nbytes + counts.indptr.nbytes
    return int(size)


def _read_only(batch: Batch) -> Batch:
    """The same arrays, no longer writable: a query that wrote into a cached batch would corrupt every
    later release of that version (numpy raises instead)."""
    arrays: list[np.ndarray | None] = [batch.features, batch.labels]
    if batch.counts is not None:
        arrays += [batch.counts.data, batch.counts.indices, batch.counts.indptr]
    for array in arrays:
        if array is not None:
            array.flags.writeable = False
    return batch


class DatasetCache:
    """Decoded full batches by dataset version, at most `budget_bytes` of arrays in all (LRU)."""

    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = budget_bytes
        self._entries: OrderedDict[Version, Batch] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, version: Version) -> Batch | None:
        with self._lock:
            batch = self._entries.get(version)
            if batch is not None:
                self._entries.move_to_end(version)
            return batch

    def full(self, version: Version, load: Callable[[], Batch]) -> Batch:
        """The version's full batch: cached, or loaded now and kept if it fits the budget (then the name's
        older versions are dropped)."""
        cached = self.get(version)
        if cached is not None:
            return cached
        batch = load()
        size = batch_bytes(batch)
        if size > self.budget_bytes:
            return batch
        batch = _read_only(batch)
        with self._lock:
            for key in [key for key in self._entries if key[0] == version[0] and key != version]:
                self._drop(key)
            if version not in self._entries:
                self._entries[version] = batch
                self._bytes += size
            while self._bytes > self.budget_bytes:
                self._drop(next(iter(self._entries)))
        return batch

    def _drop(self, version: Version) -> None:
        self._bytes -= batch_bytes(self._entries.pop(version))

    def __len__(self) -> int:
        return len(self._entries)


def rows_of(batch: Batch, ids: np.ndarray) -> Batch:
    """The rows `ids` of a full batch (copies)."""
    if batch.counts is not None:
        return Batch.of_documents(sp.csr_array(batch.counts[ids]))
    labels = None if batch.labels is None else batch.labels[ids]
    return Batch(batch.features[ids], labels)
