"""The SBN at image scale (issue 35): 784 pixels, where the prior's unit weight variance switched every hidden
unit off at the first E-step, and private fits that fall back to the per-pixel means instead of below them."""

from __future__ import annotations

import numpy as np
from scipy import ndimage

from privacy_wall.store import Batch, InMemoryBinaryStore
from tests.fitting import fit_through_gate
from worker.models.sbn import (
    NoiseVariances,
    SbnState,
    SigmoidBeliefNetwork,
    pixel_mean_metrics,
    reconstruction_metrics,
    shrink_columns,
    shrink_precision,
)
from worker.runner import LoopSettings


def digits_28(count: int, offset: int = 0) -> np.ndarray:
    """scikit-learn's 8 x 8 digits upsampled to 28 x 28 (bilinear, factor 3.5) and binarised at grey level
    > 7: J = 784 pixels with the digits' structure (public, bundled with scikit-learn)."""
    from sklearn.datasets import load_digits

    images = load_digits().images[offset : offset + count]
    big = np.stack([ndimage.zoom(image, 3.5, order=1) for image in images])
    return (big > 7).reshape(count, -1).astype(np.float64)


def fit(rows: np.ndarray, model: SigmoidBeliefNetwork, settings: LoopSettings) -> SbnState:
    state, _ = fit_through_gate(
        InMemoryBinaryStore("digits28", rows, public=True), model, model.query(), settings
    )
    return state


def test_hidden_units_learn_at_784_pixels() -> None:
    """K = 10, batch mode, 5 iterations on 300 upsampled digits; 200 other digits held out. Observed: NLL
    208.6 nats per image against 326.4 for the per-pixel means. The code before issue 35 started q(W) at
    the prior (variance 1): the E-step's penalty 1/2 sum_j xi_nj <w_jk^2> ~ 784 / 8 switched every unit off,
    W stayed exactly 0 and the NLL was the baseline's (328.0). The bound 0.8 x baseline sits between."""
    train, test = digits_28(300), digits_28(200, offset=1500)
    state = fit(train, SigmoidBeliefNetwork(hidden=10), LoopSettings(5, 300, 0.0))
    fitted = reconstruction_metrics(test, state.w_mean, state.b_mean, state.c_mean)
    baseline = pixel_mean_metrics(train, test)
    assert np.linalg.matrix_rank(state.w_mean) == 10, "every hidden unit in use"
    assert fitted["nll"] < 0.8 * baseline["nll"], (fitted, baseline)


def test_a_private_fit_that_noise_overwhelms_falls_back_to_the_pixel_means() -> None:
    """sigma = 1, S = 200 of 1,000 images, T = 10 (eps 5.1 at delta 1e-5), K = 10: per release the noise on
    s6 is ~8 times its largest possible entry, so every hidden unit is switched off (W exactly 0, the
    James-Stein factors of worker.models.sbn.shrink_columns) and c is read from s3. Observed over 3 fits:
    NLL 367-373 against 326.8 for the exact (non-private) pixel means: what is left is the noise of the
    released pixel frequencies. Before issue 35: W noisy (|W| up to 0.7), NLL 379-381. The noise is drawn
    from the OS's CSPRNG (private store): the bound 1.2 x baseline leaves ~7 standard deviations of the
    observed spread."""
    train, test = digits_28(1000), digits_28(200, offset=1500)
    model = SigmoidBeliefNetwork(hidden=10)
    store = InMemoryBinaryStore("digits28", train, public=False)
    state, _ = fit_through_gate(store, model, model.query(), LoopSettings(10, 200, 1.0))
    fitted = reconstruction_metrics(test, state.w_mean, state.b_mean, state.c_mean)
    assert np.all(state.w_mean == 0.0)
    assert fitted["nll"] < 1.2 * pixel_mean_metrics(train, test)["nll"]


def test_the_shrinkage_is_post_processing_and_the_identity_without_noise() -> None:
    """The M-step is a function of (state, released statistics, their public noise_std, N, rho) only: the
    same release gives the same state; and with noise_std 0 every shrinkage step is the identity."""
    rng = np.random.default_rng(0)
    drive = rng.normal(size=(30, 4))
    np.testing.assert_array_equal(shrink_columns(drive, np.zeros(4)), drive)
    data = rng.normal(size=(30, 5, 5))
    alive = np.ones(4, dtype=bool)
    shrunk, factor = shrink_precision(data, rng.normal(size=30), 100, NoiseVariances(np.zeros(4)), alive)
    assert shrunk is data and factor == 1.0
    model = SigmoidBeliefNetwork(hidden=4)
    state = model.initial_state(64)
    rows = digits_28(50)[:, :64]
    query = model.query()
    sums = query.clipped_sums(Batch(rows), model.public_params(state), rng)
    release = query.postprocess({name: value / 50 for name, value in sums.items()}, 64)
    std = {name: 0.1 for name in release}
    first, second = (model.m_step(state, release, 1000, 0.5, std) for _ in range(2))
    np.testing.assert_array_equal(first.wc_eta2, second.wc_eta2)
    np.testing.assert_array_equal(first.wc_mean, second.wc_mean)


def test_noise_only_columns_are_switched_off_and_signal_columns_kept() -> None:
    """Positive-part James-Stein on a J x K drive: a column of pure noise (variance v) has |x|^2 ~ J v and
    is zeroed with probability ~1/2 or more and shrunk by >= 1 - (J - 2) / chi2_J otherwise; a column with
    signal energy 100 J v keeps ~99% of it."""
    rng = np.random.default_rng(1)
    signal = np.zeros((784, 2))
    signal[:, 1] = 10.0
    shrunk = shrink_columns(signal + rng.normal(size=(784, 2)), np.ones(2))
    assert np.linalg.norm(shrunk[:, 0]) < 0.2 * np.sqrt(784)
    np.testing.assert_allclose(np.linalg.norm(shrunk[:, 1]) / np.linalg.norm(signal[:, 1]), 1.0, atol=0.02)
