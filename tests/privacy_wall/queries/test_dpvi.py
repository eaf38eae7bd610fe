"""DPVI's per-example gradient behind the wall: the query contract, plus DPVI-specific checks (the vectorised
gradients against per-record finite differences and against the exact expectation, clipping, finiteness
under any finite parameters, no use of the release's generator)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.special import expit, log_expit

from privacy_wall.data.store import Batch, InMemoryTabularStore, RowStore
from privacy_wall.queries.dpvi import (
    BLOCK,
    DpviLogisticRegressionQuery,
    clip_rows,
    per_example_gradients,
)
from tests.contracts import COUPLING_SEED, SENSITIVITY_SLACK, Params, QueryContract

D = 3
DRAWS = 2
#: A bound below the largest possible norm of the mean part (1/2 at mean 0, up to 1 in general), so clipping
#: is active for many records, both parts of the gradient.
CLIP = 0.3


def unit(vector: list[float]) -> np.ndarray:
    v = np.asarray(vector, dtype=np.float64)
    return v / np.linalg.norm(v)


def record(x: np.ndarray | list[float], y: float) -> Batch:
    return Batch(np.asarray(x, dtype=np.float64).reshape(1, -1), np.array([float(y)]))


def params_of(mean: np.ndarray | list[float], log_std: np.ndarray | list[float], eps: np.ndarray) -> Params:
    return {
        "mean": np.asarray(mean, dtype=np.float64),
        "log_std": np.asarray(log_std, dtype=np.float64),
        "eps": np.asarray(eps, dtype=np.float64),
    }


class TestDpviQuery(QueryContract):
    dimension = D

    def make_query(self) -> DpviLogisticRegressionQuery:
        return DpviLogisticRegressionQuery(CLIP, DRAWS)

    def make_batch(self, rng: np.random.Generator, size: int) -> Batch:
        directions = rng.normal(size=(size, D))
        directions /= np.linalg.norm(directions, axis=1, keepdims=True)
        radii = np.where(rng.random(size) < 0.3, 1.0, rng.random(size))  # many rows exactly on the sphere
        labels = (rng.random(size) < 0.5).astype(np.float64)
        return Batch(directions * radii[:, None], labels)

    def random_record(self, rng: np.random.Generator) -> Batch:
        return self.make_batch(rng, 1)

    def make_params(self, rng: np.random.Generator) -> list[Params]:
        eps = rng.normal(size=(DRAWS, D))
        return [
            params_of(np.zeros(D), np.zeros(D), eps),  # the prior N(0, I): both parts of similar size
            # A point mass at 0: r = y - 1/2 for every record, the log_std part vanishes, and the mean part
            # +-x/2 is clipped to +-CLIP x/|x|: a label flip of a unit record moves the sum by 2 CLIP.
            params_of(np.zeros(D), np.full(D, -30.0), eps),
            params_of(rng.normal(scale=3.0, size=D), rng.normal(scale=0.5, size=D), eps),
            # Very wide q: the log_std part (exp(5) |eps| |x| ~ 150) dominates and is always clipped.
            params_of(np.zeros(D), np.full(D, 5.0), eps),
            params_of(np.array([1e3, -1e3, 0.0]), np.array([-5.0, 2.0, 0.0]), np.zeros((DRAWS, D))),
            # Finite but overflowing: exp(log_std) = inf, so w_j has inf and (inf * 0 =) NaN entries.
            params_of(
                np.zeros(D), np.array([800.0, 0.0, -800.0]), np.array([[1.0, 0.0, 2.0], [0.0, 1.0, -1.0]])
            ),
            # Finite but overflowing: x^T w = inf - inf for rows with mixed signs.
            params_of(np.array([1.5e308, -1.5e308, 1.5e308]), np.zeros(D), np.full((DRAWS, D), 1e308)),
        ]

    def adversarial_records(self, params: Params) -> list[Batch]:
        # The coordinate where the log_std part exp(s_i) |eps_ji| can be largest (in logs: no overflow).
        with np.errstate(divide="ignore"):
            spread = params["log_std"] + np.log(np.max(np.abs(params["eps"]), axis=0))
        top = np.eye(D)[int(np.argmax(spread))]
        directions = [
            *np.eye(D),
            *(-np.eye(D)),
            top,
            unit([1.0, 1.0, 0.0]),
            unit([1.0, -1.0, 1.0]),
            0.5 * unit([1.0, 2.0, -1.0]),
            np.zeros(D),
        ]
        return [record(x, y) for x in directions for y in (0.0, 1.0)]

    def out_of_bound_records(self, rng: np.random.Generator) -> list[Batch]:
        return [
            record(5 * unit(list(rng.normal(size=D))), 1.0),
            record(1e6 * unit([1.0, -2.0, 0.5]), 0.0),
            record([1e300, -1e300, 1e300], 1.0),
            record(np.eye(D)[1], 3.0),
            record(np.eye(D)[2], -2.0),
            record(40 * np.eye(D)[0], 0.5),
        ]

    def malformed_params(self) -> list[Params]:
        good = params_of(np.zeros(D), np.zeros(D), np.zeros((DRAWS, D)))
        bad: list[Params] = [
            {},
            {"mean": good["mean"], "log_std": good["log_std"]},
            {**good, "second_moment": np.eye(D)},
            {"second_moment": np.eye(D)},
        ]
        for name, wrong in (
            ("mean", np.zeros(D + 1)),
            ("mean", np.zeros((D, 1))),
            ("log_std", np.zeros(D - 1)),
            ("eps", np.zeros(D)),  # one draw, but not as a (1, d) matrix
            ("eps", np.zeros((DRAWS + 1, D))),  # more draws than the query averages over
            ("eps", np.zeros((D, DRAWS))),
            ("mean", np.array([0.0, np.nan, 0.0])),
            ("log_std", np.array([0.0, np.inf, 0.0])),
            ("eps", np.full((DRAWS, D), -np.inf)),
            ("mean", np.zeros(D, dtype=np.complex128)),
            ("eps", np.zeros((DRAWS, D), dtype=bool)),
        ):
            bad.append({**good, name: wrong})  # type: ignore[dict-item]  # complex and bool on purpose
        return bad

    def expected_sensitivities(self, batch_size: int) -> dict[str, float]:
        # docs/design.md section 5: the clipped sum moves by at most 2 c_t under replace-one;
        # the mean by 2 c_t / S.
        return {BLOCK: 2.0 * CLIP / batch_size}

    def make_store(self, name: str, rows: Batch, *, public: bool) -> RowStore:
        assert rows.labels is not None
        return InMemoryTabularStore(name, rows.features, rows.labels, public=public)

    def calibration_params(self) -> Params:
        return params_of(np.zeros(D), np.full(D, -1.0), np.random.default_rng(7).normal(size=(DRAWS, D)))

    def check_postprocess_inactive(
        self, exact_means: dict[str, np.ndarray], noise_std: dict[str, float]
    ) -> None:
        """postprocess is the identity for any input, noisy or not."""
        rng = np.random.default_rng(8)
        noisy = {
            name: value + rng.normal(scale=noise_std[name], size=value.shape)
            for name, value in exact_means.items()
        }
        back = self.make_query().postprocess(noisy, D)
        assert back.keys() == noisy.keys()
        for name, value in noisy.items():
            np.testing.assert_array_equal(back[name], value, err_msg=name)


# --------------------------------------------------------------------------------------------------------
# DPVI-specific checks.


def record_objective(
    x: np.ndarray, y: float, mean: np.ndarray, log_std: np.ndarray, eps: np.ndarray
) -> float:
    """The Monte Carlo data term of one record, (1/draws) sum_j log p(y | x, w_j), w_j = m + exp(s) eps_j,
    written with scalars only (log p(y | x, w) = log sigmoid((2y - 1) x^T w))."""
    total = 0.0
    for e in eps:
        w = mean + np.exp(log_std) * e
        total += float(log_expit((2.0 * y - 1.0) * float(x @ w)))
    return total / int(eps.shape[0])


def finite_difference_gradient(
    x: np.ndarray, y: float, mean: np.ndarray, log_std: np.ndarray, eps: np.ndarray, h: float = 1e-6
) -> np.ndarray:
    """Central differences of `record_objective` w.r.t. (mean, log_std), one coordinate at a time."""
    d = mean.shape[0]
    out = np.zeros(2 * d)
    for i in range(2 * d):
        step = np.zeros(2 * d)
        step[i] = h
        up = record_objective(x, y, mean + step[:d], log_std + step[d:], eps)
        down = record_objective(x, y, mean - step[:d], log_std - step[d:], eps)
        out[i] = (up - down) / (2 * h)
    return out


def test_vectorised_gradients_equal_per_record_finite_differences() -> None:
    """Each row of the vectorised gradient is the derivative of that record's Monte Carlo data term.

    Central differences with h = 1e-6 on an objective of size O(1) and smooth derivatives of size O(1) have
    truncation error ~h^2 = 1e-12 and rounding error ~1e-16 / h = 1e-10; atol 1e-7 is 1000x that and far
    below any real mistake (a missing exp(log_std) or eps factor changes entries by O(0.1))."""
    rng = np.random.default_rng(300)
    batch = TestDpviQuery().make_batch(rng, 8)
    assert batch.labels is not None
    for draws in (1, 3):
        mean = rng.normal(scale=1.5, size=D)
        log_std = rng.normal(scale=0.5, size=D)
        eps = rng.normal(size=(draws, D))
        vectorised = per_example_gradients(batch.features, batch.labels, mean, log_std, eps)
        assert vectorised.shape == (8, 2 * D)
        for n in range(8):
            reference = finite_difference_gradient(
                batch.features[n], float(batch.labels[n]), mean, log_std, eps
            )
            np.testing.assert_allclose(vectorised[n], reference, rtol=0, atol=1e-7, err_msg=f"record {n}")


def test_clipped_sums_are_the_sum_of_per_record_clipped_gradients() -> None:
    """clipped_sums = sum_n g_n min(1, c / |g_n|), each g_n computed for its record alone and clipped with
    numpy's plain norm."""
    rng = np.random.default_rng(301)
    batch = TestDpviQuery().make_batch(rng, 50)
    assert batch.labels is not None
    for clip in (0.05, CLIP, 10.0):
        query = DpviLogisticRegressionQuery(clip, DRAWS)
        params = params_of(rng.normal(size=D), rng.normal(scale=0.5, size=D), rng.normal(size=(DRAWS, D)))
        expected = np.zeros(2 * D)
        clipped_any = False
        for n in range(batch.size):
            g = per_example_gradients(
                batch.features[n : n + 1],
                batch.labels[n : n + 1],
                params["mean"],
                params["log_std"],
                params["eps"],
            )[0]
            norm = float(np.linalg.norm(g))
            clipped_any |= norm > clip
            expected += g * min(1.0, clip / norm) if norm > 0 else g
        got = query.clipped_sums(batch, params, np.random.default_rng(0))[BLOCK]
        np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-14)
        assert clipped_any == (clip < 1.0), clip  # c = 10 never clips here; the small bounds do


