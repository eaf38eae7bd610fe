"""The contract every data-touching query of the privacy wall satisfies (docs/design.md sections 2 and 7).

`QueryContract` has no `Test` prefix, so pytest does not collect it on its own. Each query's test module
subclasses it (``class TestBlrQuery(QueryContract)``) and provides the hooks below; the subclass then runs
every contract test against its query:

- the declared per-block sensitivities are the ones the design states;
- sensitivity audit: replacing one record of a batch (random records, and adversarial records that push
  each block to its bound, under ordinary and extreme public parameters) moves the pre-noise batch mean of
  each block by at most the declared Delta_b, and the adversarial search reaches at least half of Delta_b
  (so a declaration that is too large by a factor 2 or more is flagged, and one too small is caught);
- clipping is a safety net: records that break the ingestion bounds still move each block by <= Delta_b;
- joint sensitivity: in every audit the concatenated normalised change (block b divided by Delta_b) has L2
  norm at most the query's joint sensitivity J (sqrt(B) unless the query declares less); a query that
  declares J < sqrt(B) must have adversarial records that reach at least 99% of it;
- noise calibration: one Gaussian mechanism over the normalised blocks gives block b the std
  sigma * J * Delta_b (times the fixed-point grid's small inflation, mechanisms.fixed_point_grid), checked
  both on `release_blocks` and end-to-end through the real gate;
- private releases cannot be seeded, nor released with sigma = 0.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

import numpy as np
import pytest
from scipy import optimize, stats

from privacy_wall.data.store import Batch, RowStore
from privacy_wall.gate import Gate, PrivacyError, Release
from privacy_wall.ledger.base import InMemoryLedger
from privacy_wall.noise.mechanisms import fixed_point_grid, release_blocks
from privacy_wall.queries.base import Array, Block, Query, joint_sensitivity

Params = dict[str, Array]

#: Relative slack on a sensitivity bound. The two neighbouring batches are summed by the same BLAS call with
#: one row changed, so their sums differ from the exact difference by a few ulps of a sum of at most
#: S * C, i.e. ~S * 1e-16 relative to Delta = 2C/S: ~1e-14 for the batch sizes used here. 1e-12 is
#: a 100x margin over that and far below any real over-shoot (a wrong factor is >= 1e-3 relative).
SENSITIVITY_SLACK = 1e-12

#: Each statistical acceptance region below has probability 1 - 2e-6 under the hypothesis being tested
#: (two-sided tails of 1e-6): with fixed seeds the tests are deterministic, and a correct implementation
#: would fail with another seed only once in ~500,000 seeds.
TAIL = 1e-6

#: The seed of the generator handed to clipped_sums in the audits: both batches of a neighbouring pair get
#: the same stream, as the query contract requires each record's randomness to be its own.
COUPLING_SEED = 2024

#: The adversarial search must reach at least this fraction of each declared Delta_b.
MIN_REACH = 0.5

#: A declared joint sensitivity J < sqrt(B) must be reached to within 1% by the adversarial records.
MIN_JOINT_REACH = 0.99

#: Key of the joint normalised change in the `reach` dictionaries of the audits.
JOINT = "joint (normalised concatenation)"


def chi2_acceptance(df: int) -> tuple[float, float]:
    """Two-sided acceptance region of a chi-square(df) statistic at tail probability TAIL on each side."""
    return float(stats.chi2.ppf(TAIL, df)), float(stats.chi2.isf(TAIL, df))


def normal_acceptance() -> float:
    """|z| bound of a standard normal statistic at tail probability TAIL on each side."""
    return float(stats.norm.isf(TAIL))


def assert_noise_is_calibrated(noise: Array, std: float, label: str) -> None:
    """`noise` (releases x coordinates) is i.i.d. N(0, std^2): chi-square test of the scale and a z-test
    of the mean.

    With n releases of k coordinates, sum((noise / std)^2) ~ chi2(n k) exactly when the std is right; the
    acceptance region at n k = 6000 is about +-9% in variance (+-4.5% in std), so a wrong sqrt(B), a
    2 versus sqrt(2) or a missing 1/S is rejected with overwhelming probability. The mean of n k standard
    normals has std 1/sqrt(n k).
    """
    z = np.asarray(noise, dtype=np.float64).reshape(-1) / std
    low, high = chi2_acceptance(z.size)
    statistic = float(np.sum(z * z))
    assert low < statistic < high, (
        f"{label}: empirical noise std is {math.sqrt(statistic / z.size):.4f} x the declared "
        f"sigma J Delta_b (chi-square {statistic:.0f} outside [{low:.0f}, {high:.0f}] for {z.size} df)"
    )
    mean_z = float(np.mean(z)) * math.sqrt(z.size)
    assert abs(mean_z) < normal_acceptance(), f"{label}: noise mean is not 0 (z = {mean_z:.2f})"


def normalised_joint_move(query: Query, first: Batch, second: Batch, params: Params, dimension: int) -> float:
    """L2 norm of the concatenated (block b of `second` - block b of `first`) / Delta_b, for one-record
    batches (S = 1)."""
    before = query.clipped_sums(first, params, np.random.default_rng(COUPLING_SEED))
    after = query.clipped_sums(second, params, np.random.default_rng(COUPLING_SEED))
    total = 0.0
    for block in query.blocks(dimension):
        moved = float(np.linalg.norm(np.asarray(after[block.name]) - np.asarray(before[block.name])))
        total += (moved / block.sensitivity(1)) ** 2
    return math.sqrt(total)


def interval(t: Array, low: float, high: float) -> Array:
    """Smooth periodic map of unconstrained search coordinates onto [low, high], both ends reachable."""
    return low + (high - low) * (1 + np.sin(t)) / 2


def search_joint_sensitivity(
    move: Callable[[Array], float], n_params: int, rng: np.random.Generator, *, starts: int, samples: int
) -> tuple[float, int]:
    """Adversarial search for the largest normalised joint move over a parametrised family of replacements:
    `samples` uniformly random parameter vectors, then Nelder-Mead from the `starts` best of them.
    Returns the largest move of any evaluation (so a caller can check both that it reaches the declared J
    and that it never exceeds it) and the number of evaluations."""
    best = 0.0
    evaluations = 0

    def objective(theta: Array) -> float:
        nonlocal best, evaluations
        value = move(theta)
        best = max(best, value)
        evaluations += 1
        return -value

    candidates = rng.uniform(-math.pi, math.pi, size=(samples, n_params))
    values = np.array([-objective(theta) for theta in candidates])
    for theta in candidates[np.argsort(values)[::-1][:starts]]:
        options = {"maxiter": 400 * n_params, "xatol": 1e-10, "fatol": 1e-13}
        optimize.minimize(objective, theta, method="Nelder-Mead", options=options)
    return best, evaluations


class QueryContract:
    """Base class of every query's contract tests. Subclasses set the hooks; nothing here is query-specific.

    Records are passed around as one-row `Batch` objects; `replace_record` puts one into a batch (override it
    for queries whose batches are not dense feature matrices).
    """

    #: Data dimension used by the audits.
    dimension: int = 3
    #: Batch size S of the sensitivity audits (small, so one record matters).
    audit_batch_size: int = 32
    #: Random replacement trials per parameter set.
    random_trials: int = 300
    #: Positions of the batch at which adversarial records are placed.
    audit_positions: tuple[int, ...] = (0, 13, -1)
    #: Noise calibration: population (all of it is the batch, so there is no sampling variance), releases,
    #: noise multiplier.
    calibration_population: int = 1000
    calibration_releases: int = 2000
    calibration_sigma: float = 1.0

    # ----------------------------------------------------------------------------------------------------
    # Hooks: every query's test module provides these.

    def make_query(self) -> Query:
        raise NotImplementedError

    def make_batch(self, rng: np.random.Generator, size: int) -> Batch:
        """`size` records that satisfy the ingestion bounds."""
        raise NotImplementedError

    def make_params(self, rng: np.random.Generator) -> list[Params]:
        """Public parameters to audit under, typical and extreme (all accepted by validate_params)."""
        raise NotImplementedError

    def random_record(self, rng: np.random.Generator) -> Batch:
        """One random record (a one-row batch) that satisfies the ingestion bounds."""
        raise NotImplementedError

    def adversarial_records(self, params: Params) -> list[Batch]:
        """Records within the ingestion bounds that push each block to its bound under `params`."""
        raise NotImplementedError

    def out_of_bound_records(self, rng: np.random.Generator) -> list[Batch]:
        """Records that break the ingestion bounds (only reachable by building a Batch directly)."""
        raise NotImplementedError

    def malformed_params(self) -> list[Params]:
        """Public parameters that validate_params must refuse."""
        raise NotImplementedError

    def expected_sensitivities(self, batch_size: int) -> dict[str, float]:
        """Delta_b of each block as the design states it (written out independently of Block)."""
        raise NotImplementedError

    def make_store(self, name: str, rows: Batch, *, public: bool) -> RowStore:
        """A store holding exactly `rows`."""
        raise NotImplementedError

    def calibration_rows(self, rng: np.random.Generator) -> Batch:
        """The population of the end-to-end noise calibration (calibration_population records)."""
        return self.make_batch(rng, self.calibration_population)

    def calibration_params(self) -> Params:
        """Public parameters of the end-to-end noise calibration."""
        raise NotImplementedError

    def check_postprocess_inactive(self, exact_means: dict[str, Array], noise_std: dict[str, float]) -> None:
        """Assert that postprocess is the identity (up to `released_blocks`) for these means plus noise."""
        raise NotImplementedError

    def released_blocks(self, statistics: dict[str, Array]) -> dict[str, Array]:
        """Released (post-processed) statistics in block coordinates, where postprocess is inactive."""
        return statistics

    def replace_record(self, batch: Batch, index: int, record: Batch) -> Batch:
        """`batch` with its row `index` replaced by the one-row batch `record` (dense default)."""
        features = np.array(batch.features, dtype=np.float64, copy=True)
        features[index] = record.features[0]
        labels = None
        if batch.labels is not None:
            assert record.labels is not None
            labels = np.array(batch.labels, dtype=np.float64, copy=True)
            labels[index] = record.labels[0]
        return replace(batch, features=features, labels=labels)

    # ----------------------------------------------------------------------------------------------------
    # Helpers.

    def _means(self, query: Query, batch: Batch, params: Params) -> dict[str, Array]:
        # One fixed generator per call: neighbouring batches see the same randomness (a coupling).
        sums = query.clipped_sums(batch, params, np.random.default_rng(COUPLING_SEED))
        return {name: np.asarray(value, dtype=np.float64) / batch.size for name, value in sums.items()}

    def _deltas(self, query: Query, batch_size: int) -> dict[str, float]:
        return {block.name: block.sensitivity(batch_size) for block in query.blocks(self.dimension)}

    def _expected_stds(
        self, query: Query, deltas: dict[str, float], sigma: float, means: dict[str, Array]
    ) -> dict[str, float]:
        """sigma J Delta_b, times the fixed-point release's inflation for its size d (the grid's rounding
        charge 1 + gamma ceil(sqrt(d)) and the smoothing; mechanisms.fixed_point_grid)."""
        joint = joint_sensitivity(query, self.dimension)
        grid = fixed_point_grid(sigma, sum(np.asarray(value).size for value in means.values()))
        assert 1 <= grid.noise_scale / (sigma * grid.inflation) <= 1 + 2.0**-30
        return {name: grid.noise_scale * joint * delta for name, delta in deltas.items()}

    def _check_move(
        self,
        before: dict[str, Array],
        after: dict[str, Array],
        deltas: dict[str, float],
        reach: dict[str, float],
        label: str,
        joint: float,
    ) -> None:
        normalised = 0.0
        for name, delta in deltas.items():
            assert np.isfinite(before[name]).all() and np.isfinite(after[name]).all(), (
                f"{label}: block {name} is not finite (a non-finite release is a data-dependent signal "
                "no noise can hide)"
            )
            moved = float(np.linalg.norm(after[name] - before[name]))
            assert moved <= delta * (1 + SENSITIVITY_SLACK), (
                f"{label}: block {name} moved by {moved:.6g} = {moved / delta:.6f} x its declared Delta "
                f"{delta:.6g}"
            )
            reach[name] = max(reach[name], moved / delta)
            normalised += (moved / delta) ** 2
        moved_jointly = math.sqrt(normalised)
        assert moved_jointly <= joint * (1 + SENSITIVITY_SLACK), (
            f"{label}: the normalised blocks moved jointly by {moved_jointly:.6f} > the joint sensitivity "
            f"{joint:.6f}"
        )
        reach[JOINT] = max(reach.get(JOINT, 0.0), moved_jointly / joint)

    def _private_gate(self, rng: np.random.Generator) -> tuple[Gate, InMemoryLedger]:
        store = self.make_store("private-data", self.make_batch(rng, 200), public=False)
        ledger = InMemoryLedger(delta=1e-5, epsilon_budget=None)
        return Gate(store, ledger), ledger

    def _release(self, gate: Gate, iteration: int, *, sigma: float = 1.0, batch_size: int = 50) -> Release:
        return gate.release(
            self.make_query(),
            self.calibration_params(),
            job_id="job",
            iteration=iteration,
            sigma=sigma,
            batch_size=batch_size,
        )

    # ----------------------------------------------------------------------------------------------------
    # Declarations.

    def test_blocks_match_clipped_sums(self) -> None:
        query = self.make_query()
        rng = np.random.default_rng(100)
        blocks = query.blocks(self.dimension)
        names = [block.name for block in blocks]
        assert len(set(names)) == len(names), "block names must be unique"
        for block in blocks:
            assert isinstance(block, Block) and block.bound > 0
        batch = self.make_batch(rng, self.audit_batch_size)
        for params in self.make_params(rng):
            sums = query.clipped_sums(batch, params, np.random.default_rng(COUPLING_SEED))
            assert set(sums) == set(names)
            for name, value in sums.items():
                assert value.ndim == 1, f"block {name} must be released as a flat vector"

    def test_declared_sensitivities_are_the_designs(self) -> None:
        query = self.make_query()
        for batch_size in (1, 7, 1000, 20_000):
            declared = self._deltas(query, batch_size)
            expected = self.expected_sensitivities(batch_size)
            assert declared.keys() == expected.keys()
            for name, value in expected.items():
                assert declared[name] == pytest.approx(value, rel=1e-12), name

    def test_params_are_validated(self) -> None:
        query = self.make_query()
        for params in self.make_params(np.random.default_rng(101)):
            query.validate_params(params, self.dimension)
        for params in self.malformed_params():
            with pytest.raises(ValueError):
                query.validate_params(params, self.dimension)

    # ----------------------------------------------------------------------------------------------------
    # Sensitivity audit.

    @pytest.mark.slow
    def test_sensitivity_random_replacements(self) -> None:
        query = self.make_query()
        rng = np.random.default_rng(102)
        size = self.audit_batch_size
        deltas = self._deltas(query, size)
        joint = joint_sensitivity(query, self.dimension)
        reach = dict.fromkeys(deltas, 0.0)
        for p, params in enumerate(self.make_params(rng)):
            batch = self.make_batch(rng, size)
            before = self._means(query, batch, params)
            for trial in range(self.random_trials):
                index = int(rng.integers(size))
                after = self._means(query, self.replace_record(batch, index, self.random_record(rng)), params)
                label = f"params #{p}, random trial {trial}"
                self._check_move(before, after, deltas, reach, label, joint)

    @pytest.mark.slow
    def test_sensitivity_adversarial_replacements(self) -> None:
        """Every ordered pair (a, b) of adversarial records: a in the batch (a few places), replaced by b."""
        query = self.make_query()
        rng = np.random.default_rng(103)
        size = self.audit_batch_size
        deltas = self._deltas(query, size)
        joint = joint_sensitivity(query, self.dimension)
        reach = dict.fromkeys(deltas, 0.0)
        for p, params in enumerate(self.make_params(rng)):
            base = self.make_batch(rng, size)
            records = self.adversarial_records(params)
            assert len(records) >= 2
            for position in self.audit_positions:
                for i, a in enumerate(records):
                    with_a = self.replace_record(base, position, a)
                    before = self._means(query, with_a, params)
                    for j, b in enumerate(records):
                        after = self._means(query, self.replace_record(with_a, position, b), params)
                        label = f"params #{p}, adversarial {i} -> {j} at position {position}"
                        self._check_move(before, after, deltas, reach, label, joint)
        if joint < math.sqrt(len(deltas)):
            assert reach[JOINT] >= MIN_JOINT_REACH, (
                f"the adversarial records reach only {reach[JOINT]:.4f} of the declared joint sensitivity "
                f"{joint:.6f}: add the replacement that attains it (the proof's equality case)"
            )
        for name in deltas:
            fraction = reach[name]
            assert fraction >= MIN_REACH, (
                f"block {name}: adversarial records reach only {fraction:.3f} of the declared Delta; "
                "either the declaration is loose or the adversarial records are too weak"
            )

    @pytest.mark.slow
    def test_clipping_is_a_safety_net(self) -> None:
        """Records that break the ingestion bounds (a Batch built directly) still move each block <= Delta."""
        query = self.make_query()
        rng = np.random.default_rng(104)
        size = self.audit_batch_size
        deltas = self._deltas(query, size)
        joint = joint_sensitivity(query, self.dimension)
        reach = dict.fromkeys(deltas, 0.0)
        for p, params in enumerate(self.make_params(rng)):
            bad = self.out_of_bound_records(rng)
            candidates = bad + self.adversarial_records(params)
            # A batch made entirely of out-of-bound records, and an ordinary one.
            all_bad = self.make_batch(rng, size)
            for index in range(size):
                all_bad = self.replace_record(all_bad, index, bad[index % len(bad)])
            for base in (self.make_batch(rng, size), all_bad):
                for position in self.audit_positions:
                    for i, a in enumerate(bad):
                        with_a = self.replace_record(base, position, a)
                        before = self._means(query, with_a, params)
                        for j, b in enumerate(candidates):
                            after = self._means(query, self.replace_record(with_a, position, b), params)
                            label = f"params #{p}, out-of-bound {i} -> {j} at position {position}"
                            self._check_move(before, after, deltas, reach, label, joint)

    # ----------------------------------------------------------------------------------------------------
    # Noise calibration.

    def test_release_blocks_noise_is_calibrated(self) -> None:
        """release_blocks on this query's blocks and joint sensitivity J: block b gets
        N(0, (sigma J Delta_b)^2) per entry (times the grid's inflation)."""
        query = self.make_query()
        rng = np.random.default_rng(105)
        size = self.audit_batch_size
        params = self.make_params(rng)[0]
        means = self._means(query, self.make_batch(rng, size), params)
        deltas = self._deltas(query, size)
        sigma = 1.7
        joint = joint_sensitivity(query, self.dimension)
        expected = self._expected_stds(query, deltas, sigma, means)
        noise: dict[str, list[Array]] = {name: [] for name in deltas}
        noise_rng = np.random.default_rng(106)
        for _ in range(self.calibration_releases):
            released = release_blocks(means, deltas, sigma, noise_rng, joint_sensitivity=joint)
            for name in deltas:
                assert released.noise_std[name] == pytest.approx(expected[name], rel=1e-12)
                noise[name].append(released.values[name] - means[name])
        for name in deltas:
            assert_noise_is_calibrated(np.array(noise[name]), expected[name], f"release_blocks, block {name}")

    def test_gate_releases_batch_means(self) -> None:
        """At sigma = 0 on a public store whose rows are all one record, every batch size must release that
        record's contribution itself: sums are divided by S (not N), whichever rows were sampled."""
        query = self.make_query()
        rng = np.random.default_rng(113)
        params = self.calibration_params()
        for _ in range(3):
            one = self.random_record(rng)
            rows = self.make_batch(rng, 40)
            for index in range(rows.size):
                rows = self.replace_record(rows, index, one)
            expected = self.released_blocks(
                query.postprocess(self._means(query, one, params), self.dimension)
            )
            gate = Gate(self.make_store("constant", rows, public=True), InMemoryLedger(delta=1e-5), seed=3)
            for t, size in enumerate((1, 7, 40), start=1):
                release = gate.release(query, params, job_id="means", iteration=t, sigma=0.0, batch_size=size)
                released = self.released_blocks(release.statistics)
                for name, value in expected.items():
                    np.testing.assert_allclose(released[name], value, rtol=1e-9, atol=1e-15, err_msg=name)

    @pytest.mark.slow
    def test_gate_noise_is_calibrated_end_to_end(self) -> None:
        """The real gate on a private store with S = N (no sampling variance): release - exact = noise."""
        query = self.make_query()
        rng = np.random.default_rng(107)
        rows = self.calibration_rows(rng)
        population = rows.size
        store = self.make_store("calibration", rows, public=False)
        ledger = InMemoryLedger(delta=1e-5, epsilon_budget=None)
        gate = Gate(store, ledger)
        params = self.calibration_params()
        sigma = self.calibration_sigma
        exact = self._means(query, rows, params)
        deltas = self._deltas(query, population)
        expected = self._expected_stds(query, deltas, sigma, exact)
        self.check_postprocess_inactive(exact, expected)
        noise: dict[str, list[Array]] = {name: [] for name in deltas}
        for t in range(1, self.calibration_releases + 1):
            release = gate.release(
                query, params, job_id="calibration", iteration=t, sigma=sigma, batch_size=population
            )
            released = self.released_blocks(release.statistics)
            for name in deltas:
                assert release.noise_std[name] == pytest.approx(expected[name], rel=1e-12)
                noise[name].append(released[name] - exact[name])
        assert len(ledger.charges()) == self.calibration_releases
        for name in deltas:
            assert_noise_is_calibrated(np.array(noise[name]), expected[name], f"gate, block {name}")

    # ----------------------------------------------------------------------------------------------------
    # Private releases cannot be seeded.

    def test_private_gate_refuses_a_seed(self) -> None:
        store = self.make_store("private-data", self.make_batch(np.random.default_rng(108), 50), public=False)
        ledger = InMemoryLedger(delta=1e-5)
        for seed in (0, 1, 12345):
            with pytest.raises(PrivacyError):
                Gate(store, ledger, seed=seed)

    def test_private_gate_refuses_sigma_zero(self) -> None:
        gate, ledger = self._private_gate(np.random.default_rng(109))
        for sigma in (0.0, -0.0):
            with pytest.raises(PrivacyError):
                self._release(gate, 1, sigma=sigma)
        assert ledger.charges() == [], "a refused release must not be charged"

    def test_public_gates_with_one_seed_repeat(self) -> None:
        rows = self.make_batch(np.random.default_rng(110), 200)
        releases = []
        for _ in range(2):
            store = self.make_store("public-data", rows, public=True)
            gate = Gate(store, InMemoryLedger(delta=1e-5), seed=7)
            releases.append([self._release(gate, t) for t in (1, 2)])
        for first, second in zip(releases[0], releases[1], strict=True):
            for name, value in first.statistics.items():
                np.testing.assert_array_equal(value, second.statistics[name])
        # ...and a public gate with a seed is not constant: its two iterations differ.
        assert any(
            not np.array_equal(value, releases[0][1].statistics[name])
            for name, value in releases[0][0].statistics.items()
        )

    def test_private_releases_ignore_numpy_global_seed(self) -> None:
        gate, _ = self._private_gate(np.random.default_rng(111))
        outputs = []
        for t in (1, 2):
            np.random.seed(0)
            outputs.append(self._release(gate, t))
        for name, value in outputs[0].statistics.items():
            assert not np.array_equal(value, outputs[1].statistics[name]), name

    def test_private_releases_ignore_patched_numpy_seeding(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Even if every numpy seeding entry point is forced to a constant, private releases differ."""
        real_default_rng = np.random.default_rng

        def constant_default_rng(*args: object, **kwargs: object) -> np.random.Generator:
            return real_default_rng(0)

        real_seed = np.random.seed
        monkeypatch.setattr(np.random, "default_rng", constant_default_rng)
        monkeypatch.setattr(np.random, "seed", lambda *args, **kwargs: real_seed(0))
        gate, _ = self._private_gate(real_default_rng(112))
        outputs = []
        for t in (1, 2):
            np.random.seed(0)
            outputs.append(self._release(gate, t))
        for name, value in outputs[0].statistics.items():
            assert not np.array_equal(value, outputs[1].statistics[name]), name


class QueryModeContract:
    """Mixed in before a QueryContract subclass that runs the contract again for another mode of the same
    query (a different bound or coordinate of its blocks): the query's own tests run, the gate's do not."""

    # The gate's own behaviour (noise drawn for the declared blocks, seeds refused, one release per call)
    # does not depend on what the query's blocks hold: the mode's base class runs those tests.
    test_gate_releases_batch_means = None  # type: ignore[assignment]
    test_gate_noise_is_calibrated_end_to_end = None  # type: ignore[assignment]
    test_private_gate_refuses_a_seed = None  # type: ignore[assignment]
    test_private_gate_refuses_sigma_zero = None  # type: ignore[assignment]
    test_public_gates_with_one_seed_repeat = None  # type: ignore[assignment]
    test_private_releases_ignore_numpy_global_seed = None  # type: ignore[assignment]
    test_private_releases_ignore_patched_numpy_seeding = None  # type: ignore[assignment]
