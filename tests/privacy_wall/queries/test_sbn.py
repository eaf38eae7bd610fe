"""The sigmoid belief network's E-step behind the wall: the query contract, plus SBN-specific checks."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

import privacy_wall.queries.sbn as sbn_query
from privacy_wall.data.store import Batch, InMemoryBinaryStore, RowStore
from privacy_wall.gate import Gate
from privacy_wall.ledger.base import InMemoryLedger
from privacy_wall.noise.mechanisms import upper_triangle
from privacy_wall.queries.base import joint_sensitivity
from privacy_wall.queries.sbn import (
    PG_CENTRE,
    SigmoidBeliefNetworkQuery,
    frequency_copy_names,
    hidden_posterior,
)
from tests.contracts import Params, QueryContract, assert_noise_is_calibrated

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
    copies = 1  # frequency_copies: s3 released this many times

    def make_query(self) -> SigmoidBeliefNetworkQuery:
        return SigmoidBeliefNetworkQuery(K, INNER, self.copies)

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
        } | dict.fromkeys(frequency_copy_names(self.copies), math.sqrt(J) / s)  # copies of s3

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
        copies = ("s3", *frequency_copy_names(self.copies))
        averaged = dict(noisy, s3=np.mean([noisy[name] for name in copies], axis=0))  # postprocess's s3
        back = self.released_blocks(self.make_query().postprocess(noisy, J))
        for name, value in averaged.items():
            expected = averaged["s3"] if name in copies else value
            np.testing.assert_allclose(back[name], expected, rtol=0, atol=1e-15, err_msg=name)

    def released_blocks(self, statistics: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        packed = pack_blocks(statistics)
        return packed | dict.fromkeys(frequency_copy_names(self.copies), statistics["s3"])


class SbnQueryWithCopies(TestSbnQuery):
    """TestSbnQuery's fixtures with s3 released in 3 copies (frequency_copies), for the copies' own checks
    (not collected: its name does not start with Test; the rest of the contract does not depend on the
    copies, which are exact duplicates of s3's sum, and TestSbnQuery runs it)."""

    copies = 3


@pytest.mark.slow
def test_gate_noise_with_frequency_copies_is_calibrated_end_to_end() -> None:
    """The real gate, S = N, 3 copies (B = 8 blocks): each block's noise_std is sigma sqrt(B) Delta_b, and
    the postprocessed s3 (the mean of its 3 copies) carries noise of std sigma sqrt(B) Delta3 / sqrt(3)."""
    contract = SbnQueryWithCopies()
    query = contract.make_query()
    rng = np.random.default_rng(107)
    rows = contract.calibration_rows(rng)
    population = rows.size
    gate = Gate(contract.make_store("calibration", rows, public=False), InMemoryLedger(delta=1e-5))
    params = contract.calibration_params()
    exact = contract._means(query, rows, params)
    deltas = contract._deltas(query, population)
    assert set(deltas) == {"s1", "s3", "s4", "s5", "s6", "s7", "s3_2", "s3_3"}
    expected = contract._expected_stds(query, deltas, contract.calibration_sigma, exact)
    copies = ("s3", *frequency_copy_names(contract.copies))
    scales = {name: expected[name] for name in deltas if name not in copies}
    scales["s3"] = expected["s3"] / math.sqrt(contract.copies)
    noise: dict[str, list[np.ndarray]] = {name: [] for name in scales}
    for t in range(1, contract.calibration_releases + 1):
        release = gate.release(
            query,
            params,
            job_id="calibration",
            iteration=t,
            sigma=contract.calibration_sigma,
            batch_size=population,
        )
        for name in deltas:
            assert release.noise_std[name] == pytest.approx(expected[name], rel=1e-12)
        released = contract.released_blocks(release.statistics)
        for name in scales:
            noise[name].append(released[name] - exact[name])
    for name, scale in scales.items():
        assert_noise_is_calibrated(np.array(noise[name]), scale, f"gate, block {name}")


# --------------------------------------------------------------------------------------------------------
# SBN-specific checks.


def test_postprocess_layout() -> None:
    """s7 comes back as J symmetric K x K matrices whose upper triangles are the released block plus the
    centre 1/8; s4 and s5 get the centre back too, s6 gets s3 / 2 in each column (the released
    <(y - 1/2)(r - 1/2)^T> becomes <(y - 1/2) r^T>), s1 and s3 are unchanged (one copy of s3)."""
    query = SigmoidBeliefNetworkQuery(K, INNER, frequency_copies=1)
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
    for copies in (0, 65, True, 2.0):
        with pytest.raises(ValueError, match="frequency_copies"):
            SigmoidBeliefNetworkQuery(K, INNER, copies)  # type: ignore[arg-type]


def test_frequency_copies_weight_the_pixel_frequencies() -> None:
    """k copies of s3 in the joint release are the release with s3 weighted by sqrt(k): the gate's noise
    per normalised coordinate is sqrt(5 + k) sigma, so the postprocessed s3 (the copies' mean) has
    std sqrt(5 + k) sigma Delta3 / sqrt(k) and every other block sqrt(5 + k) sigma Delta_b. Adversarial
    pair: all-ones against all-zeros moves every copy by exactly Delta3 (so the copies' joint move reaches
    sqrt(k) and the concatenation's stays <= sqrt(B) = sqrt(5 + k)); random pairs never exceed either."""
    copies = 4
    query = SigmoidBeliefNetworkQuery(K, INNER, copies)
    names = [block.name for block in query.blocks(J)]
    assert names == ["s1", "s3", "s4", "s5", "s6", "s7", "s3_2", "s3_3", "s3_4"]
    deltas = {block.name: block.sensitivity(1) for block in query.blocks(J)}
    joint = joint_sensitivity(query, J)
    assert joint == pytest.approx(math.sqrt(5 + copies), rel=1e-15)
    rng = np.random.default_rng(310)

    def normalised_move(a: Batch, b: Batch, params: Params) -> dict[str, float]:
        x = query.clipped_sums(a, params, rng)
        y = query.clipped_sums(b, params, rng)
        return {name: float(np.linalg.norm(x[name] - y[name])) / deltas[name] for name in deltas}

    ones, zeros = record([1.0] * J), record([0.0] * J)
    moves = normalised_move(ones, zeros, saturating_params(30.0))
    copy_moves = [moves[name] for name in ("s3", *frequency_copy_names(copies))]
    np.testing.assert_allclose(copy_moves, 1.0, rtol=1e-12)
    assert math.hypot(*copy_moves) == pytest.approx(math.sqrt(copies), rel=1e-12)
    assert math.hypot(*moves.values()) <= joint * (1 + 1e-12)
    contract = TestSbnQuery()
    for params in contract.make_params(rng):
        for _ in range(20):
            a, b = contract.random_record(rng), contract.random_record(rng)
            moved = normalised_move(a, b, params)
            assert max(moved.values()) <= 1 + 1e-12
            assert math.hypot(*moved.values()) <= joint * (1 + 1e-12)
            for name in frequency_copy_names(copies):
                assert moved[name] == moved["s3"]
    means = {
        name: rng.normal(size=value.shape) for name, value in query.clipped_sums(ones, params, rng).items()
    }
    out = query.postprocess(means, J)
    expected = np.mean([means[name] for name in ("s3", *frequency_copy_names(copies))], axis=0)
    np.testing.assert_allclose(out["s3"], expected, rtol=1e-15)
    np.testing.assert_allclose(out["s6"], means["s6"].reshape(J, K) + expected[:, None] / 2.0, rtol=1e-15)
    assert set(out) == {"s1", "s3", "s4", "s5", "s6", "s7"}


def test_validation_errors_name_the_parameter_not_values() -> None:
    query = SigmoidBeliefNetworkQuery(K, INNER)
    secret = 123456.789
    params = params_of(np.zeros(K), np.zeros((J, K)), np.zeros(J))
    params["w_mean"] = np.full((J, K + 1), secret)
    with pytest.raises(ValueError, match="w_mean") as info:
        query.validate_params(params, J)
    assert "123456" not in str(info.value)
