"""Fixed-point releases (issue 25): the grid, exact multiples, the rounding's charge, the accounting
condition against dp_accounting's discrete Gaussian, refusals, and no float normal sampler in the wall."""

from __future__ import annotations

import math
import re
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

import privacy_wall
from privacy_wall.accounting.calibration import epsilon
from privacy_wall.gate import Gate, PrivacyError
from privacy_wall.ledger.base import InMemoryLedger
from privacy_wall.noise import mechanisms
from privacy_wall.noise.csprng import private_generator
from privacy_wall.noise.mechanisms import (
    CLAMP_STEPS,
    GRID_BITS,
    SMOOTHING,
    GridError,
    fixed_point_grid,
    release_blocks,
)
from tests.privacy_wall.queries.test_dpvi import TestDpviQuery


@pytest.mark.parametrize("sigma", [1e-3, 0.37, 0.5, 1.0, 1.24, 3.0, 17.5, 1e4])
@pytest.mark.parametrize("dimension", [1, 2, 252, 6_669, 770_000])
def test_the_grid_is_a_power_of_two_far_below_the_noise(sigma: float, dimension: int) -> None:
    grid = fixed_point_grid(sigma, dimension)
    mantissa, _ = math.frexp(grid.gamma)
    assert mantissa == 0.5  # a power of two
    assert sigma * 2.0 ** -(GRID_BITS + 1) < grid.gamma <= sigma * 2.0**-GRID_BITS
    assert grid.root_d == math.ceil(math.sqrt(dimension)) and grid.root_d**2 >= dimension
    assert grid.sigma2.denominator <= 4096
    # The discrete Gaussian covers the continuous calibration at the inflated sensitivity, plus the
    # smoothing, exactly (rationals); and adds at most a relative 2^-30 beyond that.
    step = Fraction(grid.gamma)
    calibrated = Fraction(sigma) * (1 + step * grid.root_d) / step
    assert grid.sigma2 - SMOOTHING >= calibrated**2
    assert grid.noise_scale / (sigma * grid.inflation) <= 1 + 2.0**-30
    # What rounding costs: at most 2^-22 ceil(sqrt(d)) sigma (0.02% at LDA's 770,000 numbers, sigma 1).
    assert grid.inflation - 1 <= 2.0**-GRID_BITS * grid.root_d * sigma


def test_the_grid_refuses_what_it_cannot_make() -> None:
    for sigma in (0.0, -1.0, math.nan, math.inf, 2.0**-901):
        with pytest.raises(GridError):
            fixed_point_grid(sigma, 10)
    for dimension in (0, -3):
        with pytest.raises(GridError):
            fixed_point_grid(1.0, dimension)
    # sigma ceil(sqrt(d)) beyond ~2^23 grid steps of noise: the sampler's int64 range (sigma^2 <= 2^48)
    with pytest.raises(GridError, match="2\\^24 grid steps"):
        fixed_point_grid(1e4, 10**8)


def blocks_for(rng: np.random.Generator) -> tuple[dict[str, np.ndarray], dict[str, float]]:
    means = {"a": rng.normal(size=7), "b": rng.normal(size=(4, 5)) * 1e-3, "c": rng.normal(size=1) * 1e4}
    return means, {"a": 0.02, "b": 3e-4, "c": 7.0}


@pytest.mark.parametrize("sigma", [0.3, 1.0, 2.5])
def test_released_values_are_exact_multiples_of_the_grid(sigma: float) -> None:
    """Every value of block b is float64(k) * unit_b for an integer k, unit_b = gamma J Delta_b: dividing
    by the unit gives an integer (to float rounding), and that integer times the unit is the value exactly."""
    means, deltas = blocks_for(np.random.default_rng(1))
    released = release_blocks(means, deltas, sigma, private_generator(), joint_sensitivity=1.5)
    grid = released.grid
    assert grid is not None and grid.dimension == 7 + 20 + 1
    for name, values in released.values.items():
        unit = released.unit[name]
        assert unit == grid.gamma * 1.5 * deltas[name]
        assert values.shape == means[name].shape
        k = np.rint(values / unit)
        assert np.array_equal(k * unit, values), name
        assert np.all(np.abs(values / unit - k) <= 1e-9 * np.maximum(1.0, np.abs(k)))
        # the noise is there and of the declared scale (loosely: a few dozen coordinates)
        assert released.noise_std[name] == pytest.approx(grid.noise_scale * 1.5 * deltas[name], rel=1e-15)
        assert np.all(np.abs(values - means[name]) < 8 * released.noise_std[name])


