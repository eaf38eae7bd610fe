"""The gate's write-ahead charging, the in-memory ledger's arithmetic and atomicity, and the store's sampling
and bound checks."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np
import pytest
import scipy.sparse as sp
from randomgen import AESCounter
from scipy import stats

from privacy_wall.accounting.accountants import PrivacyCost, privacy_cost
from privacy_wall.accounting.calibration import epsilon
from privacy_wall.accounting.events import SelfComposedEvent, SubsampledGaussianEvent
from privacy_wall.data.store import Batch, BoundViolation, DatasetInfo, InMemoryTabularStore, Rows
from privacy_wall.gate import Gate
from privacy_wall.ledger.base import BudgetExceeded, Charge, DuplicateCharge, InMemoryLedger
from privacy_wall.noise.csprng import private_generator
from privacy_wall.queries.base import Array, Block
from privacy_wall.queries.blr import LogisticRegressionQuery

DELTA = 1e-5
D = 3


def rows(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, D))
    x /= np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1.0)
    return x, (rng.random(n) < 0.5).astype(np.float64)


PARAMS = {"second_moment": np.eye(D)}


@dataclass
class Log:
    events: list[str] = field(default_factory=list)


class SpyQuery:
    """LogisticRegressionQuery that logs when it touches data, and what the ledger held at that moment."""

    name = "blr"

    def __init__(self, log: Log, ledger: InMemoryLedger | None = None) -> None:
        self._inner = LogisticRegressionQuery()
        self._log = log
        self._ledger = ledger
        self.charged_when_computing: list[set[tuple[str, int]]] = []

    def blocks(self, dimension: int) -> tuple[Block, ...]:
        return self._inner.blocks(dimension)

    def validate_params(self, params: dict[str, Array], dimension: int) -> None:
        self._inner.validate_params(params, dimension)

    def clipped_sums(
        self, batch: Batch, params: dict[str, Array], rng: np.random.Generator
    ) -> dict[str, Array]:
        self._log.events.append("clipped_sums")
        if self._ledger is not None:
            self.charged_when_computing.append({(c.job_id, c.iteration) for c in self._ledger.charges()})
        return self._inner.clipped_sums(batch, params, rng)

    def postprocess(self, noised_means: dict[str, Array], dimension: int) -> dict[str, Array]:
        self._log.events.append("postprocess")
        return self._inner.postprocess(noised_means, dimension)


class SpyStore:
    def __init__(self, inner: InMemoryTabularStore, log: Log) -> None:
        self._inner = inner
        self._log = log

    @property
    def info(self) -> DatasetInfo:
        return self._inner.info

    def sample(self, size: int, rng: np.random.Generator) -> Batch:
        self._log.events.append("sample")
        return self._inner.sample(size, rng)

    def take(self, rows: Rows) -> Batch:
        self._log.events.append("take")
        return self._inner.take(rows)


class SpyLedger:
    def __init__(self, inner: InMemoryLedger, log: Log, *, fail: BaseException | None = None) -> None:
        self.inner = inner
        self._log = log
        self._fail = fail

    def commit(self, charge: Charge) -> None:
        self._log.events.append("commit")
        if self._fail is not None:
            raise self._fail
        self.inner.commit(charge)

    def withdraw(self, charge: Charge) -> None:
        self._log.events.append("withdraw")
        self.inner.withdraw(charge)


def spy_setup(
    n: int = 200, *, budget: float | None = None, fail: BaseException | None = None
) -> tuple[Gate, SpyQuery, InMemoryLedger, Log]:
    log = Log()
    x, y = rows(n)
    ledger = InMemoryLedger(delta=DELTA, epsilon_budget=budget)
    store = SpyStore(InMemoryTabularStore("private", x, y), log)
    # Unpadded: the slot's calibration runs the spied query on a public stand-in before the charge
    # (tests/privacy_wall/test_timing.py); these tests follow the query on the data.
    gate = Gate(store, SpyLedger(ledger, log, fail=fail), padded=False)
    return gate, SpyQuery(log, ledger), ledger, log


def release(gate: Gate, query: SpyQuery, t: int = 1, *, sigma: float = 1.0, batch_size: int = 50) -> None:
    gate.release(query, PARAMS, job_id="job", iteration=t, sigma=sigma, batch_size=batch_size)


# --------------------------------------------------------------------------------------------------------
# Write-ahead charging.


def test_charge_is_written_before_any_data_is_touched() -> None:
    gate, query, _, log = spy_setup()
    release(gate, query, 1)
    release(gate, query, 2)
    assert log.events == ["commit", "sample", "clipped_sums", "postprocess"] * 2
    assert query.charged_when_computing == [{("job", 1)}, {("job", 1), ("job", 2)}]


class FailingQuery(SpyQuery):
    """Runs out of memory while computing the clipped sums (after the charge, before any noise)."""

    def clipped_sums(
        self, batch: Batch, params: dict[str, Array], rng: np.random.Generator
    ) -> dict[str, Array]:
        super().clipped_sums(batch, params, rng)
        raise MemoryError


def test_a_release_that_fails_before_it_leaves_the_gate_is_withdrawn() -> None:
    """Charges = releases: a release whose computation fails (nothing of it returned) takes its charge back,
    and the job's reservation covers that iteration again; releases before it stay charged."""
    gate, query, ledger, log = spy_setup(budget=100.0)
    ledger.reserve("job", SubsampledGaussianEvent(1.0, 50, 200), 3)
    release(gate, query, 1)
    failing = FailingQuery(log, ledger)
    with pytest.raises(MemoryError):
        release(gate, failing, 2)
    assert log.events[-4:] == ["commit", "sample", "clipped_sums", "withdraw"]
    assert [(c.iteration, c.attempt) for c in ledger.charges()] == [(1, 0)]
    one = privacy_cost(SubsampledGaussianEvent(1.0, 50, 200))
    assert_curve(ledger.spent_cost(), one)
    assert_curve(ledger.reserved_cost(), one.scaled(2))  # iterations 2 and 3 still to come
    release(gate, query, 2)  # the same attempt key is free again
    assert [(c.iteration, c.attempt) for c in ledger.charges()] == [(1, 0), (2, 0)]
    assert_curve(ledger.spent_cost(), one.scaled(2))


