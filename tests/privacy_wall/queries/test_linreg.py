"""Bayesian linear regression's E-step behind the wall: the query contract, plus linreg-specific checks.

`regression_store` (the service's in-memory store of kind "regression") is shared with
tests/vips/models/linreg/test_model.py, tests/privacy_wall/queries/test_dpsep.py and
tests/vips/models/blr/test_dpsep.py.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.spatial.transform import Rotation

from privacy_wall.data.store import Batch, InMemoryTabularStore
from privacy_wall.noise.mechanisms import upper_triangle
from privacy_wall.queries.linreg import LinearRegressionQuery
from tests.contracts import (
    Params,
    QueryContract,
    interval,
    normalised_joint_move,
    search_joint_sensitivity,
)

D = 3


def regression_store(
    name: str, features: np.ndarray, labels: np.ndarray, *, public: bool
) -> InMemoryTabularStore:
    """The service's in-memory store for regression rows (||x|| <= 1, real targets |y| <= 1, checked)."""
    return InMemoryTabularStore(name, features, labels, public=public, kind="regression")


def unit(vector: list[float]) -> np.ndarray:
    v = np.asarray(vector, dtype=np.float64)
    return v / np.linalg.norm(v)


def record(x: np.ndarray, y: float) -> Batch:
    return Batch(np.asarray(x, dtype=np.float64).reshape(1, -1), np.array([float(y)]))


def regression_rows(rng: np.random.Generator, size: int, dimension: int) -> Batch:
    """Rows in random directions (30% exactly on the unit sphere), labels uniform in [-1, 1] (10% at +-1)."""
    directions = rng.normal(size=(size, dimension))
    directions /= np.linalg.norm(directions, axis=1, keepdims=True)
    radii = np.where(rng.random(size) < 0.3, 1.0, rng.random(size))
    labels = rng.uniform(-1.0, 1.0, size)
    labels = np.where(rng.random(size) < 0.1, np.sign(labels), labels)
    return Batch(directions * radii[:, None], labels)


def regression_extremes() -> list[Batch]:
    """Records at the ingestion bounds' corners: axes, diagonals and 0, with labels -1, 0 and 1."""
    directions = [*np.eye(D), unit([1.0, 1.0, 0.0]), unit([1.0, -1.0, 1.0]), np.zeros(D)]
    return [record(x, y) for x in directions for y in (-1.0, 0.0, 1.0)]


def regression_out_of_bounds(rng: np.random.Generator) -> list[Batch]:
    """Records beyond the ingestion bounds (only reachable by building a Batch directly)."""
    return [
        record(5 * unit(rng.normal(size=D)), 1.0),
        record(np.eye(D)[0], 40.0),
        record(1e6 * unit([1.0, -2.0, 0.5]), -1e6),
        record(np.zeros(D), 7.0),
        record(1e160 * np.eye(D)[0], 0.0),  # ||x||^2 overflows
    ]