def test_the_integer_vector_is_the_rounded_blocks_plus_one_sampler_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One sampler call per release, over all blocks; the released integers are round(z / gamma) + noise."""
    means, deltas = blocks_for(np.random.default_rng(2))
    calls: list[tuple[Fraction, int]] = []
    noise = np.arange(28, dtype=np.int64) - 14

    def fake(sigma2: Fraction, size: int, rng: np.random.Generator) -> np.ndarray:
        calls.append((sigma2, size))
        return noise.copy()

    monkeypatch.setattr(mechanisms, "discrete_gaussian_noise", fake)
    released = release_blocks(means, deltas, 1.0, private_generator())
    assert released.grid is not None
    assert calls == [(released.grid.sigma2, 28)]
    joint = math.sqrt(3.0)
    start = 0
    for name in ("a", "b", "c"):
        size = means[name].size
        unit = released.grid.gamma * joint * deltas[name]
        expected = np.rint(means[name].reshape(-1) / unit) + noise[start : start + size]
        assert np.array_equal(np.rint(released.values[name].reshape(-1) / unit), expected)
        start += size


def test_rounding_moves_neighbours_by_at_most_gamma_sqrt_d() -> None:
    """The charge for rounding: ||round(z / gamma) - round(z' / gamma)|| gamma <= ||z - z'|| + gamma sqrt(d),
    reached (up to the bound) by coordinates just either side of half a grid step."""
    rng = np.random.default_rng(3)
    gamma = 2.0**-20
    for dimension in (1, 5, 100, 10_000):
        bound = 1 + gamma * math.ceil(math.sqrt(dimension))
        for _ in range(50):
            z = rng.normal(size=dimension)
            move = rng.normal(size=dimension)
            z_prime = z + move / np.linalg.norm(move) * rng.uniform(0, 1)
            moved = np.linalg.norm(np.rint(z / gamma) - np.rint(z_prime / gamma)) * gamma
            assert moved <= bound
        # worst case: every coordinate moves by just under one grid step and rounds a whole step further
        z = np.full(dimension, 0.5 * gamma * (1 - 1e-6))
        z_prime = z + gamma * (1 - 2e-6)
        moved = np.linalg.norm(np.rint(z / gamma) - np.rint(z_prime / gamma)) * gamma
        assert moved <= math.sqrt(dimension) * gamma * (1 + 1e-9) <= bound


def test_huge_values_are_clamped_and_non_finite_refused() -> None:
    """Clamping to +-2^62 grid steps is a contraction (sensitivity unchanged); the int64 sum stays exact."""
    released = release_blocks({"a": np.array([1e300, -1e300, 0.0])}, {"a": 1.0}, 1.0, private_generator())
    assert released.grid is not None
    unit = released.unit["a"]
    k = np.rint(released.values["a"] / unit)
    assert abs(k[0] - CLAMP_STEPS) < 2**56 and abs(k[1] + CLAMP_STEPS) < 2**56
    for bad in (math.nan, math.inf):
        with pytest.raises(ValueError, match="not finite"):
            release_blocks({"a": np.array([1.0, bad])}, {"a": 1.0}, 1.0, private_generator())


def test_sigma_zero_releases_the_blocks_unchanged() -> None:
    means, deltas = blocks_for(np.random.default_rng(4))
    released = release_blocks(means, deltas, 0.0, private_generator())
    assert released.grid is None
    for name in means:
        assert np.array_equal(released.values[name], means[name])
        assert released.noise_std[name] == 0.0


@pytest.mark.parametrize("sigma", [0.6, 1.0, 2.0])
@pytest.mark.parametrize("delta", [1e-2, 1e-5])
def test_the_ledgers_charge_covers_the_discrete_gaussian_in_one_dimension(sigma: float, delta: float) -> None:
    """One coordinate, on a coarse grid (bits = 6, so dp_accounting's exact discrete PLD is small; the
    production grid only has more smoothing room): the worst integer shift of the rounded value is
    1 / gamma + 1 grid steps, and the discrete Gaussian N_Z(0, sigma2) on it has epsilon at delta
    (dp_accounting's pessimistic PLD) at most what the ledger charges for one Gaussian release at sigma."""
    from dp_accounting.pld import privacy_loss_distribution

    grid = fixed_point_grid(sigma, 1, bits=6)
    shift = round(1 / grid.gamma) + 1
    assert shift * grid.gamma == grid.inflation
    discrete = privacy_loss_distribution.from_discrete_gaussian_mechanism(
        math.sqrt(float(grid.sigma2)), sensitivity=shift, value_discretization_interval=1e-4
    )
    true_epsilon = discrete.get_epsilon_for_delta(delta)
    charged = epsilon(sigma, 1000, 1000, 1, delta, "pld")  # S = N: one Gaussian mechanism, exactly priced
    assert true_epsilon <= charged <= epsilon(sigma, 1000, 1000, 1, delta), (true_epsilon, charged)
    # and the price is not loose by more than the inflation and dp_accounting's discretisation
    assert true_epsilon >= charged * 0.97


def test_the_gate_refuses_an_unrepresentable_sigma_before_charging() -> None:
    contract = TestDpviQuery()
    rows = contract.calibration_rows(np.random.default_rng(5))
    ledger = InMemoryLedger(delta=1e-5, epsilon_budget=None)
    gate = Gate(contract.make_store("tiny-sigma", rows, public=False), ledger)
    with pytest.raises(GridError):
        gate.release(
            contract.make_query(),
            contract.calibration_params(),
            job_id="tiny",
            iteration=1,
            sigma=2.0**-950,
            batch_size=rows.size,
        )
    assert ledger.charges() == []
    with pytest.raises(PrivacyError):  # the private generator stays the only one on private data
        Gate(contract.make_store("seeded", rows, public=False), ledger, seed=1)


def test_a_release_without_a_grid_is_refused_and_its_charge_withdrawn() -> None:
    """sigma = 2^22 fits the grid for up to 4 numbers (one is checked before the charge) but not for DPVI's
    larger release (checked once d is known): the GridError depends only on sigma and d, both public, so
    the gate withdraws the charge."""
    assert fixed_point_grid(2.0**22, 4).dimension == 4
    with pytest.raises(GridError):
        fixed_point_grid(2.0**22, 5)
    contract = TestDpviQuery()
    rows = contract.calibration_rows(np.random.default_rng(7))
    ledger = InMemoryLedger(delta=1e-5, epsilon_budget=None)
    gate = Gate(contract.make_store("no-grid", rows, public=False), ledger)
    with pytest.raises(GridError):
        gate.release(
            contract.make_query(),
            contract.calibration_params(),
            job_id="no-grid",
            iteration=1,
            sigma=2.0**22,
            batch_size=rows.size,
        )
    assert ledger.charges() == []


def test_gate_releases_are_exact_multiples_of_the_grid() -> None:
    """Through the real gate on a private store (DPVI: no post-processing, so the statistics are the noised
    blocks): every value is an exact multiple of gamma J Delta_b."""
    contract = TestDpviQuery()
    query = contract.make_query()
    rows = contract.calibration_rows(np.random.default_rng(6))
    gate = Gate(contract.make_store("multiples", rows, public=False), InMemoryLedger(delta=1e-5))
    sigma = 1.3
    release = gate.release(
        query, contract.calibration_params(), job_id="grid", iteration=1, sigma=sigma, batch_size=rows.size
    )
    blocks = query.blocks(contract.dimension)
    joint = math.sqrt(len(blocks))
    size = sum(np.asarray(v).size for v in release.statistics.values())
    grid = fixed_point_grid(sigma, size)
    for block in blocks:
        unit = grid.gamma * joint * block.sensitivity(rows.size)
        values = np.asarray(release.statistics[block.name])
        k = np.rint(values / unit)
        assert np.array_equal(k * unit, values)
        assert release.noise_std[block.name] == grid.noise_scale * joint * block.sensitivity(rows.size)


#: Floating-point normal samplers (and scipy.stats sampling) that no private release may call.
FLOAT_SAMPLERS = re.compile(
    r"\.normal\(|standard_normal|\.rvs\(|scipy\.stats|from scipy import stats|random\.gauss|normalvariate"
)
#: (file, reason) pairs allowed to match; none today: nothing in privacy_wall draws float normal noise.
ALLOWED: dict[str, str] = {}


def test_no_float_normal_sampler_in_the_privacy_wall() -> None:
    """No code of the privacy_wall package calls a floating-point normal sampler: every noise draw is the
    exact discrete Gaussian (comments and docstrings may name them; code may not)."""
    root = Path(privacy_wall.__file__).parent
    found = []
    for path in sorted(root.rglob("*.py")):
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            code = line.split("#", 1)[0]
            if FLOAT_SAMPLERS.search(code) and str(path.relative_to(root)) not in ALLOWED:
                found.append(f"{path.relative_to(root)}:{number}: {line.strip()}")
    assert not found, "float normal samplers in the privacy wall:\n" + "\n".join(found)
    assert FLOAT_SAMPLERS.search("noise = rng.normal(0.0, std, size=shape)")  # the check can fire