class SingularQuery(SpyQuery):
    """Fails with a numerical error: one that could depend on the rows' values."""

    def clipped_sums(
        self, batch: Batch, params: dict[str, Array], rng: np.random.Generator
    ) -> dict[str, Array]:
        super().clipped_sums(batch, params, rng)
        raise np.linalg.LinAlgError("singular")


def test_a_failure_that_may_depend_on_the_values_keeps_its_charge() -> None:
    """The job's failure is seen by the analyst: unless it cannot depend on the rows' values, it stays
    charged."""
    gate, _, ledger, log = spy_setup(budget=100.0)
    with pytest.raises(np.linalg.LinAlgError):
        release(gate, SingularQuery(log, ledger), 1)
    assert "withdraw" not in log.events and [c.iteration for c in ledger.charges()] == [1]


def test_withdrawing_a_charge_paid_on_its_own_leaves_the_reservation_alone() -> None:
    ledger = InMemoryLedger(delta=DELTA, epsilon_budget=100.0)
    ledger.reserve("a", EVENT, 1)
    ledger.commit(charge("a", 1))
    ledger.commit(charge("a", 2))  # beyond the reservation: admitted on its own
    ledger.withdraw(charge("a", 2))
    assert_curve(ledger.reserved_cost(), PrivacyCost.zero())  # the reservation stays used up
    assert_curve(ledger.spent_cost(), privacy_cost(EVENT))
    ledger.withdraw(charge("a", 2))  # gone already: nothing happens
    ledger.withdraw(charge("a", 1))
    assert_curve(ledger.reserved_cost(), privacy_cost(EVENT))
    assert ledger.charges() == [] and ledger.epsilon_spent() == 0.0


def test_a_failing_ledger_means_nothing_is_computed() -> None:
    gate, query, ledger, log = spy_setup(fail=OSError("ledger database is down"))
    with pytest.raises(OSError):
        release(gate, query)
    assert log.events == ["commit"]
    assert ledger.charges() == []