def exact_data_term(x: np.ndarray, y: float, mean: np.ndarray, log_std: np.ndarray) -> float:
    """E_q[log p(y | x, w)] by Gauss-Hermite quadrature: x^T w ~ N(x^T m, sum_i x_i^2 exp(2 s_i)).

    200 nodes integrate log sigmoid (smooth, growing linearly) against a Gaussian to ~1e-12 here."""
    nodes, weights = np.polynomial.hermite_e.hermegauss(200)
    scale = math.sqrt(float(np.sum(x * x * np.exp(2 * log_std))))
    values = log_expit((2.0 * y - 1.0) * (float(x @ mean) + scale * nodes))
    return float(weights @ values / math.sqrt(2 * math.pi))


def test_gradients_are_unbiased_for_the_exact_expectation() -> None:
    """Averaged over many draws, the reparameterised gradient is the gradient of the exact data term.

    Each entry is a mean of 200,000 i.i.d. terms bounded by |x_i| (mean part) and |x_i| exp(s_i) |eps_i|
    (log_std part), with standard deviations below 0.5 here, so the Monte Carlo error has sd < 0.5 /
    sqrt(2e5) ~ 1.1e-3; atol 6e-3 is more than 5 sd (and the finite differences of the quadrature are
    accurate to ~1e-9). A wrong sign or a missing factor exp(s) eps is off by far more."""
    rng = np.random.default_rng(302)
    eps = rng.normal(size=(200_000, D))
    x = np.array([0.6, -0.5, 0.3])
    mean = np.array([1.0, 2.0, -1.0])
    log_std = np.array([-0.5, 0.3, 0.0])
    h = 1e-5
    for y in (0.0, 1.0):
        mc = per_example_gradients(x[None, :], np.array([y]), mean, log_std, eps)[0]
        reference = np.zeros(2 * D)
        for i in range(2 * D):
            step = np.zeros(2 * D)
            step[i] = h
            up = exact_data_term(x, y, mean + step[:D], log_std + step[D:])
            down = exact_data_term(x, y, mean - step[:D], log_std - step[D:])
            reference[i] = (up - down) / (2 * h)
        np.testing.assert_allclose(mc, reference, rtol=0, atol=6e-3, err_msg=f"y = {y}")