class TestLinregQuery(QueryContract):
    dimension = D

    def make_query(self) -> LinearRegressionQuery:
        return LinearRegressionQuery()

    def make_batch(self, rng: np.random.Generator, size: int) -> Batch:
        return regression_rows(rng, size, D)

    def random_record(self, rng: np.random.Generator) -> Batch:
        return self.make_batch(rng, 1)

    def make_params(self, rng: np.random.Generator) -> list[Params]:
        return [{}]  # the E-step of a conjugate model without latent variables has no public parameters

    def adversarial_records(self, params: Params) -> list[Batch]:
        # x x^T: e_i -> e_j moves one diagonal packed coordinate down by 1 and another up by 1 (sqrt(2) C);
        # y x: (e_1, 1) -> (e_1, -1) moves it by 2 C; y^2: 0 -> 1 moves it by C (1/sqrt(2) of its Delta).
        return regression_extremes()

    def out_of_bound_records(self, rng: np.random.Generator) -> list[Batch]:
        return [
            *regression_out_of_bounds(rng),
            record(3 * np.eye(D)[1], -3.0),
            record(1e160 * unit([1.0, 1.0, 1.0]), 0.5),
        ]

    def malformed_params(self) -> list[Params]:
        return [{"second_moment": np.eye(D)}, {"cavity_mean": np.zeros(D)}]

    def expected_sensitivities(self, batch_size: int) -> dict[str, float]:
        # xx (C = 1, PSD) sqrt(2)/S; yx (C = 1, signed) 2/S; yy (C = 1, non-negative) sqrt(2)/S.
        return {
            "xx": math.sqrt(2.0) / batch_size,
            "yx": 2.0 / batch_size,
            "yy": math.sqrt(2.0) / batch_size,
        }

    def make_store(self, name: str, rows: Batch, *, public: bool) -> InMemoryTabularStore:
        assert rows.labels is not None
        return regression_store(name, rows.features, rows.labels, public=public)

    def calibration_rows(self, rng: np.random.Generator) -> Batch:
        # Unit-norm rows in random directions and labels +-1 independent of them: the joint second moment
        # <[x; y][x; y]^T> is ~diag(1/3, 1/3, 1/3, 1), far from the PSD cone's boundary.
        directions = rng.normal(size=(self.calibration_population, D))
        directions /= np.linalg.norm(directions, axis=1, keepdims=True)
        labels = np.where(rng.random(self.calibration_population) < 0.5, -1.0, 1.0)
        return Batch(directions, labels)

    def calibration_params(self) -> Params:
        return {}

    def check_postprocess_inactive(
        self, exact_means: dict[str, np.ndarray], noise_std: dict[str, float]
    ) -> None:
        """The joint PSD projection is the identity when the noised joint matrix stays positive definite.

        The mirrored (D + 1) x (D + 1) noise matrix has entries of std <= s = max_b noise_std[b]; all of them
        have |z| < 7 except with probability < 2000 * 10 * 2.6e-12, and then ||E||_2 <= ||E||_F < 7 s (D + 1).
        So if the exact joint matrix's smallest eigenvalue exceeds that (asked: by a factor 2), no release is
        projected.
        """
        xx = np.zeros((D, D))
        xx[np.triu_indices(D)] = exact_means["xx"]
        xx = xx + np.triu(xx, 1).T
        joint = np.block([[xx, exact_means["yx"][:, None]], [exact_means["yx"][None, :], exact_means["yy"]]])
        smallest = float(np.linalg.eigvalsh(joint)[0])
        s = max(noise_std.values())
        assert smallest > 2 * 7 * s * (D + 1), (smallest, s)

    def released_blocks(self, statistics: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {"xx": upper_triangle(statistics["xx"]), "yx": statistics["yx"], "yy": statistics["yy"]}


# --------------------------------------------------------------------------------------------------------
# Linreg-specific checks.


def test_clipped_sums_are_the_data_statistics_for_valid_rows() -> None:
    """Within the bounds clipping is a no-op: the sums are sum x x^T, sum y x and sum y^2 exactly."""
    rng = np.random.default_rng(300)
    batch = regression_rows(rng, 200, D)
    assert batch.labels is not None
    x, y = batch.features, batch.labels
    sums = LinearRegressionQuery().clipped_sums(batch, {}, rng)
    np.testing.assert_allclose(sums["xx"], upper_triangle(x.T @ x), rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(sums["yx"], x.T @ y, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(sums["yy"], [y @ y], rtol=1e-12)


def test_postprocess_keeps_the_joint_second_moment_psd() -> None:
    """Heavily noised statistics come out as a PSD joint matrix (so b_N >= b0 in the M-step); already
    consistent ones pass unchanged."""
    rng = np.random.default_rng(301)
    query = LinearRegressionQuery()
    batch = regression_rows(rng, 50, D)
    exact = {k: v / 50 for k, v in query.clipped_sums(batch, {}, rng).items()}
    unchanged = query.postprocess(exact, D)
    np.testing.assert_allclose(upper_triangle(unchanged["xx"]), exact["xx"], atol=1e-14)
    np.testing.assert_allclose(unchanged["yx"], exact["yx"], atol=1e-14)
    np.testing.assert_allclose(unchanged["yy"], exact["yy"], atol=1e-14)
    for _ in range(50):
        noised = {k: v + rng.normal(scale=1.0, size=v.shape) for k, v in exact.items()}
        out = query.postprocess(noised, D)
        joint = np.block([[out["xx"], out["yx"][:, None]], [out["yx"][None, :], out["yy"][None, :]]])
        np.testing.assert_allclose(joint, joint.T, atol=1e-12)
        assert float(np.linalg.eigvalsh(joint)[0]) >= -1e-12
        assert out["yy"].shape == (1,) and out["yx"].shape == (D,)


def test_params_must_be_empty() -> None:
    with pytest.raises(ValueError, match="no public parameters"):
        LinearRegressionQuery().validate_params({"mean": np.zeros(D)}, D)


# --------------------------------------------------------------------------------------------------------
# Joint sensitivity J = sqrt(7)/2 (module docstring of privacy_wall.queries.linreg).

JOINT = math.sqrt(7.0) / 2.0


def joint_move(x: np.ndarray, y: float, x2: np.ndarray, y2: float) -> float:
    return normalised_joint_move(LinearRegressionQuery(), record(x, y), record(x2, y2), {}, D)


def test_joint_sensitivity_equality_cases() -> None:
    """y = +-1 against y' = 0 on orthogonal unit rows along the axes reaches sqrt(7/4) exactly; the other
    vertices of the proof give 1 and 5/4; sqrt(7/4) < sqrt(3)."""
    query = LinearRegressionQuery()
    assert query.joint_sensitivity(D) == pytest.approx(JOINT, rel=1e-15)
    assert query.joint_sensitivity(D) < math.sqrt(len(query.blocks(D)))
    e1, e2 = np.eye(D)[0], np.eye(D)[1]
    for y in (1.0, -1.0):
        assert joint_move(e1, y, e2, 0.0) == pytest.approx(JOINT, rel=1e-12)
        assert joint_move(e2, 0.0, e1, y) == pytest.approx(JOINT, rel=1e-12)
    assert joint_move(e1, 0.0, e2, 0.0) == pytest.approx(1.0, rel=1e-12)
    # Both labels at +-1: the best is cosine -+1/4 between the rows, 1 + (2 + 1/2)/4 - 1/16 = 25/16.
    t = math.asin(0.25) / 2
    x, x2 = np.array([math.cos(t), math.sin(t), 0.0]), np.array([math.sin(t), math.cos(t), 0.0])
    assert joint_move(x, 1.0, x2, -1.0) == pytest.approx(1.25, rel=1e-12)
    # Orthogonal rows off the axes: x x^T - x' x'^T is off the diagonal and the packed triangle loses norm.
    assert joint_move(unit([1.0, 1.0, 0.0]), 1.0, unit([1.0, -1.0, 0.0]), 0.0) < JOINT


def linreg_replacement(theta: np.ndarray) -> float:
    """Normalised joint move of one replacement parametrised by theta (8 unconstrained coordinates): norms
    in [0, 1.5] and labels in [-1.5, 1.5] (beyond the ingestion bounds, so the record clipping is searched
    too), the angle between the rows, and a rotation of both in R^3."""
    r, r2 = interval(theta[0:2], 0.0, 1.5)
    y, y2 = interval(theta[2:4], -1.5, 1.5)
    angle = float(interval(theta[4], 0.0, math.pi))
    rotation = Rotation.from_rotvec(theta[5:8]).as_matrix()
    x = rotation @ np.array([r, 0.0, 0.0])
    x2 = rotation @ (r2 * np.array([math.cos(angle), math.sin(angle), 0.0]))
    return joint_move(x, float(y), x2, float(y2))


@pytest.mark.slow
def test_adversarial_search_reaches_but_never_exceeds_the_joint_sensitivity() -> None:
    """Random search plus Nelder-Mead over norms, labels, angles and rotations finds replacements within 1%
    of J = sqrt(7)/2, and none of the evaluations exceeds it."""
    best, evaluations = search_joint_sensitivity(
        linreg_replacement, 8, np.random.default_rng(310), starts=6, samples=2000
    )
    assert evaluations > 10_000
    assert best <= JOINT * (1 + 1e-9), f"a replacement moves the normalised blocks by {best:.9f} > J"
    assert best >= 0.99 * JOINT, f"the search reaches only {best / JOINT:.4f} of J"


def test_out_of_bound_records_are_clipped_as_records() -> None:
    """A record beyond the ingestion bounds contributes the statistics of the clipped record (x / ||x||
    when ||x|| > 1, y clipped to [-1, 1]), so the joint bound holds for it too: a long row with a small
    label does not get a full-size y x next to a small y^2."""
    sums = LinearRegressionQuery().clipped_sums(record(4 * np.eye(D)[0], 0.25), {}, np.random.default_rng(0))
    np.testing.assert_allclose(sums["xx"], upper_triangle(np.diag([1.0, 0.0, 0.0])), atol=1e-15)
    np.testing.assert_allclose(sums["yx"], [0.25, 0.0, 0.0], atol=1e-15)
    np.testing.assert_allclose(sums["yy"], [0.0625], atol=1e-15)
    sums = LinearRegressionQuery().clipped_sums(
        record(0.5 * np.eye(D)[1], -3.0), {}, np.random.default_rng(0)
    )
    np.testing.assert_allclose(sums["yx"], [0.0, -0.5, 0.0], atol=1e-15)
    np.testing.assert_allclose(sums["yy"], [1.0], atol=1e-15)