def test_refused_charges_compute_nothing() -> None:
    # One full-batch release at sigma = 1 costs epsilon ~ 4.8 at delta 1e-5: far above a budget of 1.
    gate, query, ledger, log = spy_setup(budget=1.0)
    with pytest.raises(BudgetExceeded) as refused:
        release(gate, query, batch_size=200)
    assert refused.value.requested > refused.value.budget == 1.0
    assert log.events == ["commit"]
    assert ledger.charges() == [] and ledger.epsilon_spent() == 0.0


def test_vanishing_sigma_on_private_data_is_refused_by_the_budget() -> None:
    """sigma = 1e-160 is > 0, so the gate lets the ledger decide; the accountant must report an infinite
    cost (not NaN, which compares False with every budget) and the release must never be computed."""
    gate, query, ledger, log = spy_setup(n=1000, budget=1.0)
    with pytest.raises(BudgetExceeded):
        release(gate, query, sigma=1e-160, batch_size=10)
    assert "clipped_sums" not in log.events and "sample" not in log.events
    assert ledger.charges() == []
    direct = InMemoryLedger(delta=DELTA, epsilon_budget=1.0)
    with pytest.raises(BudgetExceeded):
        direct.commit(Charge("d", "job", 1, SubsampledGaussianEvent(1e-160, 10, 1000)))
    assert direct.charges() == []


def test_duplicate_iterations_are_refused_before_computing() -> None:
    gate, query, ledger, log = spy_setup()
    release(gate, query, 1)
    spent = ledger.epsilon_spent()
    with pytest.raises(DuplicateCharge):
        release(gate, query, 1)
    assert log.events.count("clipped_sums") == 1
    assert len(ledger.charges()) == 1 and ledger.epsilon_spent() == spent


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"sigma": -1.0}, ValueError),
        ({"sigma": float("nan")}, ValueError),
        ({"sigma": float("inf")}, ValueError),
        ({"batch_size": 0}, ValueError),
        ({"batch_size": 201}, ValueError),
    ],
)
def test_invalid_requests_are_refused_before_charging(kwargs: dict[str, float], error: type) -> None:
    gate, query, ledger, log = spy_setup()
    arguments = {"sigma": 1.0, "batch_size": 50, **kwargs}
    with pytest.raises(error):
        gate.release(query, PARAMS, job_id="job", iteration=1, **arguments)  # type: ignore[arg-type]
    assert log.events == [] and ledger.charges() == []


def test_malformed_params_are_refused_before_charging() -> None:
    gate, query, ledger, log = spy_setup()
    with pytest.raises(ValueError):
        gate.release(
            query, {"second_moment": np.eye(D + 1)}, job_id="job", iteration=1, sigma=1.0, batch_size=50
        )
    assert log.events == [] and ledger.charges() == []


def test_release_reports_its_provenance() -> None:
    x, y = rows(200)
    ledger = InMemoryLedger(delta=DELTA)
    gate = Gate(InMemoryTabularStore("d", x, y), ledger)
    out = gate.release(LogisticRegressionQuery(), PARAMS, job_id="j", iteration=3, sigma=2.0, batch_size=40)
    assert (out.job_id, out.iteration, out.sigma, out.batch_size, out.population) == ("j", 3, 2.0, 40, 200)
    assert ledger.charges() == [Charge("d", "j", 3, SubsampledGaussianEvent(2.0, 40, 200))]
    assert ledger.epsilon_spent() == pytest.approx(epsilon(2.0, 40, 200, 1, DELTA), rel=1e-12)


class GeneratorSpyStore(SpyStore):
    """Records the generator the gate hands to `sample` on each release."""

    def __init__(self, inner: InMemoryTabularStore) -> None:
        super().__init__(inner, Log())
        self.generators: list[np.random.Generator] = []

    def sample(self, size: int, rng: np.random.Generator) -> Batch:
        self.generators.append(rng)
        return super().sample(size, rng)