def test_clip_rows_bounds_every_row_and_keeps_short_rows() -> None:
    rows = np.array(
        [
            [0.1, 0.0, 0.0, 0.0],  # short: unchanged
            [3.0, 4.0, 0.0, 0.0],  # norm 5: scaled to the bound
            [1e300, 1e300, -1e300, 1e300],  # norm overflows in the plain formula
            [np.inf, 0.0, 0.0, 0.0],  # non-finite: contributes 0
            [np.nan, 1.0, 0.0, 0.0],
            [0.0, 0.0, 0.0, 0.0],
            [5e-324, 0.0, 0.0, 0.0],  # subnormal
        ]
    )
    clipped = clip_rows(rows, 1.0)
    norms = np.linalg.norm(clipped, axis=1)
    assert np.isfinite(clipped).all()
    assert np.all(norms <= 1.0 * (1 + SENSITIVITY_SLACK))
    np.testing.assert_array_equal(clipped[0], rows[0])
    np.testing.assert_allclose(clipped[1], [0.6, 0.8, 0.0, 0.0], rtol=1e-15)
    np.testing.assert_allclose(clipped[2], [0.5, 0.5, -0.5, 0.5], rtol=1e-15)
    np.testing.assert_array_equal(clipped[3:6], 0.0)
    np.testing.assert_array_equal(clipped[6], rows[6])


