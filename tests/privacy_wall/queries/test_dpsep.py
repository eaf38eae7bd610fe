"""DP-SEP's moment matching behind the wall: the query contract for the logistic and the Gaussian likelihood,
plus checks of the moment matching itself against an independent per-record computation."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest
from scipy import integrate
from scipy.special import expit

from privacy_wall.data.store import Batch, InMemoryTabularStore, RowStore
from privacy_wall.noise.mechanisms import upper_triangle
from privacy_wall.queries.dpsep import (
    BLOCK,
    GRADIENT_SCALE,
    LOGISTIC_SITE_PRECISION_BOUND,
    NORMAL_GAMMA_SITE_BOUND,
    DpSepLinearQuery,
    DpSepLogisticQuery,
    DpSepNormalGammaQuery,
    logistic_centred_sites,
    logistic_log_partition_derivatives,
    logistic_sites,
)
from privacy_wall.queries.linreg import LinearRegressionQuery, joint_second_moment
from tests.contracts import Params, QueryContract, QueryModeContract
from tests.privacy_wall.queries.test_linreg import (
    regression_extremes,
    regression_out_of_bounds,
    regression_rows,
    regression_store,
)

# The extreme public parameters overflow on purpose; numpy's warnings about it are expected.
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")

D = 3

#: Finite, symmetric, PSD in exact arithmetic, and x^T Sigma x overflows for ordinary unit-norm rows.
OVERFLOWING = 1.5e308 * np.ones((D, D))


def unit(vector: list[float]) -> np.ndarray:
    v = np.asarray(vector, dtype=np.float64)
    return v / np.linalg.norm(v)


def record(x: np.ndarray, y: float) -> Batch:
    return Batch(np.asarray(x, dtype=np.float64).reshape(1, -1), np.array([float(y)]))


def cavity(mean: np.ndarray | list[float], covariance: np.ndarray) -> Params:
    return {"cavity_mean": np.asarray(mean, dtype=np.float64), "cavity_covariance": covariance}


def pack(statistics: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Post-processed statistics back in block coordinates."""
    return {
        BLOCK: np.concatenate([statistics["precision_times_mean"], upper_triangle(statistics["precision"])])
    }


def unit_rows(rng: np.random.Generator, size: int, labels: np.ndarray) -> Batch:
    directions = rng.normal(size=(size, D))
    return Batch(directions / np.linalg.norm(directions, axis=1, keepdims=True), labels)


def assert_precision_far_from_the_psd_boundary(exact_means: dict[str, np.ndarray], std: float) -> None:
    """Mirroring + PSD projection is the identity when the noised site precision stays positive definite.

    The mirrored noise matrix has d(d+1)/2 distinct N(0, std^2) entries; all have |z| < 7 except with
    probability < 2000 releases * 6 * 2.6e-12, and then ||E||_2 <= ||E||_F < 7 std d. The exact precision's
    smallest eigenvalue must exceed that (asked: by a factor 2).
    """
    precision = np.zeros((D, D))
    precision[np.triu_indices(D)] = exact_means[BLOCK][D:]
    precision = precision + np.triu(precision, 1).T
    smallest = float(np.linalg.eigvalsh(precision)[0])
    assert smallest > 2 * 7 * std * D, (smallest, std)