def test_private_releases_draw_from_a_fresh_cryptographic_generator() -> None:
    """docs/design.md sections 2-3: noise and sampling come from a cryptographically secure bit generator
    keyed by the OS (AES-128 in counter mode), a fresh one per release. Two generators' first 4 x 64 bits
    agree with probability 2^-256 if the keys are independent, so equal streams mean a fixed or reused key."""
    first, second = private_generator(), private_generator()
    assert isinstance(first.bit_generator, AESCounter) and isinstance(second.bit_generator, AESCounter)
    assert not np.array_equal(first.bit_generator.random_raw(4), second.bit_generator.random_raw(4))
    assert not np.array_equal(first.normal(size=4), second.normal(size=4))

    x, y = rows(200)
    store = GeneratorSpyStore(InMemoryTabularStore("private", x, y))
    gate = Gate(store, InMemoryLedger(delta=DELTA))
    for t in (1, 2):
        gate.release(LogisticRegressionQuery(), PARAMS, job_id="j", iteration=t, sigma=2.0, batch_size=40)
    used, later = store.generators
    assert isinstance(used.bit_generator, AESCounter) and used is not later
    assert not np.array_equal(used.bit_generator.random_raw(4), later.bit_generator.random_raw(4))


# --------------------------------------------------------------------------------------------------------
# In-memory ledger arithmetic.

EVENT = SubsampledGaussianEvent(1.0, 100, 10_000)


def charge(job: str, t: int, event: SubsampledGaussianEvent = EVENT) -> Charge:
    return Charge("d", job, t, event)


def assert_curve(actual: PrivacyCost, expected: PrivacyCost) -> None:
    np.testing.assert_allclose(actual.as_array(), expected.as_array(), rtol=1e-12, atol=1e-15)


def test_reserve_commit_refund_arithmetic() -> None:
    per = privacy_cost(EVENT)
    ledger = InMemoryLedger(delta=DELTA, epsilon_budget=100.0)
    ledger.reserve("a", EVENT, 10)
    assert_curve(ledger.reserved_cost(), per.scaled(10))
    assert_curve(ledger.spent_cost(), PrivacyCost.zero())
    for t in range(1, 5):
        ledger.commit(charge("a", t))
    assert_curve(ledger.spent_cost(), per.scaled(4))
    assert_curve(ledger.reserved_cost(), per.scaled(6))  # committing does not double count
    assert ledger.epsilon_spent() == pytest.approx(epsilon(1.0, 100, 10_000, 4, DELTA), rel=1e-12)
    ledger.refund("a")
    assert_curve(ledger.reserved_cost(), PrivacyCost.zero())
    assert_curve(ledger.spent_cost(), per.scaled(4))
    ledger.refund("a")  # idempotent
    ledger.commit(charge("a", 5))  # after a refund, charges are admitted on their own
    assert ledger.epsilon_spent() == pytest.approx(epsilon(1.0, 100, 10_000, 5, DELTA), rel=1e-12)


def test_a_tight_reservation_is_usable_in_full_and_no_further() -> None:
    t = 10
    budget = privacy_cost(SelfComposedEvent(EVENT, t)).epsilon(DELTA) * (1 + 1e-9)
    ledger = InMemoryLedger(delta=DELTA, epsilon_budget=budget)
    ledger.reserve("a", EVENT, t)
    with pytest.raises(BudgetExceeded):
        ledger.reserve("b", EVENT, 1)  # the reservation holds the whole budget
    with pytest.raises(BudgetExceeded):
        ledger.commit(charge("b", 1))
    for i in range(1, t + 1):
        ledger.commit(charge("a", i))  # would fail from some i on if commits double counted
    with pytest.raises(BudgetExceeded):
        ledger.commit(charge("a", t + 1))
    assert len(ledger.charges()) == t
    assert ledger.epsilon_spent() <= budget


def test_a_reservation_does_not_cover_a_costlier_event() -> None:
    budget = privacy_cost(SelfComposedEvent(EVENT, 10)).epsilon(DELTA) * (1 + 1e-9)
    ledger = InMemoryLedger(delta=DELTA, epsilon_budget=budget)
    ledger.reserve("a", EVENT, 10)
    with pytest.raises(BudgetExceeded):
        ledger.commit(charge("a", 1, SubsampledGaussianEvent(0.5, 100, 10_000)))
    assert ledger.charges() == []