def test_sums_are_finite_and_bounded_under_any_finite_params() -> None:
    """Random finite parameters over many orders of magnitude: every release is finite and each record's
    clipped contribution has norm <= c, so the sum over S records has norm <= S c."""
    rng = np.random.default_rng(303)
    query = DpviLogisticRegressionQuery(CLIP, DRAWS)
    contract = TestDpviQuery()
    batch = contract.make_batch(rng, 40)
    for _ in range(200):
        magnitude = 10.0 ** rng.uniform(-3, 308, size=3)
        params = params_of(
            rng.normal(size=D) * magnitude[0],
            rng.normal(size=D) * min(magnitude[1], 1e3),
            rng.normal(size=(DRAWS, D)) * magnitude[2],
        )
        query.validate_params(params, D)
        total = query.clipped_sums(batch, params, np.random.default_rng(0))[BLOCK]
        assert np.isfinite(total).all()
        assert np.linalg.norm(total) <= batch.size * CLIP * (1 + SENSITIVITY_SLACK)


def test_clipped_sums_do_not_use_the_generator() -> None:
    """The reparameterisation noise is a public parameter: the wall's query draws nothing from the release's
    generator (its state is unchanged) and gives the same sums for any generator."""
    rng = np.random.default_rng(304)
    query = DpviLogisticRegressionQuery(CLIP, DRAWS)
    batch = TestDpviQuery().make_batch(rng, 30)
    params = TestDpviQuery().make_params(rng)[0]
    generator = np.random.default_rng(COUPLING_SEED)
    before = generator.bit_generator.state
    first = query.clipped_sums(batch, params, generator)[BLOCK]
    assert generator.bit_generator.state == before
    second = query.clipped_sums(batch, params, np.random.default_rng(12345))[BLOCK]
    np.testing.assert_array_equal(first, second)


