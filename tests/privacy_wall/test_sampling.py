"""Shuffled passes: every row once per pass, distinct rows per batch, and only for non-private fits."""

from __future__ import annotations

import numpy as np
import pytest

from privacy_wall.data.store import InMemoryTabularStore
from privacy_wall.gate import Gate, PrivacyError
from privacy_wall.ledger.base import InMemoryLedger
from privacy_wall.queries.blr import LogisticRegressionQuery
from privacy_wall.sampling import ShuffledPasses


@pytest.mark.parametrize(("population", "size"), [(10, 3), (12, 4), (7, 7), (9, 8), (5, 1)])
def test_every_row_once_per_pass_and_distinct_rows_per_batch(population: int, size: int) -> None:
    rng = np.random.default_rng(0)
    passes = ShuffledPasses()
    # lcm(N, S) / S batches cover lcm(N, S) / N whole passes exactly.
    batches = np.lcm(population, size) // size
    for _ in range(3):  # three such cycles, so passes straddle batches at different offsets
        seen = np.zeros(population, dtype=np.int64)
        for _ in range(batches):
            rows = passes.next_rows(population, size, rng)
            assert rows.shape == (size,) and np.unique(rows).shape == (size,)
            assert rows.min() >= 0 and rows.max() < population
            np.add.at(seen, rows, 1)
        assert np.all(seen == np.lcm(population, size) // population), seen


def test_each_pass_is_a_fresh_permutation() -> None:
    rng = np.random.default_rng(1)
    passes = ShuffledPasses()
    first = np.concatenate([passes.next_rows(20, 5, rng) for _ in range(4)])
    second = np.concatenate([passes.next_rows(20, 5, rng) for _ in range(4)])
    assert sorted(first) == sorted(second) == list(range(20))
    assert not np.array_equal(first, second)


def store(public: bool) -> InMemoryTabularStore:
    rng = np.random.default_rng(2)
    x = rng.normal(size=(30, 3))
    x /= np.maximum(1.0, np.linalg.norm(x, axis=1, keepdims=True))
    return InMemoryTabularStore("d", x, (rng.random(30) < 0.5).astype(np.float64), public=public)


def release(gate: Gate, sigma: float, iteration: int) -> None:
    params = {"second_moment": np.eye(3)}
    gate.release(
        LogisticRegressionQuery(), params, job_id="j", iteration=iteration, sigma=sigma, batch_size=10
    )


def test_the_gate_allows_passes_only_without_noise_on_public_data() -> None:
    with pytest.raises(PrivacyError, match="private"):
        Gate(store(public=False), InMemoryLedger(delta=1e-5), passes=True)
    ledger = InMemoryLedger(delta=1e-5)
    gate = Gate(store(public=True), ledger, passes=True)
    with pytest.raises(PrivacyError, match="sigma = 0"):
        release(gate, 1.0, 1)
    assert ledger.charges() == []  # refused before anything was charged or read
    for t in range(1, 4):  # three batches of 10 = one pass over the 30 rows
        release(gate, 0.0, t)


def test_passes_at_sigma_zero_release_the_exact_batch_means_of_one_pass() -> None:
    data = store(public=True)
    gate = Gate(data, InMemoryLedger(delta=1e-5), seed=5, passes=True)
    query = LogisticRegressionQuery()
    params = {"second_moment": np.eye(3)}
    total = np.zeros(3)
    for t in range(1, 4):
        out = gate.release(query, params, job_id="j", iteration=t, sigma=0.0, batch_size=10)
        total += 10 * out.statistics["s1"]
    # One pass uses every row once: the batch sums add up to the whole dataset's sum of (y - 1/2) x.
    expected = ((data.labels - 0.5)[:, None] * data.features).sum(axis=0)
    np.testing.assert_allclose(total, expected, rtol=1e-12, atol=1e-12)
