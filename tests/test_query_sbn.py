"""The sigmoid belief network's E-step behind the wall: the query contract, plus SBN-specific checks."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

import privacy_wall.queries.sbn as sbn_query
from privacy_wall.mechanisms import upper_triangle
from privacy_wall.queries.sbn import PG_CENTRE, SigmoidBeliefNetworkQuery, hidden_posterior
from privacy_wall.store import Batch, InMemoryBinaryStore, RowStore
from tests.contracts import Params, QueryContract

J = 4  # visible units (the data dimension)
K = 3  # hidden units
INNER = 5


def augmented_outer(w: np.ndarray, c: np.ndarray) -> np.ndarray:
    """<w^_j w^_j^T> of a point mass at (w_j, c_j): J x (K + 1) x (K + 1)."""
    aug = np.concatenate([w, c[:, None]], axis=1)
    outer: np.ndarray = aug[:, :, None] * aug[:, None, :]
    return outer


def params_of(b: np.ndarray, w: np.ndarray, c: np.ndarray, covariance: np.ndarray | None = None) -> Params:
    moment = augmented_outer(w, c)
    if covariance is not None:
        moment = moment + covariance
    return {"b_mean": np.asarray(b, dtype=np.float64), "w_mean": w, "second_moment": moment}


def saturating_params(a: float) -> Params:
    """W = a, c = -K a, no posterior variance: psi = 0 (xi = 1/4) exactly when z = 1, and psi = -K a
    (xi ~ 1 / (2 K a)) when z = 0. The all-ones image drives every r_k to 1, the all-zeros image most of
    them to 0, so s1, s4, s5 and s7 swing between (nearly) their largest and smallest contributions."""
    return params_of(np.zeros(K), np.full((J, K), a), np.full(J, -K * a))


def record(y: np.ndarray | list[float]) -> Batch:
    return Batch(np.asarray(y, dtype=np.float64).reshape(1, -1))


def pack_blocks(statistics: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Post-processed statistics back in block coordinates (the inverse of postprocess)."""
    return {
        "s1": statistics["s1"],
        "s3": statistics["s3"],
        "s4": statistics["s4"] - PG_CENTRE,
        "s5": statistics["s5"].reshape(-1) - PG_CENTRE,
        "s6": (statistics["s6"] - statistics["s3"][:, None] / 2.0).reshape(-1),
        "s7": np.concatenate([upper_triangle(m) for m in statistics["s7"]]) - PG_CENTRE,
    }


