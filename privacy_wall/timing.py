"""Release times that carry no data: every release is held to a slot computed from public facts.

The timing model (docs/design.md section 2, "Release times"). What an analyst can see of a release's time
(its charge's and its store's timestamps, the job's progress and convergence, the next charge's) is
measured from the end of its charge's commit to the moment the gate hands the release back. The gate holds
that interval to k slots: it returns at commit + k x slot with k = ceil(computed / slot) >= 1, sleeping out
the rest (the CPU is free meanwhile). The slot is fixed before the job's first charge, from public facts
only:

    slot = MARGIN x (t_stand_in x S / s + t_rows) + FLOOR_SECONDS

where t_stand_in is the shortest of CALIBRATION_REPEATS timed runs of the very release code (sampling,
the query's clipped sums, the noise and post-processing) on a public stand-in store of s <= S records whose
work bounds any batch of theirs (`stand_in_store`: rows at the norm bound; documents holding every word of
the vocabulary, so an LDA document's resampling, its unigram counts and its E-step width are at their
maximum), and t_rows the time of drawing S of the population's N row indices. The release's work grows at
most linearly in its records, so S / s extrapolates it (the per-call overheads too: a longer slot, never a
shorter one).

So when the release's own work fits its slot (k = 1, the case the margin is for), everything the analyst
sees of its time is a function of public facts (S, N, d or V, the model's options, sigma) and of the
machine's load, which the analyst's data neighbour cannot move. A release that overruns (the machine
slowed by more than MARGIN since the calibration, or the dataset's first load from the database, which is
read with the first release) is shown at the next multiple of its slot: what is visible is then the count
k, a quantisation at the slot's grain, not a bound proven for every load. Two neighbouring corpora (one
document of 1 word against one of 500 distinct words: the attack of issue 52) give the same k and the same
visible times (tests/privacy_wall/test_timing.py; bench/release_timing.py measures the unpadded difference).

Public datasets are not padded (their times hide nothing), nor is an in-process fit, whose times only the
data's holder sees (Gate's `padded`). The time between a job's start and its first charge holds public
work only (the model's set-up, the public rehearsal, this calibration): the dataset is read within the
first release.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import numpy as np
import scipy.sparse as sp

from privacy_wall.data.store import (
    DatasetInfo,
    InMemoryBinaryStore,
    InMemoryBowStore,
    InMemoryTabularStore,
    RowStore,
    uniform_rows,
)

#: The slot's allowance over the calibrated work: the machine's load may vary by this factor between the
#: calibration and a release before the release shows a second slot.
MARGIN = 1.25
#: Seconds added to every slot: a release's fixed costs (a thread's wake-up, the garbage collector) that a
#: calibration of a few milliseconds under-measures.
FLOOR_SECONDS = 0.002
#: Stored entries (records x width) of the stand-in: about 16 MB, whatever S is (the rest is extrapolated).
CALIBRATION_ENTRIES = 1 << 20
#: Timed runs of the stand-in release; the shortest is kept (the others measured the load, not the work).
CALIBRATION_REPEATS = 3

#: The release code timed on a stand-in: run(store, records) releases a batch of `records` of `store`.
StandInRelease = Callable[[RowStore, int], object]


def stand_in_records(info: DatasetInfo, batch_size: int) -> int:
    """The stand-in's number of records: the batch's, or fewer so that it holds CALIBRATION_ENTRIES."""
    return max(1, min(batch_size, CALIBRATION_ENTRIES // max(1, info.dimension)))


def stand_in_store(info: DatasetInfo, records: int) -> RowStore:
    """A public store of `records` rows of the dataset's kind and dimension whose release work bounds any
    batch's of that size: tabular and regression rows of norm 1 (labels 0/1, resp. in [-1, 1]), binary rows
    of independent fair bits, documents holding each of the V words once (the widest a document can be)."""
    generator = np.random.default_rng(0)  # public: nothing computed from it is released
    name = f"{info.name}-timing-stand-in"
    if info.kind == "bow":
        vocabulary = info.dimension
        indices = np.tile(np.arange(vocabulary, dtype=np.int32), records)
        indptr = np.arange(records + 1, dtype=np.int64) * vocabulary
        ones = np.ones(records * vocabulary, dtype=np.int32)
        counts = sp.csr_array((ones, indices, indptr), shape=(records, vocabulary))
        return InMemoryBowStore(name, counts, public=True)
    if info.kind == "binary":
        bits = generator.integers(0, 2, size=(records, info.dimension)).astype(np.float64)
        return InMemoryBinaryStore(name, bits, public=True)
    features = generator.uniform(-1.0, 1.0, (records, info.dimension))  # no float normal sampler in the wall
    features /= np.maximum(np.linalg.norm(features, axis=1, keepdims=True), 1e-300)
    if info.kind == "regression":
        targets = generator.uniform(-1.0, 1.0, records)
        return InMemoryTabularStore(name, features, targets, public=True, kind="regression")
    if info.kind != "tabular":
        raise ValueError(f"no timing stand-in for datasets of kind {info.kind!r}")
    labels = generator.integers(0, 2, records).astype(np.float64)
    return InMemoryTabularStore(name, features, labels, public=True)


def release_slot(info: DatasetInfo, batch_size: int, release: StandInRelease) -> float:
    """The slot of the dataset's releases of `batch_size` records (module docstring), from timed runs of
    `release` on the public stand-in and of drawing the batch's row indices. Reads no sensitive value."""
    records = stand_in_records(info, batch_size)
    store = stand_in_store(info, records)
    timings = []
    for _ in range(CALIBRATION_REPEATS):
        started = time.perf_counter()
        release(store, records)
        timings.append(time.perf_counter() - started)
    started = time.perf_counter()
    uniform_rows(info.population, batch_size, np.random.default_rng(0))
    rows = time.perf_counter() - started
    return MARGIN * (min(timings) * batch_size / records + rows) + FLOOR_SECONDS


def hold(started: float, slot: float) -> int:
    """Sleep until `started` (a time.perf_counter() reading) + k slots, the first such instant not yet
    past; return k (>= 1)."""
    if not slot > 0:
        raise ValueError("a slot must be a positive number of seconds")
    elapsed = time.perf_counter() - started
    slots = max(1, math.ceil(elapsed / slot))
    remaining = started + slots * slot - time.perf_counter()
    if remaining > 0:
        time.sleep(remaining)
    return slots
