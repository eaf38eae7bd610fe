"""VIPS for the sigmoid belief network end to end (wall + loop + M-step): the vectorised E-step against a
per-record reference, structure recovery at sigma = 0 on a synthetic SBN, binarised digits against the
per-pixel-mean baseline, the posterior document and a private fit through the real gate."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy.optimize import linear_sum_assignment
from scipy.special import expit

from privacy_wall.accounting.calibration import epsilon
from privacy_wall.data.store import Batch, InMemoryBinaryStore
from privacy_wall.ledger.base import InMemoryLedger
from privacy_wall.queries.sbn import SigmoidBeliefNetworkQuery, hidden_posterior
from tests.fitting import fit_through_gate
from vips.datasets.digits import load_binary_digits
from vips.models.sbn.model import (
    SbnState,
    SigmoidBeliefNetwork,
    bernoulli_nll,
    heldout_nll,
    pixel_mean_metrics,
    project_statistics,
    reconstruct_proba,
    reconstruction_metrics,
)
from vips.posterior import sbn_parameters
from vips.runner import LoopSettings

# --------------------------------------------------------------------------------------------------------
# The E-step, record by record.


def pg_mean(c: float) -> float:
    return 0.25 if c == 0 else math.tanh(c / 2) / (2 * c)


def naive_e_step(
    y: np.ndarray, b: np.ndarray, w: np.ndarray, moment: np.ndarray, rounds: int
) -> tuple[np.ndarray, np.ndarray]:
    """Paper Eq. 67-71 for one record, written with explicit sums: xi_j from <psi_j^2> under
    q(z) q(w^_j); then each hidden unit k in turn from d_k; `rounds` times; then xi once more."""
    hidden, visible = b.shape[0], y.shape[0]
    moment = (moment + np.swapaxes(moment, 1, 2)) / 2

    def xi_of(r: list[float]) -> list[float]:
        r_hat = [*r, 1.0]
        out = []
        for j in range(visible):
            e = 0.0
            for a in range(hidden + 1):
                for c in range(hidden + 1):
                    pair = r_hat[a] if a == c else r_hat[a] * r_hat[c]  # <z_a^2> = r_a (binary)
                    e += moment[j, a, c] * pair
            out.append(pg_mean(math.sqrt(max(e, 0.0))))
        return out

    r = [float(expit(bk)) for bk in b]
    xi = xi_of(r)
    for _ in range(rounds):
        for k in range(hidden):
            d = float(b[k])
            for j in range(visible):
                d += (y[j] - 0.5) * w[j, k]
                others = sum(moment[j, k, m] * r[m] for m in range(hidden) if m != k)
                d -= 0.5 * xi[j] * (moment[j, k, k] + 2 * others + 2 * moment[j, k, hidden])
            r[k] = float(expit(d))
        xi = xi_of(r)
    return np.array(r), np.array(xi)


def naive_statistics(y: np.ndarray, r: np.ndarray, xi: np.ndarray) -> dict[str, np.ndarray]:
    """Sums over records of the six statistics (paper Sec. 7 / Appendix 4), unclipped and uncentred."""
    out: dict[str, np.ndarray] = {}
    for n in range(y.shape[0]):
        second = np.outer(r[n], r[n])
        np.fill_diagonal(second, r[n])  # <z z^T> of independent Bernoullis
        record = {
            "s1": r[n] - 0.5,
            "s3": y[n] - 0.5,
            "s4": xi[n],
            "s5": np.outer(xi[n], r[n]),
            "s6": np.outer(y[n] - 0.5, r[n]),
            "s7": xi[n][:, None, None] * second[None, :, :],
        }
        for name, value in record.items():
            out[name] = out.get(name, 0.0) + value
    return out


def test_vectorised_e_step_equals_the_per_record_reference() -> None:
    """Same operations in another order: agreement to rounding (observed ~1e-15; 1e-9 leaves room for the
    few rounds amplifying differences through the sigmoid, whose slope is <= 1/4)."""
    rng = np.random.default_rng(500)
    visible, hidden, size = 5, 3, 7
    y = (rng.random((size, visible)) < 0.5).astype(np.float64)
    y[0], y[1] = 1.0, 0.0
    factor = rng.normal(size=(visible, hidden + 1, hidden + 1))
    covariance = factor @ np.swapaxes(factor, 1, 2) / 4
    mean = rng.normal(scale=2.0, size=(visible, hidden + 1))
    moment = covariance + mean[:, :, None] * mean[:, None, :]
    b = rng.normal(size=hidden)
    query = SigmoidBeliefNetworkQuery(hidden, 4)
    params = {"b_mean": b, "w_mean": mean[:, :hidden], "second_moment": moment}
    query.validate_params(params, visible)
    r, xi = hidden_posterior(y, b, mean[:, :hidden], moment, 4)
    for n in range(size):
        r_ref, xi_ref = naive_e_step(y[n], b, mean[:, :hidden], moment, 4)
        np.testing.assert_allclose(r[n], r_ref, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(xi[n], xi_ref, rtol=1e-9, atol=1e-12)
    sums = query.clipped_sums(Batch(y), params, rng)
    released = query.postprocess({name: value / size for name, value in sums.items()}, visible)
    expected = naive_statistics(y, r, xi)
    for name, value in expected.items():
        np.testing.assert_allclose(released[name], value / size, rtol=1e-9, atol=1e-12, err_msg=name)


# --------------------------------------------------------------------------------------------------------
# Synthetic SBN.

VISIBLE, HIDDEN = 36, 4


def true_sbn() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """W: each entry non-zero with probability 0.3, sign random, magnitude U(3, 6); c centres every pixel's
    logit (c_j = -sum_k W_jk / 2, plus N(0, 0.5^2)); b ~ N(-0.5, 0.5^2): each unit is on ~38% of the time."""
    g = np.random.default_rng(42)
    mask = g.random((VISIBLE, HIDDEN)) < 0.3
    w = mask * g.choice([-1.0, 1.0], size=(VISIBLE, HIDDEN)) * g.uniform(3, 6, size=(VISIBLE, HIDDEN))
    c = -0.5 * w.sum(axis=1) + g.normal(0, 0.5, VISIBLE)
    b = g.normal(-0.5, 0.5, HIDDEN)
    return w, b, c


def sample_sbn(w: np.ndarray, b: np.ndarray, c: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    z = (rng.random((n, w.shape[1])) < expit(b)).astype(np.float64)
    rows: np.ndarray = (rng.random((n, w.shape[0])) < expit(z @ w.T + c)).astype(np.float64)
    return rows


Synthetic = tuple[np.ndarray, np.ndarray, tuple[np.ndarray, np.ndarray, np.ndarray]]


@pytest.fixture(scope="module")
def synthetic() -> Synthetic:
    w, b, c = true_sbn()
    rng = np.random.default_rng(0)
    return sample_sbn(w, b, c, 2000, rng), sample_sbn(w, b, c, 2000, rng), (w, b, c)


def fit(
    rows: np.ndarray,
    model: SigmoidBeliefNetwork,
    *,
    sigma: float,
    batch_size: int,
    iterations: int,
    tau0: float = 0.0,
    kappa: float = 1.0,
) -> tuple[SbnState, InMemoryLedger]:
    """VIPS through the real gate: public + seeded at sigma = 0, private (CSPRNG) otherwise."""
    return fit_through_gate(
        InMemoryBinaryStore("binary", rows, public=sigma == 0),
        model,
        model.query(),
        LoopSettings(iterations, batch_size, sigma, tau0, kappa),
    )


def matched_column_cosines(true_w: np.ndarray, fitted_w: np.ndarray) -> np.ndarray:
    """|cos| between true and fitted columns of W under the best one-to-one matching. An SBN is identified
    only up to permuting hidden units and flipping one (z_k -> 1 - z_k negates w_.k), hence |cos|."""
    a = true_w / np.linalg.norm(true_w, axis=0)
    f = fitted_w / np.linalg.norm(fitted_w, axis=0)
    cos = np.abs(a.T @ f)
    rows, cols = linear_sum_assignment(-cos)
    matched: np.ndarray = cos[rows, cols]
    return matched


def test_batch_mode_recovers_the_synthetic_network(synthetic: Synthetic) -> None:
    """Batch VB (S = N = 2000, rho = 1, 25 iterations), K = 4 as in the truth. Observed: matched |cos| of
    0.987-0.996 and held-out reconstruction NLL 15.13 nats against 15.06 for the true parameters (0.5%),
    while the per-pixel-mean baseline is at 22.7. Each mutation tried (halving s6 or the diagonal of s7,
    zeroing s5, flipping the sign of s3 or of s1) leaves some column below |cos| 0.75. The likelihood is
    multimodal: of the initial seeds 0-4, seed 3 ends with one column at |cos| 0.78 (a local optimum);
    the others reach >= 0.98 as seed 0 (the model's default) does here."""
    train, test, (w, b, c) = synthetic
    state, ledger = fit(train, SigmoidBeliefNetwork(hidden=HIDDEN), sigma=0.0, batch_size=2000, iterations=25)
    cosines = matched_column_cosines(w, state.w_mean)
    assert cosines.min() > 0.97, cosines
    fitted = reconstruction_metrics(test, state.w_mean, state.b_mean, state.c_mean)
    truth = reconstruction_metrics(test, w, b, c)
    baseline = pixel_mean_metrics(train, test)
    assert fitted["nll"] < 1.02 * truth["nll"], (fitted, truth)
    assert fitted["pixel_accuracy"] > truth["pixel_accuracy"] - 0.01
    assert baseline["nll"] > truth["nll"] + 5
    assert len(ledger.charges()) == 25 and ledger.epsilon_spent() == math.inf


def test_minibatch_at_sigma_zero_recovers_the_synthetic_network(synthetic: Synthetic) -> None:
    """Stochastic VI (S = 500 of 2000, rho_t = (1 + t)^-0.6, 150 iterations). Observed: matched |cos| of
    0.983-0.992 and held-out NLL 15.16 against the truth's 15.06 (0.7%); the bounds leave room for the
    fluctuation of the iterate around the batch solution. (With S = 200, or with 60 iterations, some
    initial seeds leave one hidden unit in a local optimum: SBN likelihoods are multimodal.)"""
    train, test, (w, b, c) = synthetic
    state, _ = fit(
        train,
        SigmoidBeliefNetwork(hidden=HIDDEN),
        sigma=0.0,
        batch_size=500,
        iterations=150,
        tau0=1.0,
        kappa=0.6,
    )
    assert matched_column_cosines(w, state.w_mean).min() > 0.97
    fitted = reconstruction_metrics(test, state.w_mean, state.b_mean, state.c_mean)
    assert fitted["nll"] < 1.02 * reconstruction_metrics(test, w, b, c)["nll"]


# --------------------------------------------------------------------------------------------------------
# Binarised digits.


def test_digits_beat_the_pixel_mean_baseline() -> None:
    """K = 10, batch mode, 15 iterations on the 1,347 training images; scored on the 450 test images.
    Observed: NLL 17.6 nats per image and pixel accuracy 0.877, against 25.3 and 0.791 for the per-pixel
    training frequencies. The bounds (NLL below 0.8 x baseline, accuracy 5 points above) hold by a wide
    margin and fail for a model that ignores the hidden units (W = 0 reproduces the baseline)."""
    train, test = load_binary_digits("train"), load_binary_digits("test")
    assert train.shape == (1347, 64) and test.shape == (450, 64)
    state, _ = fit(
        train, SigmoidBeliefNetwork(hidden=10), sigma=0.0, batch_size=train.shape[0], iterations=15
    )
    fitted = reconstruction_metrics(test, state.w_mean, state.b_mean, state.c_mean)
    baseline = pixel_mean_metrics(train, test)
    assert fitted["nll"] < 0.8 * baseline["nll"], (fitted, baseline)
    assert fitted["pixel_accuracy"] > baseline["pixel_accuracy"] + 0.05, (fitted, baseline)


# --------------------------------------------------------------------------------------------------------
# The public half.


def test_posterior_document_round_trips_through_json(synthetic: Synthetic) -> None:
    train, test, _ = synthetic
    model = SigmoidBeliefNetwork(hidden=3)
    state, _ = fit(train[:300], model, sigma=0.0, batch_size=300, iterations=3)
    document = json.loads(json.dumps(model.posterior(state)))
    assert {"natural_parameters", "sufficient_statistics", "variational_parameters", "W", "b", "c"} <= set(
        document
    )
    params = sbn_parameters(document)
    w, b, c = params.W, params.b, params.c
    assert w.shape == (VISIBLE, 3) and b.shape == (3,) and c.shape == (VISIBLE,)
    np.testing.assert_array_equal(w, state.w_mean)
    assert set(document["sufficient_statistics"]) == {"s1", "s3", "s4", "s5", "s6", "s7"}
    assert np.array(document["natural_parameters"]["wc_precision"]).shape == (VISIBLE, 4, 4)
    p = reconstruct_proba(test[:20], w, b, c)
    assert p.shape == (20, VISIBLE) and np.all((p > 0) & (p < 1))


def test_initial_state_is_seeded_and_breaks_symmetry() -> None:
    a = SigmoidBeliefNetwork(hidden=4, seed=1).initial_state(10)
    again = SigmoidBeliefNetwork(hidden=4, seed=1).initial_state(10)
    other = SigmoidBeliefNetwork(hidden=4, seed=2).initial_state(10)
    np.testing.assert_array_equal(a.w_mean, again.w_mean)
    assert not np.array_equal(a.w_mean, other.w_mean)
    assert np.linalg.matrix_rank(a.w_mean) == 4, "distinct hidden units"
    np.testing.assert_allclose(a.c_mean, 0.0, atol=1e-12)
    np.testing.assert_allclose(a.b_mean, 0.0)
    # q(w_jk) starts at variance init_scale^2 / J (not the prior's w_variance: issue 35), q(c) at the prior.
    np.testing.assert_allclose(a.wc_covariance[0], np.diag([1.0 / 10] * 4 + [10.0]), rtol=1e-12)


def test_projection_is_the_identity_on_exact_statistics(synthetic: Synthetic) -> None:
    """At sigma = 0 the released statistics already satisfy what project_statistics imposes."""
    train, _, _ = synthetic
    model = SigmoidBeliefNetwork(hidden=HIDDEN)
    query = model.query()
    params = model.public_params(model.initial_state(VISIBLE))
    sums = query.clipped_sums(Batch(train[:500]), params, np.random.default_rng(0))
    exact = query.postprocess({k: v / 500 for k, v in sums.items()}, VISIBLE)
    projected = project_statistics(exact)
    for name, value in exact.items():
        np.testing.assert_allclose(projected[name], value, rtol=1e-12, atol=1e-15, err_msg=name)


def test_private_fit_runs_through_the_gate(synthetic: Synthetic) -> None:
    """sigma = 1 on a private store: every iteration is charged, the ledger's epsilon is the accountant's,
    and the noisy state stays finite with positive definite posterior precisions."""
    train, _, _ = synthetic
    state, ledger = fit(
        train,
        SigmoidBeliefNetwork(hidden=HIDDEN),
        sigma=1.0,
        batch_size=200,
        iterations=10,
        tau0=1.0,
        kappa=0.7,
    )
    assert len(ledger.charges()) == 10
    assert ledger.epsilon_spent() == pytest.approx(epsilon(1.0, 200, 2000, 10, 1e-5), rel=1e-9)
    assert np.isfinite(state.wc_mean).all() and np.isfinite(state.b_mean).all()
    assert np.all(np.linalg.eigvalsh(state.wc_eta2) > 0)
    assert np.all(state.b_eta2 > 0)


def test_metrics_are_the_bernoulli_likelihood() -> None:
    """bernoulli_nll = -sum_j log p(y_j) computed directly; pixel accuracy thresholds at 1/2."""
    rng = np.random.default_rng(600)
    logits = rng.normal(scale=3.0, size=(5, 7))
    y = (rng.random((5, 7)) < 0.5).astype(np.float64)
    p = expit(logits)
    direct = -np.sum(y * np.log(p) + (1 - y) * np.log1p(-p), axis=1)
    np.testing.assert_allclose(bernoulli_nll(y, logits), direct, rtol=1e-10)
    baseline = pixel_mean_metrics(y, y)
    frequency = (y.sum(axis=0) + 0.5) / 6.0
    assert baseline["pixel_accuracy"] == pytest.approx(float(np.mean((frequency > 0.5) == (y > 0.5))))


def _brute_force_nll(y: np.ndarray, W: np.ndarray, b: np.ndarray, c: np.ndarray) -> float:
    """-mean_n log sum_z p(z) p(y_n | z) by explicit loops over configurations and pixels."""
    import itertools

    total = 0.0
    for row in y:
        p = 0.0
        for bits in itertools.product((0.0, 1.0), repeat=len(b)):
            z = np.array(bits)
            prior = np.prod(np.where(z == 1, expit(b), 1 - expit(b)))
            on = expit(W @ z + c)
            p += prior * np.prod(np.where(row == 1, on, 1 - on))
        total -= math.log(p)
    return total / len(y)


def test_heldout_nll_sums_over_every_hidden_configuration() -> None:
    """Issue 51: the held-out NLL marginalises z (the reconstruction score reads z from the scored image
    itself); up to EXACT_HIDDEN units exactly, checked against explicit loops."""
    rng = np.random.default_rng(4)
    W, b, c = rng.normal(0, 2, (6, 3)), rng.normal(0, 1, 3), rng.normal(0, 1, 6)
    y = (rng.random((20, 6)) < 0.5).astype(float)
    found = heldout_nll(y, W, b, c)
    assert found["method"] == "exact" and found["samples"] == 8
    assert found["nll"] == pytest.approx(_brute_force_nll(y, W, b, c), rel=1e-12)
    assert found["nll"] > reconstruction_metrics(y, W, b, c)["nll"]  # reading z from y flatters the fit


def test_heldout_nll_by_importance_sampling_agrees_with_the_exact_sum(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Beyond EXACT_HIDDEN units, importance sampling from the E-step's q(z | y) mixed with p(z): on 8 units
    (exact: 256 configurations) 2,000 samples per row land within 0.005 nats of the exact mean (0.0014 at
    most over 10 seeds), and its
    expectation is an upper bound (Jensen): the estimate is not below the exact value by more than that."""
    import vips.models.sbn.model as sbn_module

    rng = np.random.default_rng(5)
    W, b, c = rng.normal(0, 1.5, (12, 8)), rng.normal(0, 1, 8), rng.normal(0, 1, 12)
    z = (rng.random((200, 8)) < expit(b)).astype(float)
    y = (rng.random((200, 12)) < expit(z @ W.T + c)).astype(float)
    exact = heldout_nll(y, W, b, c)["nll"]
    monkeypatch.setattr(sbn_module, "EXACT_HIDDEN", 0)
    sampled = heldout_nll(y, W, b, c, samples=2_000)
    assert sampled["method"] == "importance sampling" and sampled["samples"] == 2_000
    assert exact - 0.005 <= sampled["nll"] <= exact + 0.005, (sampled, exact)