class TestSbnQuery(QueryContract):
    dimension = J

    def make_query(self) -> SigmoidBeliefNetworkQuery:
        return SigmoidBeliefNetworkQuery(K, INNER)

    def make_batch(self, rng: np.random.Generator, size: int) -> Batch:
        density = rng.uniform(0.1, 0.9, size=(size, 1))  # some nearly empty and nearly full images
        return Batch((rng.random((size, J)) < density).astype(np.float64))

    def random_record(self, rng: np.random.Generator) -> Batch:
        return self.make_batch(rng, 1)

    def make_params(self, rng: np.random.Generator) -> list[Params]:
        factor = rng.normal(size=(J, K + 1, K + 1))
        posterior_covariance = factor @ np.swapaxes(factor, 1, 2) / (K + 1)
        asymmetric = rng.normal(scale=3.0, size=(J, K + 1, K + 1))  # neither symmetric nor PSD
        zeros_w = np.zeros((J, K))
        return [
            # The prior of the model with random initial means (unit weight variance, c variance 10).
            params_of(
                np.zeros(K),
                rng.normal(scale=0.5, size=(J, K)),
                np.zeros(J),
                np.tile(np.diag([1.0] * K + [10.0]), (J, 1, 1)),
            ),
            params_of(np.zeros(K), zeros_w, np.zeros(J)),  # r = 1/2, xi = 1/4 for every record
            params_of(
                rng.normal(scale=2.0, size=K),
                rng.normal(scale=3.0, size=(J, K)),
                rng.normal(scale=3.0, size=J),
                posterior_covariance,
            ),
            saturating_params(30.0),
            saturating_params(-30.0),
            # b = +50: r = 1 for every image, so s6 = (y - 1/2) 1^T swings by its full bound.
            params_of(np.full(K, 50.0), zeros_w, np.zeros(J)),
            params_of(np.full(K, -50.0), rng.normal(scale=20.0, size=(J, K)), np.full(J, 5.0)),
            {
                "b_mean": rng.normal(size=K),
                "w_mean": rng.normal(scale=5.0, size=(J, K)),
                "second_moment": asymmetric,
            },
            # Finite but overflowing: <psi^2>, the sums over j and the linear term reach inf and inf - inf.
            {
                "b_mean": np.full(K, 1e308),
                "w_mean": np.full((J, K), -1.5e308),
                "second_moment": np.full((J, K + 1, K + 1), 1.5e308),
            },
        ]

    def adversarial_records(self, params: Params) -> list[Batch]:
        # J = 4: the whole record space, all 16 binary images.
        return [record(list(bits)) for bits in itertools.product((0.0, 1.0), repeat=J)]

    def out_of_bound_records(self, rng: np.random.Generator) -> list[Batch]:
        return [
            record([5.0, -3.0, 0.5, 1.0]),
            record([1e6] * J),
            record([-1e6, 1e6, 0.0, 1.0]),
            record(rng.normal(scale=10.0, size=J)),
            record([2.0, 2.0, 2.0, 2.0]),
        ]

    def malformed_params(self) -> list[Params]:
        good = params_of(np.zeros(K), np.zeros((J, K)), np.zeros(J))
        bad: list[Params] = [
            {},
            {"b_mean": good["b_mean"], "w_mean": good["w_mean"]},
            {**good, "c_mean": np.zeros(J)},
        ]
        for name, wrong in (
            ("b_mean", np.zeros(K + 1)),
            ("b_mean", np.zeros((K, 1))),
            ("w_mean", np.zeros((K, J))),
            ("w_mean", np.zeros((J, K + 1))),
            ("second_moment", np.zeros((J, K, K))),
            ("second_moment", np.zeros((J + 1, K + 1, K + 1))),
            ("second_moment", np.zeros((K + 1, K + 1))),
            ("b_mean", np.array([0.0, np.nan, 0.0])),
            ("w_mean", np.full((J, K), np.inf)),
            ("second_moment", np.full((J, K + 1, K + 1), -np.inf)),
        ):
            bad.append({**good, name: wrong})
        return bad

    def expected_sensitivities(self, batch_size: int) -> dict[str, float]:
        # Each block's entries lie in a box of side a (a = 1 for s1, s3; 1/2 for s6; 1/4 for s4, s5, s7):
        # replacing one record moves the sum by at most a sqrt(dim), the box's diameter.
        s = batch_size
        return {
            "s1": math.sqrt(K) / s,  # r in [0, 1]^K
            "s3": math.sqrt(J) / s,  # y in {0, 1}^J
            "s4": math.sqrt(J) / (4.0 * s),  # xi in [0, 1/4]^J
            "s5": math.sqrt(J * K) / (4.0 * s),  # xi r^T in [0, 1/4]^(J x K)
            "s6": math.sqrt(J * K) / (2.0 * s),  # (y - 1/2) (r - 1/2)^T in [-1/4, 1/4]^(J x K)
            "s7": math.sqrt(J * K * (K + 1) / 2) / (4.0 * s),  # xi triu(<z z^T>) in [0, 1/4]^(J x K(K+1)/2)
        }

    def make_store(self, name: str, rows: Batch, *, public: bool) -> RowStore:
        return InMemoryBinaryStore(name, rows.features, public=public)

    def calibration_params(self) -> Params:
        rng = np.random.default_rng(7)
        return params_of(np.zeros(K), rng.normal(scale=0.5, size=(J, K)), np.zeros(J))

    def check_postprocess_inactive(
        self, exact_means: dict[str, np.ndarray], noise_std: dict[str, float]
    ) -> None:
        """postprocess only shifts by the public centre and reshapes (s5, s6 to J x K; s7 mirrored to
        J x K x K): it is the identity in block coordinates for any input, noisy or not, up to the rounding
        of adding and subtracting 1/8 (an ulp of values near 1/8 is 2.8e-17; 1e-15 is generous)."""
        rng = np.random.default_rng(8)
        noisy = {
            name: value + rng.normal(scale=noise_std[name], size=value.shape)
            for name, value in exact_means.items()
        }
        back = self.released_blocks(self.make_query().postprocess(noisy, J))
        for name, value in noisy.items():
            np.testing.assert_allclose(back[name], value, rtol=0, atol=1e-15, err_msg=name)

    def released_blocks(self, statistics: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return pack_blocks(statistics)


# --------------------------------------------------------------------------------------------------------
# SBN-specific checks.


def test_postprocess_layout() -> None:
    """s7 comes back as J symmetric K x K matrices whose upper triangles are the released block plus the
    centre 1/8; s4 and s5 get the centre back too, s6 gets s3 / 2 in each column (the released
    <(y - 1/2)(r - 1/2)^T> becomes <(y - 1/2) r^T>), s1 and s3 are unchanged."""
    query = SigmoidBeliefNetworkQuery(K, INNER)
    rng = np.random.default_rng(300)
    means = {
        "s1": rng.normal(size=K),
        "s3": rng.normal(size=J),
        "s4": rng.normal(size=J),
        "s5": rng.normal(size=J * K),
        "s6": rng.normal(size=J * K),
        "s7": rng.normal(size=J * K * (K + 1) // 2),
    }
    out = query.postprocess(means, J)
    assert out["s5"].shape == out["s6"].shape == (J, K)
    assert out["s7"].shape == (J, K, K)
    np.testing.assert_array_equal(out["s7"], np.swapaxes(out["s7"], 1, 2))
    np.testing.assert_array_equal(out["s5"][1], means["s5"][K : 2 * K] + PG_CENTRE)
    np.testing.assert_array_equal(out["s4"], means["s4"] + PG_CENTRE)
    np.testing.assert_array_equal(out["s3"], means["s3"])
    np.testing.assert_array_equal(out["s6"], means["s6"].reshape(J, K) + means["s3"][:, None] / 2.0)


def test_e_step_is_bounded_and_finite_under_any_finite_params() -> None:
    """r in [0, 1], xi in [0, 1/4], both finite, for every audited parameter set and every binary image."""
    contract = TestSbnQuery()
    images = np.array(list(itertools.product((0.0, 1.0), repeat=J)))
    for params in contract.make_params(np.random.default_rng(301)):
        r, xi = hidden_posterior(images, params["b_mean"], params["w_mean"], params["second_moment"], INNER)
        assert np.isfinite(r).all() and np.isfinite(xi).all()
        assert r.min() >= 0.0 and r.max() <= 1.0
        assert xi.min() >= 0.0 and xi.max() <= 0.25


def test_adversarial_images_reach_the_bounds() -> None:
    """Named extremes, beyond the contract's >= 1/2: all-ones against all-zeros moves s3 by exactly its
    Delta; under b = +50 (r = 1 for both: (y - 1/2)(r - 1/2)^T is +1/4 against -1/4 everywhere) s6 moves
    by exactly its Delta; under the saturating parameters
    s1 moves by ~sqrt(2/3) of its Delta (two of the three hidden units switch off; the third stays at a
    mean-field fixed point at 1), and s4, s5, s7 by ~0.97 of theirs (xi = 1/4 against xi ~ 1/180 with
    r ~ 0, the corners of their boxes)."""
    query = SigmoidBeliefNetworkQuery(K, INNER)
    deltas = {block.name: block.sensitivity(1) for block in query.blocks(J)}
    ones, zeros = record([1.0] * J), record([0.0] * J)

    def moved(params: Params) -> dict[str, float]:
        a = query.clipped_sums(ones, params, np.random.default_rng(0))
        b = query.clipped_sums(zeros, params, np.random.default_rng(0))
        return {name: float(np.linalg.norm(a[name] - b[name])) / deltas[name] for name in deltas}

    saturated = moved(saturating_params(30.0))
    assert saturated["s3"] == pytest.approx(1.0, rel=1e-12)
    assert saturated["s1"] > 0.8
    for name in ("s4", "s5", "s7"):
        assert saturated[name] > 0.95, (name, saturated[name])
    constant_hidden = moved(params_of(np.full(K, 50.0), np.zeros((J, K)), np.zeros(J)))
    assert constant_hidden["s6"] == pytest.approx(1.0, rel=1e-9)


def test_clipped_sums_do_not_use_the_generator() -> None:
    """The E-step is deterministic: no draws, so replacing a record changes nothing else's contribution."""
    query = SigmoidBeliefNetworkQuery(K, INNER)
    contract = TestSbnQuery()
    rng = np.random.default_rng(302)
    batch = contract.make_batch(rng, 20)
    params = contract.make_params(rng)[2]
    first = np.random.default_rng(1)
    state = first.bit_generator.state
    a = query.clipped_sums(batch, params, first)
    assert first.bit_generator.state == state
    b = query.clipped_sums(batch, params, np.random.default_rng(2))
    for name, value in a.items():
        np.testing.assert_array_equal(value, b[name])


def test_chunked_sums_equal_one_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunks of 7 rows give the sums of one pass over 50 rows (records are independent), to rounding."""
    query = SigmoidBeliefNetworkQuery(K, INNER)
    contract = TestSbnQuery()
    rng = np.random.default_rng(303)
    batch = contract.make_batch(rng, 50)
    params = contract.make_params(rng)[2]
    whole = query.clipped_sums(batch, params, rng)
    monkeypatch.setattr(sbn_query, "CHUNK_ROWS", 7)
    chunked = query.clipped_sums(batch, params, rng)
    for name, value in whole.items():
        np.testing.assert_allclose(chunked[name], value, rtol=1e-12, atol=1e-13, err_msg=name)


def test_query_refuses_bad_constructor_arguments() -> None:
    for hidden, inner in ((0, 5), (3, 0), (True, 5), (3, 2.5)):
        with pytest.raises(ValueError):
            SigmoidBeliefNetworkQuery(hidden, inner)  # type: ignore[arg-type]


def test_validation_errors_name_the_parameter_not_values() -> None:
    query = SigmoidBeliefNetworkQuery(K, INNER)
    secret = 123456.789
    params = params_of(np.zeros(K), np.zeros((J, K)), np.zeros(J))
    params["w_mean"] = np.full((J, K + 1), secret)
    with pytest.raises(ValueError, match="w_mean") as info:
        query.validate_params(params, J)
    assert "123456" not in str(info.value)
