"""Noise drawn on a background thread while a release's sums are computed (privacy_wall.noise.draw_ahead):
every draw used at most once, by a release of its own shape, from its own private generator; a fork waits for
no
thread of its parent; a failing draw fails its release like an in-line one; seeded gates keep their own
stream."""

from __future__ import annotations

import itertools
import os
import threading
from fractions import Fraction

import numpy as np
import pytest

from privacy_wall.data.store import InMemoryTabularStore
from privacy_wall.gate import Gate
from privacy_wall.ledger.base import InMemoryLedger
from privacy_wall.noise import draw_ahead as noise_ahead
from privacy_wall.noise.draw_ahead import NoiseAhead
from privacy_wall.queries.linreg import LinearRegressionQuery


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
    shapes = [(a, 3), (a, 3), (a, 3), (b, 3), (b, 3), (a, 5)]
    got = []
    for sigma2, size in shapes:
        noise.start()
        got.append(noise.draw(sigma2, size))
    served = [int(values[0]) for values in got]
    assert len(set(served)) == len(served)  # no draw reaches two releases
    made = {m[0]: m for m in draws.made}
    for values, (sigma2, size) in zip(got, shapes, strict=True):
        n = int(values[0])
        assert values.shape == (size,) and (values == n).all()
        assert made[n][1:3] == (sigma2, size)  # a release gets only noise of its own grid
    in_background = [made[n][3].startswith("vips-noise") for n in served]
    # the first release draws in line; a release of the previous one's shape takes the background draw; a
    # change of shape draws in line and the background draw of the old shape is dropped, never served
    assert in_background == [False, True, True, False, True, False]
    noise_ahead._background().submit(lambda: None).result()  # the one thread runs its tasks in order
    assert len(draws.made) == len(shapes) + 2  # two background draws of a stale shape, dropped


def test_a_draw_started_for_a_release_that_failed_goes_to_the_next_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    draws = CountingDraws()
    monkeypatch.setattr(noise_ahead, "_fresh_draw", draws)
    noise = NoiseAhead()
    noise.start()
    first = noise.draw(Fraction(4), 2)
    noise.start()  # this release fails before its noise: its draw is kept for the next release...
    noise.start()  # ... and a second start does not draw again
    second = noise.draw(Fraction(4), 2)
    assert int(first[0]) != int(second[0])
    assert len(draws.made) == 2


def test_real_draws_are_fresh_and_exact_integers() -> None:
    noise = NoiseAhead()
    sigma2 = Fraction(2**40 + 3, 7)
    draws = []
    for _ in range(3):
        noise.start()
        draws.append(noise.draw(sigma2, 4_000))
    for values in draws:
        assert values.dtype == np.int64 and values.shape == (4_000,)
        # N_Z(0, sigma2): the sample variance of 4,000 draws is within 10% of sigma2 (its sd is ~2.2%)
        assert abs(float(np.var(values)) / float(sigma2) - 1) < 0.1
    assert not np.array_equal(draws[0], draws[1]) and not np.array_equal(draws[1], draws[2])


def test_a_forked_child_never_waits_for_its_parents_draw(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fork keeps no thread: a draw its parent started is forgotten by the child's NoiseAhead, which
    draws in line, and the child gets a noise thread of its own."""
    noise = NoiseAhead()
    sigma2 = Fraction(9, 4)
    noise.draw(sigma2, 3)
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report, never return into pytest
        ok = False
        try:
            noise.start()  # a fresh thread in this process
            values = noise.draw(sigma2, 3)
            ok = values.shape == (3,) and noise_ahead._executor is not None
        finally:
            os.write(writer, b"1" if ok else b"0")
            os._exit(0)
    os.close(writer)
    parent_executor = noise_ahead._background()
    noise.start()
    assert noise.draw(sigma2, 3).shape == (3,)
    assert os.read(reader, 1) == b"1"
    os.waitpid(pid, 0)
    assert noise_ahead._background() is parent_executor


def _gate(seed: int | None, ledger: InMemoryLedger | None = None) -> Gate:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 3))
    x /= np.maximum(1.0, np.linalg.norm(x, axis=1))[:, None]
    y = np.clip(x @ np.array([0.5, -0.2, 0.1]), -1, 1)
    store = InMemoryTabularStore("public", x, y, public=seed is not None, kind="regression")
    return Gate(store, ledger or InMemoryLedger(delta=1e-5), seed=seed)


def _release(gate: Gate, iteration: int) -> dict[str, np.ndarray]:
    query = LinearRegressionQuery()
    return gate.release(query, {}, job_id="j", iteration=iteration, sigma=1.0, batch_size=200).statistics


def test_unseeded_gates_draw_noise_while_the_sums_are_computed(monkeypatch: pytest.MonkeyPatch) -> None:
    draws = CountingDraws()
    monkeypatch.setattr(noise_ahead, "_fresh_draw", draws)
    gate = _gate(seed=None)
    for iteration in range(4):
        _release(gate, iteration)
    # one draw per release, none left over: the first in line, the others on the noise thread
    assert [m[3].startswith("vips-noise") for m in draws.made] == [False, True, True, True]


def test_a_memory_error_of_the_noise_thread_withdraws_the_charge(monkeypatch: pytest.MonkeyPatch) -> None:
    """A draw that fails in the background fails its release as an in-line one would: memory on arrays of
    public shapes, so the charge is withdrawn (charges = releases)."""
    calls = itertools.count()

    def fails_in_background(sigma2: Fraction, size: int) -> np.ndarray:
        if next(calls) == 1:
            raise MemoryError
        return np.zeros(size, dtype=np.int64)

    monkeypatch.setattr(noise_ahead, "_fresh_draw", fails_in_background)
    ledger = InMemoryLedger(delta=1e-5)
    gate = _gate(seed=None, ledger=ledger)
    _release(gate, 1)
    with pytest.raises(MemoryError):
        _release(gate, 2)
    _release(gate, 3)
    assert sorted(charge.iteration for charge in ledger.charges()) == [1, 3]


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
