"""Noise drawn one release ahead (privacy_wall.noise_ahead): every draw used at most once, by a release of its
own shape, from its own private generator; seeded gates keep their own stream."""

from __future__ import annotations

import itertools
import threading
from fractions import Fraction

import numpy as np
import pytest

from privacy_wall import noise_ahead
from privacy_wall.gate import Gate
from privacy_wall.ledger import InMemoryLedger
from privacy_wall.noise_ahead import NoiseAhead
from privacy_wall.queries.linreg import LinearRegressionQuery
from privacy_wall.store import InMemoryTabularStore


class CountingDraws:
    """A stand-in for the private sampler: draw number n of shape (sigma2, size) is `size` copies of n, so
    a test can see which draw a release got, and in which thread each was made."""

    def __init__(self) -> None:
        self.count = itertools.count()
        self.made: list[tuple[int, Fraction, int, str]] = []

    def __call__(self, sigma2: Fraction, size: int) -> np.ndarray:
        n = next(self.count)
        self.made.append((n, sigma2, size, threading.current_thread().name))
        return np.full(size, n, dtype=np.int64)


def test_each_draw_is_used_once_and_only_by_its_own_shape(monkeypatch: pytest.MonkeyPatch) -> None:
    draws = CountingDraws()
    monkeypatch.setattr(noise_ahead, "_fresh_draw", draws)
    noise = NoiseAhead()
    a, b = Fraction(9, 4), Fraction(25, 1)
    got = [noise.draw(a, 3), noise.draw(a, 3), noise.draw(a, 3), noise.draw(b, 3), noise.draw(a, 5)]
    served = [int(values[0]) for values in got]
    assert len(set(served)) == len(served)  # no draw reaches two releases
    for values, (sigma2, size) in zip(got, [(a, 3), (a, 3), (a, 3), (b, 3), (a, 5)], strict=True):
        n = int(values[0])
        assert values.shape == (size,) and (values == n).all()
        made = next(m for m in draws.made if m[0] == n)
        assert made[1:3] == (sigma2, size)  # a release gets only noise of its own grid
    # the 2nd and 3rd releases took the draws made ahead, in the background thread
    threads = {m[0]: m[3] for m in draws.made}
    assert threads[served[1]].startswith("vips-noise") and threads[served[2]].startswith("vips-noise")
    # a change of shape draws afresh, in the caller's thread; the draw made ahead for the old shape is dropped
    assert not threads[served[3]].startswith("vips-noise")
    assert not threads[served[4]].startswith("vips-noise")
    noise.close()


def test_real_draws_are_fresh_and_exact_integers() -> None:
    noise = NoiseAhead()
    sigma2 = Fraction(2**40 + 3, 7)
    first, second, third = (noise.draw(sigma2, 4_000) for _ in range(3))
    for values in (first, second, third):
        assert values.dtype == np.int64 and values.shape == (4_000,)
        # N_Z(0, sigma2): the sample variance of 4,000 draws is within 10% of sigma2 (its sd is ~2.2%)
        assert abs(float(np.var(values)) / float(sigma2) - 1) < 0.1
    assert not np.array_equal(first, second) and not np.array_equal(second, third)
    noise.close()


def test_a_fork_gets_its_own_noise_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    parent = noise_ahead._background()
    monkeypatch.setattr(noise_ahead.os, "getpid", lambda: -1)  # as seen from a forked child
    child = noise_ahead._background()
    assert child is not parent
    monkeypatch.undo()
    noise_ahead._background().shutdown(wait=True)
    noise_ahead._executor = None


def _gate(seed: int | None) -> Gate:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 3))
    x /= np.maximum(1.0, np.linalg.norm(x, axis=1))[:, None]
    y = np.clip(x @ np.array([0.5, -0.2, 0.1]), -1, 1)
    store = InMemoryTabularStore("public", x, y, public=seed is not None, kind="regression")
    return Gate(store, InMemoryLedger(delta=1e-5), seed=seed)


def _release(gate: Gate, iteration: int) -> dict[str, np.ndarray]:
    query = LinearRegressionQuery()
    return gate.release(query, {}, job_id="j", iteration=iteration, sigma=1.0, batch_size=200).statistics


def test_unseeded_gates_take_noise_drawn_ahead(monkeypatch: pytest.MonkeyPatch) -> None:
    draws = CountingDraws()
    monkeypatch.setattr(noise_ahead, "_fresh_draw", draws)
    gate = _gate(seed=None)
    for iteration in range(4):
        _release(gate, iteration)
    noise_ahead._background().submit(lambda: None).result()  # the one thread runs its tasks in order
    # one draw per release plus the one made ahead for a fifth; releases 2-4 were served from the thread
    assert len(draws.made) == 5
    assert [m[3].startswith("vips-noise") for m in draws.made] == [False, True, True, True, True]


def test_seeded_gates_draw_from_their_own_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    draws = CountingDraws()
    monkeypatch.setattr(noise_ahead, "_fresh_draw", draws)
    first, again = _gate(seed=5), _gate(seed=5)
    for iteration in range(3):
        one, other = _release(first, iteration), _release(again, iteration)
        assert one.keys() == other.keys()
        for name in one:
            np.testing.assert_array_equal(one[name], other[name])
    assert not draws.made  # reproducible fits of public data never use noise drawn elsewhere