def test_a_refusal_names_the_spend_and_says_when_it_is_already_above_the_cap() -> None:
    """The in-process ledger refuses in the service's words (privacy_wall.ledger.refusals); one whose cap
    fell below what it spent says in one line that nothing more is admitted."""
    ledger = InMemoryLedger(delta=DELTA, epsilon_budget=100.0)
    for t in range(1, 4):
        ledger.commit(charge("a", t))
    spent = ledger.epsilon_spent()
    ledger.epsilon_budget = 10 * spent
    with pytest.raises(BudgetExceeded) as refused:
        ledger.reserve("b", SubsampledGaussianEvent(0.3, 10_000, 10_000), 100)
    assert f"epsilon {spent:.4g} of {10 * spent:.4g} is spent or reserved" in str(refused.value)
    assert "already above the cap" not in str(refused.value)
    ledger.epsilon_budget = spent / 2
    with pytest.raises(BudgetExceeded) as refused:
        ledger.commit(charge("a", 4))
    assert "already above the cap" in str(refused.value) and "nothing more is admitted" in str(refused.value)
    assert len(ledger.charges()) == 3


def test_refused_reservations_record_nothing() -> None:
    ledger = InMemoryLedger(delta=DELTA, epsilon_budget=5.0)
    with pytest.raises(BudgetExceeded):
        ledger.reserve("a", EVENT, 10_000)
    assert_curve(ledger.reserved_cost(), PrivacyCost.zero())
    ledger.reserve("b", EVENT, 1)
    with pytest.raises(ValueError):
        ledger.reserve("b", EVENT, 1)
    with pytest.raises(TypeError):
        ledger.reserve("c", SelfComposedEvent(EVENT, 3), 3)  # type: ignore[arg-type]


@pytest.mark.parametrize("iterations", [-1000, -1, 1.5, float("nan")])
def test_reservations_must_be_a_whole_number_of_iterations(iterations: float) -> None:
    """A negative reservation is a negative reserved curve that offsets real spend (and a fractional one
    leaves a negative remainder after its last commit): either lets later charges overspend the budget."""
    ledger = InMemoryLedger(delta=DELTA, epsilon_budget=2.0)
    with pytest.raises((ValueError, TypeError)):
        ledger.reserve("bad", EVENT, iterations)  # type: ignore[arg-type]
    assert_curve(ledger.reserved_cost(), PrivacyCost.zero())
    committed = 0
    for t in range(1, 200):
        try:
            ledger.commit(charge("job", t))
            committed += 1
        except BudgetExceeded:
            break
    assert ledger.epsilon_spent() <= 2.0
    assert committed == len(ledger.charges()) < 1999


def test_duplicate_charge_keeps_the_first() -> None:
    ledger = InMemoryLedger(delta=DELTA)
    ledger.commit(charge("a", 1))
    with pytest.raises(DuplicateCharge):
        ledger.commit(charge("a", 1, SubsampledGaussianEvent(5.0, 100, 10_000)))
    assert ledger.charges() == [charge("a", 1)]
    ledger.commit(charge("b", 1))  # the key is (job, t): another job's iteration 1 is distinct


def test_a_retried_attempt_pays_again() -> None:
    """A release that was charged but lost (a crash before it was stored) is recomputed as attempt 1: it
    is a new release on a new sample with new noise, so it must be charged again, once."""
    ledger = InMemoryLedger(delta=DELTA)
    ledger.commit(charge("a", 1))
    ledger.commit(Charge("d", "a", 1, EVENT, attempt=1))
    with pytest.raises(DuplicateCharge):
        ledger.commit(Charge("d", "a", 1, EVENT, attempt=1))
    assert len(ledger.charges()) == 2
    assert ledger.epsilon_spent() == pytest.approx(epsilon(1.0, 100, 10_000, 2, DELTA), rel=1e-12)


# --------------------------------------------------------------------------------------------------------
# Concurrency: the budget check and the write are one atomic step.

THREADS = 16


@pytest.fixture
def eager_thread_switching() -> Iterator[None]:
    """Switch threads every microsecond so that a check-then-write race would actually interleave."""
    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(previous)


def budget_admitting_exactly(k: int, event: SubsampledGaussianEvent) -> float:
    low = privacy_cost(SelfComposedEvent(event, k)).epsilon(DELTA)
    high = privacy_cost(SelfComposedEvent(event, k + 1)).epsilon(DELTA)
    assert low < high
    return (low + high) / 2


