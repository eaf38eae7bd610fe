"""A job's exact noise drawn on a background thread while its release's sums are computed.

A job's releases share their grid from one iteration to the next: the discrete Gaussian's parameter sigma2
and the release's size d are public functions of sigma and the model's shape (`fixed_point_grid`). So when a
release starts (its charge written), the noise N_Z(0, sigma2)^d of the job's previous release's shape can
already be drawn, while the sums are computed: the compiled sampler runs without the GIL, on a second core
when one is free. The work is the same (CPU time per iteration is unchanged); the wait is not. The first
release of a job, and any whose shape differs from the one drawn, draw in line.

Privacy: each draw comes from its own `private_generator()` (a fresh 128-bit AES key from the operating
system) and is handed to at most one release, of its own (sigma2, d), then forgotten; a draw that no
release of its shape takes (the release failed before its noise, or changed shape) goes to the next one or
is dropped, never reused. Noise is independent of the data, so when it is drawn changes nothing about what
a release reveals. Seeded gates (public data, reproducible fits) draw from their own stream in order and
never use this.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from fractions import Fraction

import numpy as np
from numpy.typing import NDArray

from privacy_wall.noise.csprng import private_generator
from privacy_wall.noise.discrete_gaussian import sample_discrete_gaussian

Ints = NDArray[np.int64]

_executor: ThreadPoolExecutor | None = None
_executor_lock = threading.Lock()


def _forget_after_fork() -> None:
    """A forked child has none of its parent's threads: it starts its own (and a lock of its own)."""
    global _executor, _executor_lock
    _executor, _executor_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_after_fork)


def _background() -> ThreadPoolExecutor:
    """This process's one noise thread."""
    global _executor
    with _executor_lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="vips-noise")
        return _executor


def _fresh_draw(sigma2: Fraction, size: int) -> Ints:
    return sample_discrete_gaussian(sigma2, size, private_generator().bit_generator)


class NoiseAhead:
    """Noise for one job's releases. `start()` when a release begins; `draw(sigma2, size)` returns
    N_Z(0, sigma2)^size, exactly: the draw started for it when its shape is the previous release's, else
    one made in line. Not for seeded gates."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._shape: tuple[Fraction, int] | None = None
        self._next: tuple[Fraction, int, Future[Ints]] | None = None

    def start(self) -> None:
        """Begin drawing noise of the previous release's shape for the release about to be computed."""
        with self._lock:
            self._forget_other_process()
            if self._shape is None or self._next is not None:
                return
            try:
                future = _background().submit(_fresh_draw, *self._shape)
            except RuntimeError:  # no thread could start (a memory limit, interpreter exit): draw in line
                return
            self._next = (*self._shape, future)

    def draw(self, sigma2: Fraction, size: int) -> Ints:
        with self._lock:
            self._forget_other_process()
            ahead, self._next = self._next, None
            self._shape = (sigma2, size)
        if ahead is not None and ahead[0] == sigma2 and ahead[1] == size:
            return ahead[2].result()
        return _fresh_draw(sigma2, size)

    def _forget_other_process(self) -> None:
        """A draw started before a fork belongs to the parent's thread: the child never waits for it."""
        if self._pid != os.getpid():
            self._pid, self._next = os.getpid(), None