class TestDpSepLogisticQuery(QueryContract):
    dimension = D
    clip = 0.5

    def make_query(self) -> DpSepLogisticQuery:
        return DpSepLogisticQuery(self.clip)

    def make_batch(self, rng: np.random.Generator, size: int) -> Batch:
        directions = rng.normal(size=(size, D))
        directions /= np.linalg.norm(directions, axis=1, keepdims=True)
        radii = np.where(rng.random(size) < 0.3, 1.0, rng.random(size))
        labels = (rng.random(size) < 0.5).astype(np.float64)
        return Batch(directions * radii[:, None], labels)

    def random_record(self, rng: np.random.Generator) -> Batch:
        return self.make_batch(rng, 1)

    def make_params(self, rng: np.random.Generator) -> list[Params]:
        factor = rng.normal(size=(D, D))
        return [
            cavity(np.zeros(D), np.eye(D)),  # the prior N(0, I): the first iteration
            cavity(np.zeros(D), np.zeros((D, D))),  # a point mass at 0: sites (+-1/2, 1/4) along x
            cavity(rng.normal(scale=3.0, size=D), factor @ factor.T / 50),  # a posterior-like cavity
            cavity([20.0, 0.0, 0.0], 1e-4 * np.eye(D)),  # confident: records along e1 are (mis)classified
            cavity([-30.0, 5.0, 0.0], np.diag([1e6, 1e-8, 0.0])),  # huge and vanishing variances
            cavity(np.zeros(D), np.array([[1.0, 2.0, 0.0], [2.0, -5.0, 0.0], [0.0, 0.0, -1.0]])),  # not PSD
            cavity(np.full(D, 1e300), OVERFLOWING),
        ]

    def adversarial_records(self, params: Params) -> list[Batch]:
        covariance = params["cavity_covariance"]
        scale = float(np.max(np.abs(covariance))) or 1.0
        _, vectors = np.linalg.eigh(covariance / scale / 2 + covariance.T / scale / 2)
        mean = params["cavity_mean"]
        along_mean = mean / np.linalg.norm(mean) if np.linalg.norm(mean) > 0 else np.eye(D)[0]
        directions = [
            along_mean,
            -along_mean,
            vectors[:, -1],
            vectors[:, 0],
            *np.eye(D),
            *(-np.eye(D)),
            unit([1.0, 1.0, 0.0]),
            unit([1.0, -1.0, 1.0]),
            np.zeros(D),
        ]
        return [record(x, y) for x in directions for y in (0.0, 1.0)]

    def out_of_bound_records(self, rng: np.random.Generator) -> list[Batch]:
        return [
            record(5 * unit(rng.normal(size=D)), 1.0),
            record(5 * np.eye(D)[0], 0.0),
            record(1e6 * unit([1.0, -2.0, 0.5]), 1.0),
            record(np.eye(D)[1], 3.0),
            record(np.eye(D)[2], -2.0),
            record(40 * np.eye(D)[2], 0.5),
            record(1e160 * np.eye(D)[0], 0.0),  # ||x||^2 overflows
            record(1e160 * unit([1.0, 1.0, 1.0]), 1.0),
        ]

    def malformed_params(self) -> list[Params]:
        good = cavity(np.zeros(D), np.eye(D))
        return [
            {},
            {"cavity_mean": np.zeros(D)},
            {**good, "second_moment": np.eye(D)},
            cavity(np.zeros(D + 1), np.eye(D)),
            cavity(np.zeros(D), np.eye(D + 1)),
            cavity(np.zeros(D), np.ones(D)),
            cavity([np.nan, 0.0, 0.0], np.eye(D)),
            cavity(np.zeros(D), np.diag([1.0, np.inf, 1.0])),
            {"cavity_mean": np.array(["a", "b", "c"]), "cavity_covariance": np.eye(D)},
        ]

    def expected_sensitivities(self, batch_size: int) -> dict[str, float]:
        # One signed block, each record's natural parameters clipped to C: Delta = 2 C / S (Prop. 1 with
        # the damping as post-processing; privacy_wall.queries.dpsep).
        return {BLOCK: 2.0 * self.clip / batch_size}

    def make_store(self, name: str, rows: Batch, *, public: bool) -> RowStore:
        assert rows.labels is not None
        return InMemoryTabularStore(name, rows.features, rows.labels, public=public)

    def calibration_rows(self, rng: np.random.Generator) -> Batch:
        labels = (rng.random(self.calibration_population) < 0.5).astype(np.float64)
        return unit_rows(rng, self.calibration_population, labels)

    def calibration_params(self) -> Params:
        return cavity(np.zeros(D), np.eye(D))

    def check_postprocess_inactive(
        self, exact_means: dict[str, np.ndarray], noise_std: dict[str, float]
    ) -> None:
        assert_precision_far_from_the_psd_boundary(exact_means, noise_std[BLOCK])

    def released_blocks(self, statistics: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return pack(statistics)


class TestDpSepCentredLogisticQuery(QueryModeContract, TestDpSepLogisticQuery):
    """The centred release (noise-aware mode): the same contract, sensitivity 2 C / S included, with the
    adversarial records and extreme cavities of the paper's release."""

    def make_query(self) -> DpSepLogisticQuery:
        return DpSepLogisticQuery(self.clip, centred=True)

    def released_blocks(self, statistics: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        gradient = GRADIENT_SCALE * statistics["gradient"]
        return {BLOCK: np.concatenate([gradient, upper_triangle(statistics["precision"])])}


def test_centred_sites_are_the_paper_sites_less_the_cavity_mean_term() -> None:
    """alpha - beta m = g (1 + v beta) on a wide grid (extremes included, finite), and without clipping the
    centred release's gradient plus Lambda mu_c is the paper's eta: the same site, another coordinate."""
    m = np.repeat(np.array([-50.0, -3.0, 0.0, 2.0, 40.0]), 5)
    v = np.tile(np.array([0.0, 1e-3, 1.0, 30.0, 1e4]), 5)
    for y in (0.0, 1.0):
        labels = np.full(m.shape, y)
        alpha, beta = logistic_sites(labels, m, v)
        gradient, centred_beta = logistic_centred_sites(labels, m, v)
        assert np.isfinite(gradient).all()
        np.testing.assert_array_equal(centred_beta, beta)
        np.testing.assert_allclose(gradient + m * beta, alpha, rtol=1e-12, atol=1e-12)
    rng = np.random.default_rng(402)
    batch = TestDpSepLogisticQuery().make_batch(rng, 50)
    params = cavity(rng.normal(scale=1.5, size=D), np.diag([0.5, 0.2, 0.8]))
    paper = DpSepLogisticQuery(100.0)
    centred = DpSepLogisticQuery(100.0, centred=True)
    eta = paper.postprocess(paper.clipped_sums(batch, params, rng), D)
    released = centred.postprocess(centred.clipped_sums(batch, params, rng), D)
    np.testing.assert_allclose(released["precision"], eta["precision"], rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(
        released["gradient"] + released["precision"] @ params["cavity_mean"],
        eta["precision_times_mean"],
        rtol=1e-10,
        atol=1e-12,
    )


class TestDpSepLinearQuery(QueryContract):
    """Gaussian likelihood with tau = 2 and C = 1 < sqrt(2) tau: records near the bounds are clipped."""

    dimension = D
    clip = 1.0
    noise_precision = 2.0

    def make_query(self) -> DpSepLinearQuery:
        return DpSepLinearQuery(self.clip, self.noise_precision)

    def make_batch(self, rng: np.random.Generator, size: int) -> Batch:
        return regression_rows(rng, size, D)

    def random_record(self, rng: np.random.Generator) -> Batch:
        return self.make_batch(rng, 1)

    def make_params(self, rng: np.random.Generator) -> list[Params]:
        # The exact Gaussian site does not depend on the cavity; these only check that nothing breaks.
        return [
            cavity(np.zeros(D), np.eye(D)),
            cavity(rng.normal(size=D), np.zeros((D, D))),
            cavity(np.full(D, 1e300), OVERFLOWING),
        ]

    def adversarial_records(self, params: Params) -> list[Batch]:
        # (e_1, 1) -> (e_1, -1): sites (tau e_1, tau e_1 e_1^T) and (-tau e_1, tau e_1 e_1^T), both clipped to
        # norm C, differ by sqrt(2) C, 0.71 of Delta = 2 C / S.
        return regression_extremes()

    def out_of_bound_records(self, rng: np.random.Generator) -> list[Batch]:
        return regression_out_of_bounds(rng)

    def malformed_params(self) -> list[Params]:
        return [{}, cavity(np.zeros(D), np.eye(D + 1)), cavity([np.inf, 0.0, 0.0], np.eye(D))]

    def expected_sensitivities(self, batch_size: int) -> dict[str, float]:
        return {BLOCK: 2.0 * self.clip / batch_size}

    def make_store(self, name: str, rows: Batch, *, public: bool) -> RowStore:
        assert rows.labels is not None
        return regression_store(name, rows.features, rows.labels, public=public)

    def calibration_rows(self, rng: np.random.Generator) -> Batch:
        labels = np.where(rng.random(self.calibration_population) < 0.5, -1.0, 1.0)
        return unit_rows(rng, self.calibration_population, labels)

    def calibration_params(self) -> Params:
        return cavity(np.zeros(D), np.eye(D))

    def check_postprocess_inactive(
        self, exact_means: dict[str, np.ndarray], noise_std: dict[str, float]
    ) -> None:
        assert_precision_far_from_the_psd_boundary(exact_means, noise_std[BLOCK])

    def released_blocks(self, statistics: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return pack(statistics)


class TestDpSepNormalGammaQuery(QueryContract):
    """Normal-Gamma sites P(z z^T), z = (x, y), with C = 1 < sqrt(3): records near the bounds are clipped."""

    dimension = D
    clip = 1.0

    def make_query(self) -> DpSepNormalGammaQuery:
        return DpSepNormalGammaQuery(self.clip)

    def make_batch(self, rng: np.random.Generator, size: int) -> Batch:
        return regression_rows(rng, size, D)

    def random_record(self, rng: np.random.Generator) -> Batch:
        return self.make_batch(rng, 1)

    def make_params(self, rng: np.random.Generator) -> list[Params]:
        return [{}]  # the exact site does not depend on the cavity

    def adversarial_records(self, params: Params) -> list[Batch]:
        # Orthogonal z = (e_i, 0) -> (e_j, 0) or (0, +-1): packed triangles of norm 1 = C and inner product 0,
        # so the sum moves by sqrt(2) C, the whole Delta; (e_1, 1) -> (e_1, -1) moves only the y x part.
        return regression_extremes()

    def out_of_bound_records(self, rng: np.random.Generator) -> list[Batch]:
        return regression_out_of_bounds(rng)

    def malformed_params(self) -> list[Params]:
        return [cavity(np.zeros(D), np.eye(D)), {"cavity_mean": np.zeros(D)}]

    def expected_sensitivities(self, batch_size: int) -> dict[str, float]:
        # One PSD block (z z^T's triangle) of per-record norm <= C: sqrt(2) C / S.
        return {BLOCK: math.sqrt(2.0) * self.clip / batch_size}

    def make_store(self, name: str, rows: Batch, *, public: bool) -> RowStore:
        assert rows.labels is not None
        return regression_store(name, rows.features, rows.labels, public=public)

    def calibration_rows(self, rng: np.random.Generator) -> Batch:
        # Unit rows and labels +-1: ||P(z z^T)|| is in [1.63, sqrt(3)], so every record is scaled by a factor
        # in [0.57, 0.61], and the mean of z z^T is ~ 0.6 diag(1/3, 1/3, 1/3, 1), far from the PSD boundary.
        labels = np.where(rng.random(self.calibration_population) < 0.5, -1.0, 1.0)
        return unit_rows(rng, self.calibration_population, labels)

    def calibration_params(self) -> Params:
        return {}

    def check_postprocess_inactive(
        self, exact_means: dict[str, np.ndarray], noise_std: dict[str, float]
    ) -> None:
        """Mirroring + projection is the identity when the noised (D + 1) x (D + 1) matrix stays positive
        definite: its (D + 1)(D + 2) / 2 distinct noise entries have |z| < 7 except with probability
        < 2000 * 10 * 2.6e-12, and then ||E||_2 <= ||E||_F < 7 std (D + 1); asked: by a factor 2."""
        joint = np.zeros((D + 1, D + 1))
        joint[np.triu_indices(D + 1)] = exact_means[BLOCK]
        joint = joint + np.triu(joint, 1).T
        assert float(np.linalg.eigvalsh(joint)[0]) > 2 * 7 * noise_std[BLOCK] * (D + 1)

    def released_blocks(self, statistics: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        joint = joint_second_moment(statistics["xx"], statistics["yx"], float(statistics["yy"][0]))
        return {BLOCK: upper_triangle(joint)}


def test_normal_gamma_sites_are_the_data_statistics_when_nothing_is_clipped() -> None:
    """With C = sqrt(3), the largest ||P(z z^T)|| within the bounds, the released sums are VIPS-linreg's
    sum x x^T, sum y x and sum y^2 exactly; with C = 1 every record's contribution has norm <= C, and is
    unscaled exactly when its own norm is <= C."""
    rng = np.random.default_rng(402)
    batch = regression_rows(rng, 300, D)
    assert batch.labels is not None
    whole = DpSepNormalGammaQuery(NORMAL_GAMMA_SITE_BOUND)
    released = whole.postprocess({BLOCK: whole.clipped_sums(batch, {}, rng)[BLOCK]}, D)
    statistics = LinearRegressionQuery().clipped_sums(batch, {}, rng)
    np.testing.assert_allclose(upper_triangle(released["xx"]), statistics["xx"], rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(released["yx"], statistics["yx"], rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(released["yy"], statistics["yy"], rtol=1e-10)
    clipped = DpSepNormalGammaQuery(1.0)
    scaled = 0
    for n in range(batch.size):
        one = Batch(batch.features[n : n + 1], batch.labels[n : n + 1])
        z = np.append(one.features[0], one.labels[0])
        site = upper_triangle(np.outer(z, z))
        contribution = clipped.clipped_sums(one, {}, rng)[BLOCK]
        assert np.linalg.norm(contribution) <= 1.0 + 1e-12
        if np.linalg.norm(site) <= 1.0:
            np.testing.assert_allclose(contribution, site, rtol=1e-12, atol=1e-15)
        else:
            scaled += 1
            np.testing.assert_allclose(contribution, site / np.linalg.norm(site), rtol=1e-10, atol=1e-15)
    assert 30 < scaled < 270


def test_normal_gamma_postprocess_projects_the_joint_second_moment() -> None:
    """A heavily noised mean of z z^T comes out PSD (so the posterior's Gamma rate stays >= b0) and split
    into xx, yx and yy."""
    rng = np.random.default_rng(403)
    query = DpSepNormalGammaQuery(1.0)
    for _ in range(20):
        out = query.postprocess({BLOCK: rng.normal(size=(D + 1) * (D + 2) // 2)}, D)
        joint = joint_second_moment(out["xx"], out["yx"], float(out["yy"][0]))
        assert float(np.linalg.eigvalsh(joint)[0]) >= -1e-12
        assert out["xx"].shape == (D, D) and out["yx"].shape == (D,) and out["yy"].shape == (1,)


# --------------------------------------------------------------------------------------------------------
# The moment matching itself.


def tilted_expectation(fn: Callable[[float], float], y: float, m: float, v: float) -> float:
    """E~[fn(a)] under the tilted density N(a; m, v) sigmoid(s a) / Z, s = 2y - 1, by adaptive quadrature
    (scipy.integrate.quad over m +- 40 sd, split at the sigmoid's centre 0)."""
    s = 1.0 if y > 0.5 else -1.0
    sd = math.sqrt(v)
    lo, hi = m - 40 * sd, m + 40 * sd
    points = [0.0] if lo < 0 < hi else None

    def weight(a: float) -> float:  # scaled by sigmoid(s m)'s inverse so it does not underflow
        log_w = (
            -((a - m) ** 2) / (2 * v) - float(np.logaddexp(0.0, -s * a)) + float(np.logaddexp(0.0, -s * m))
        )
        return math.exp(log_w)

    options = {"epsabs": 0.0, "epsrel": 1e-11, "limit": 500, "points": points}
    numerator, _ = integrate.quad(lambda a: fn(a) * weight(a), lo, hi, **options)  # type: ignore[arg-type]
    denominator, _ = integrate.quad(weight, lo, hi, **options)  # type: ignore[arg-type]
    return float(numerator / denominator)


def tilted_moments_by_quad(y: float, m: float, v: float) -> tuple[float, float]:
    """Mean and variance of the tilted density N(a; m, v) sigmoid(s a) / Z."""
    mean = tilted_expectation(lambda a: a, y, m, v)
    return mean, tilted_expectation(lambda a: (a - mean) ** 2, y, m, v)


def test_logistic_derivatives_match_adaptive_quadrature() -> None:
    """g and h of log Z by 64-node Gauss-Hermite against adaptive quadrature of the same tilted expectations
    (g = E~[s sigmoid(-s a)], h = Var~[sigmoid(-s a)] - E~[sigmoid(a) sigmoid(-a)]), for cavity variances
    v <= 3 along x (the prior N(0, I) gives v = ||x||^2 <= 1): observed < 5e-10, asked 1e-8."""
    for y in (0.0, 1.0):
        s = 1.0 if y > 0.5 else -1.0
        for m in (-30.0, -8.0, -2.0, 0.0, 0.5, 3.0, 10.0, 30.0):
            for v in (1e-3, 0.1, 1.0, 3.0):
                g, h = logistic_log_partition_derivatives(np.array([y]), np.array([m]), np.array([v]))
                g_ref = s * tilted_expectation(lambda a, s=s: float(expit(-s * a)), y, m, v)
                second = tilted_expectation(lambda a, s=s: float(expit(-s * a)) ** 2, y, m, v)
                curvature = tilted_expectation(lambda a: float(expit(a) * expit(-a)), y, m, v)
                h_ref = second - g_ref**2 - curvature
                assert abs(g[0] - g_ref) < 1e-8, (y, m, v, g[0], g_ref)
                assert abs(h[0] - h_ref) < 1e-8, (y, m, v, h[0], h_ref)


def test_logistic_sites_are_moment_matching() -> None:
    """The site along x, (alpha, beta), makes cavity * site have the tilted mean and variance:
    1 / v_tilted = 1 / v + beta and m_tilted / v_tilted = m / v + alpha (EP's moment matching), for cavity
    variances where 1 / v_tilted - 1 / v is well conditioned (v >= 0.05); observed relative error < 1e-9."""
    for y in (0.0, 1.0):
        for m in (-6.0, -1.0, 0.0, 0.7, 4.0):
            for v in (0.05, 0.3, 1.0, 2.5):
                alpha, beta = logistic_sites(np.array([y]), np.array([m]), np.array([v]))
                mean, variance = tilted_moments_by_quad(y, m, v)
                assert beta[0] == pytest.approx(1 / variance - 1 / v, rel=1e-6, abs=1e-9), (y, m, v)
                assert alpha[0] == pytest.approx(mean / variance - m / v, rel=1e-6, abs=1e-9), (y, m, v)


def test_logistic_site_precision_is_within_its_bound() -> None:
    """0 <= beta <= 1/4 (log-concave likelihood of curvature <= 1/4) on a wide grid, extremes included, and
    the sites are finite; at a point-mass cavity the site is the Laplace one (y - sigmoid(m) + m beta,
    sigmoid(m) sigmoid(-m))."""
    m = np.repeat(np.array([-1e8, -50.0, -3.0, 0.0, 2.0, 40.0, 1e8]), 7)
    v = np.tile(np.array([0.0, 1e-12, 1e-3, 1.0, 30.0, 1e4, 1e8]), 7)
    for y in (0.0, 1.0):
        alpha, beta = logistic_sites(np.full(m.shape, y), m, v)
        assert np.isfinite(alpha).all() and np.isfinite(beta).all()
        assert np.all(beta >= 0) and np.all(beta <= LOGISTIC_SITE_PRECISION_BOUND)
    point = np.array([-2.0, 0.0, 1.5])
    alpha, beta = logistic_sites(np.ones(3), point, np.zeros(3))
    np.testing.assert_allclose(beta, expit(point) * expit(-point), rtol=1e-12)
    np.testing.assert_allclose(alpha, 1 - expit(point) + point * beta, rtol=1e-12)


def test_clipped_sums_equal_a_per_record_computation() -> None:
    """The vectorised query against a loop over records: tilted moments by adaptive quadrature, the site
    (alpha x, beta x x^T), its natural parameters' norm clipped to C, summed (C = 0.5 clips ~ half of
    them here). Agreement to 1e-6 relative (the quadrature reference's accuracy)."""
    rng = np.random.default_rng(400)
    contract = TestDpSepLogisticQuery()
    batch = contract.make_batch(rng, 40)
    assert batch.labels is not None
    params = cavity(rng.normal(scale=1.5, size=D), np.diag([0.5, 0.2, 0.8]))
    clip = 0.5
    eta, precision = np.zeros(D), np.zeros((D, D))
    clipped = 0
    for x, y in zip(batch.features, batch.labels, strict=True):
        m = float(x @ params["cavity_mean"])
        v = float(x @ params["cavity_covariance"] @ x)
        mean, variance = tilted_moments_by_quad(float(y), m, v)
        site_eta = (mean / variance - m / v) * x
        site_precision = (1 / variance - 1 / v) * np.outer(x, x)
        norm = math.sqrt(float(site_eta @ site_eta) + float(np.sum(site_precision**2)))
        factor = min(1.0, clip / norm)
        clipped += factor < 1
        eta += factor * site_eta
        precision += factor * site_precision
    sums = DpSepLogisticQuery(clip).clipped_sums(batch, params, rng)
    assert 5 < clipped < 35
    np.testing.assert_allclose(sums[BLOCK][:D], eta, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(sums[BLOCK][D:], upper_triangle(precision), rtol=1e-6, atol=1e-9)


def test_gaussian_sites_are_the_likelihood_whatever_the_cavity() -> None:
    """With a clip above sqrt(2) tau nothing is clipped: the sums are tau (sum y x, sum x x^T) exactly, for
    any cavity."""
    rng = np.random.default_rng(401)
    batch = regression_rows(rng, 100, D)
    assert batch.labels is not None
    tau = 4.0
    query = DpSepLinearQuery(math.sqrt(2.0) * tau, tau)
    expected = np.concatenate(
        [tau * batch.features.T @ batch.labels, upper_triangle(tau * batch.features.T @ batch.features)]
    )
    for params in (cavity(np.zeros(D), np.eye(D)), cavity(rng.normal(size=D), 0.01 * np.eye(D))):
        np.testing.assert_allclose(
            query.clipped_sums(batch, params, rng)[BLOCK], expected, rtol=1e-12, atol=1e-13
        )


def test_postprocess_splits_and_projects() -> None:
    query = DpSepLogisticQuery(1.0)
    site = np.concatenate([np.array([1.0, -2.0, 3.0]), upper_triangle(np.diag([1.0, -1.0, 2.0]))])
    out = query.postprocess({BLOCK: site}, D)
    np.testing.assert_array_equal(out["precision_times_mean"], [1.0, -2.0, 3.0])
    np.testing.assert_allclose(out["precision"], np.diag([1.0, 0.0, 2.0]), atol=1e-15)


def test_construction_is_checked() -> None:
    for clip in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="clip"):
            DpSepLogisticQuery(clip)
    with pytest.raises(ValueError, match="noise_precision"):
        DpSepLinearQuery(1.0, 0.0)
    for clip in (0.0, math.inf, True):
        with pytest.raises(ValueError, match="clip"):
            DpSepNormalGammaQuery(clip)


def test_normal_gamma_sites_warn_of_nothing_whatever_the_rows() -> None:
    """A zero row (C / tiny overflows in its clip factor) or tiny entries (their fourth powers underflow)
    must not raise a warning, whose presence would depend on the data; the sums stay finite."""
    import warnings

    rows = Batch(
        np.array([[0.0, 0.0, 0.0], [1e-160, 0.0, 1e-170], [0.6, 0.0, 0.0]]), np.array([0.0, 1e-170, 0.5])
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sums = DpSepNormalGammaQuery(1e6).clipped_sums(rows, {}, np.random.default_rng(0))
    assert np.isfinite(sums[BLOCK]).all()