def race(attempt: Callable[[int], None]) -> tuple[int, list[BaseException]]:
    """Run attempt(i) on THREADS threads released together; count the ones that were not refused."""
    barrier = threading.Barrier(THREADS)
    admitted: list[int] = []
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        barrier.wait()
        try:
            attempt(i)
            admitted.append(i)
        except BudgetExceeded:
            pass
        except BaseException as exc:  # reported by the caller
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return len(admitted), errors


@pytest.mark.usefixtures("eager_thread_switching")
def test_concurrent_commits_admit_exactly_k() -> None:
    event = SubsampledGaussianEvent(4.0, 50, 50)
    k = 23
    for _ in range(5):
        ledger = InMemoryLedger(delta=DELTA, epsilon_budget=budget_admitting_exactly(k, event))

        def commit_five(i: int, ledger: InMemoryLedger = ledger) -> None:
            # 16 threads x 5 iterations = 80 attempts for 23 slots; a refusal ends the thread's job.
            for t in range(1, 6):
                ledger.commit(Charge("d", f"job-{i}", t, event))

        _, errors = race(commit_five)
        assert errors == []
        assert len(ledger.charges()) == k
        assert ledger.epsilon_budget is not None and ledger.epsilon_spent() <= ledger.epsilon_budget


@pytest.mark.usefixtures("eager_thread_switching")
def test_concurrent_single_commits_admit_exactly_k() -> None:
    event = SubsampledGaussianEvent(4.0, 50, 50)
    k = 9
    for _ in range(10):
        ledger = InMemoryLedger(delta=DELTA, epsilon_budget=budget_admitting_exactly(k, event))
        admitted, errors = race(lambda i, ledger=ledger: ledger.commit(Charge("d", f"job-{i}", 1, event)))
        assert errors == []
        assert admitted == k == len(ledger.charges())


@pytest.mark.usefixtures("eager_thread_switching")
def test_concurrent_reservations_admit_exactly_k() -> None:
    event = SubsampledGaussianEvent(4.0, 50, 50)
    iterations, k = 3, 7
    for _ in range(10):
        cap = budget_admitting_exactly(k * iterations, event)
        assert cap < privacy_cost(SelfComposedEvent(event, (k + 1) * iterations)).epsilon(DELTA)
        ledger = InMemoryLedger(delta=DELTA, epsilon_budget=cap)
        admitted, errors = race(lambda i, ledger=ledger: ledger.reserve(f"job-{i}", event, iterations))
        assert errors == []
        assert admitted == k


# --------------------------------------------------------------------------------------------------------
# The store.


def indexed_store(n: int) -> InMemoryTabularStore:
    """Row i is (i / n, 0, 0) with label i % 2, so a sampled row names its index."""
    x = np.zeros((n, D))
    x[:, 0] = np.arange(n) / n
    return InMemoryTabularStore("indexed", x, (np.arange(n) % 2).astype(np.float64))


def sampled_indices(batch: Batch, n: int) -> np.ndarray:
    index = np.rint(batch.features[:, 0] * n).astype(int)
    assert batch.labels is not None
    np.testing.assert_array_equal(batch.labels, index % 2)  # labels travel with their rows
    return index


def test_store_samples_exactly_s_distinct_rows() -> None:
    n = 100
    store = indexed_store(n)
    rng = np.random.default_rng(300)
    for size in (1, 2, 37, 99, 100):
        for _ in range(20):
            batch = store.sample(size, rng)
            index = sampled_indices(batch, n)
            assert batch.size == size and len(set(index.tolist())) == size
            assert index.min() >= 0 and index.max() < n
    for size in (0, -1, n + 1):
        with pytest.raises(ValueError):
            store.sample(size, rng)