def test_queries_never_modify_the_batch_or_params() -> None:
    rng = np.random.default_rng(305)
    query = DpviLogisticRegressionQuery(CLIP, DRAWS)
    batch = TestDpviQuery().make_batch(rng, 20)
    assert batch.labels is not None
    params = TestDpviQuery().make_params(rng)[2]
    copies = (batch.features.copy(), batch.labels.copy(), {k: v.copy() for k, v in params.items()})
    query.clipped_sums(batch, params, rng)
    np.testing.assert_array_equal(batch.features, copies[0])
    np.testing.assert_array_equal(batch.labels, copies[1])
    for name, value in params.items():
        np.testing.assert_array_equal(value, copies[2][name])


def test_constructor_refuses_bad_arguments() -> None:
    for clip in (0.0, -1.0, math.inf, math.nan, True):
        with pytest.raises(ValueError, match="clip"):
            DpviLogisticRegressionQuery(clip)
    for draws in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="draws"):
            DpviLogisticRegressionQuery(1.0, draws)  # type: ignore[arg-type]
    query = DpviLogisticRegressionQuery(2, 3)
    assert query.clip == 2.0 and query.draws == 3 and query.name == "dpvi"


def test_validation_errors_name_the_parameter_not_values() -> None:
    query = DpviLogisticRegressionQuery(CLIP, DRAWS)
    good = params_of(np.zeros(D), np.zeros(D), np.zeros((DRAWS, D)))
    secret = 123.456789
    for name in ("mean", "log_std", "eps"):
        wrong = np.full(good[name].shape, np.nan)
        wrong.flat[0] = secret
        with pytest.raises(ValueError, match=name) as error:
            query.validate_params({**good, name: wrong}, D)
        assert "123.45" not in str(error.value)


def test_unlabelled_rows_are_refused() -> None:
    query = DpviLogisticRegressionQuery(CLIP, DRAWS)
    params = params_of(np.zeros(D), np.zeros(D), np.zeros((DRAWS, D)))
    with pytest.raises(ValueError, match="labelled"):
        query.clipped_sums(Batch(np.zeros((4, D))), params, np.random.default_rng(0))


def test_mean_part_matches_the_closed_form_logistic_gradient() -> None:
    """At a point mass (log_std -> -inf) every draw is w = m: the mean part is (y - sigmoid(x^T m)) x, the
    logistic-regression gradient, and the log_std part is 0."""
    rng = np.random.default_rng(306)
    batch = TestDpviQuery().make_batch(rng, 25)
    assert batch.labels is not None
    mean = rng.normal(scale=2.0, size=D)
    g = per_example_gradients(batch.features, batch.labels, mean, np.full(D, -800.0), rng.normal(size=(4, D)))
    expected = (batch.labels - expit(batch.features @ mean))[:, None] * batch.features
    np.testing.assert_allclose(g[:, :D], expected, rtol=1e-13, atol=1e-15)
    np.testing.assert_array_equal(g[:, D:], 0.0)