def test_store_sampling_is_uniform() -> None:
    """Row-inclusion counts over R draws of S of N rows.

    Each row is included with probability q = S/N; for sampling without replacement the counts have
    covariance R q (1 - q) N/(N - 1) (I - 11^T/N), so sum_i (c_i - R q)^2 / (R q (1 - q) N/(N-1)) is
    chi-square with N - 1 degrees of freedom (normal approximation: R q = 800 per row). Both tails are
    checked: a too-regular scheme (e.g. round robin) is as wrong as a biased one.
    """
    n, size, draws = 50, 10, 4000
    store = indexed_store(n)
    rng = np.random.default_rng(301)
    counts = np.zeros(n)
    pair = 0  # rows 0 and 1 together: probability q (S - 1) / (N - 1) under uniform sampling
    for _ in range(draws):
        index = sampled_indices(store.sample(size, rng), n)
        counts[index] += 1
        pair += int(0 in index and 1 in index)
    q = size / n
    statistic = float(np.sum((counts - draws * q) ** 2) / (draws * q * (1 - q) * n / (n - 1)))
    low, high = stats.chi2.ppf(1e-6, n - 1), stats.chi2.isf(1e-6, n - 1)
    assert low < statistic < high, statistic
    expected_pair = draws * q * (size - 1) / (n - 1)
    assert abs(pair - expected_pair) < stats.norm.isf(1e-6) * np.sqrt(expected_pair), (pair, expected_pair)


def test_store_whole_population_is_every_row() -> None:
    n = 30
    store = indexed_store(n)
    index = sampled_indices(store.sample(n, np.random.default_rng(0)), n)
    assert sorted(index.tolist()) == list(range(n))


def test_bound_violations_name_the_row_but_never_its_values() -> None:
    n = 20
    x, y = rows(n)
    long_row = x.copy()
    long_row[7] = [2.718281828, 1.41421356, 0.577215664]
    with pytest.raises(BoundViolation) as error:
        InMemoryTabularStore("d", long_row, y)
    message = str(error.value)
    assert "row 7" in message
    norm = float(np.linalg.norm(long_row[7]))
    for value in (*long_row[7], norm):
        for shown in (str(value), repr(value), f"{value:.3g}", f"{value:.2f}", f"{value:.4g}"):
            assert shown not in message, shown

    bad_label = y.copy()
    bad_label[11] = 0.318309886
    with pytest.raises(BoundViolation) as error:
        InMemoryTabularStore("d", x, bad_label)
    message = str(error.value)
    assert "row 11" in message
    assert "0.318" not in message and "0.32" not in message

    non_finite = x.copy()
    non_finite[4, 1] = np.inf
    with pytest.raises(BoundViolation) as error:
        InMemoryTabularStore("d", non_finite, y)
    assert "row 4" in str(error.value) and "inf" not in str(error.value).replace("non-finite", "")


def test_norm_bound_is_enforced_at_ingestion() -> None:
    x = np.array([[1.0, 0.0, 0.0], [0.6, 0.8, 0.0]])
    InMemoryTabularStore("d", x, np.array([0.0, 1.0]))  # norm exactly 1 is fine
    with pytest.raises(BoundViolation):
        InMemoryTabularStore("d", x * (1 + 1e-6), np.array([0.0, 1.0]))
    with pytest.raises(BoundViolation):
        InMemoryTabularStore("d", x, np.array([0.0, 0.5]))
    with pytest.raises(BoundViolation):
        InMemoryTabularStore("d", x, np.array([0.0]))


def test_running_out_of_memory_on_documents_keeps_its_charge() -> None:
    """Memory on bag-of-words data depends on the sampled documents' lengths (data): a MemoryError there
    may say something of the values, so it stays charged; on tabular data (public shapes) it is withdrawn
    (test_a_release_that_fails_before_it_leaves_the_gate_is_withdrawn)."""
    from privacy_wall.data.store import InMemoryBowStore
    from privacy_wall.queries.lda import LdaQuery

    class Exhausted(LdaQuery):
        def clipped_sums(
            self, batch: Batch, params: dict[str, Array], rng: np.random.Generator
        ) -> dict[str, Array]:
            raise MemoryError

    counts = sp.csr_array(np.random.default_rng(0).integers(0, 3, size=(40, 6)))
    ledger = InMemoryLedger(delta=DELTA, epsilon_budget=100.0)
    gate = Gate(InMemoryBowStore("docs", counts), ledger, padded=False)  # the stand-in would fail first
    with pytest.raises(MemoryError):
        gate.release(
            Exhausted(2, doc_length=10),
            {"expected_log_beta": np.log(np.full((2, 6), 1 / 6))},
            job_id="lda",
            iteration=1,
            sigma=1.0,
            batch_size=10,
        )
    assert [(c.job_id, c.iteration) for c in ledger.charges()] == [("lda", 1)]
