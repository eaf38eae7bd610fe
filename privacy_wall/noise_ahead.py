"""A job's exact noise drawn one release ahead, on a background thread.

A job's releases share their grid from one iteration to the next: the discrete Gaussian's parameter sigma2
and the release's size d are public functions of sigma and the model's shape (`fixed_point_grid`). So while
one release's sums, and then the model's M-step, are computed, the next release's noise N_Z(0, sigma2)^d can
already be drawn: the compiled sampler runs without the GIL, on a second core when one is free. The work
is the same (CPU time per iteration is unchanged); the wait is not.

Privacy: each draw comes from its own `private_generator()` (a fresh 128-bit AES key from the operating
system) and is handed to at most one release, then forgotten; a draw whose (sigma2, size) does not match
the release that asks is dropped unused, and so is the one left over when the job ends. Noise is independent
of the data, so when it is drawn changes nothing about what a release reveals. Seeded gates (public data,
reproducible fits) draw from their own stream in order and never use this.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from fractions import Fraction

import numpy as np
from numpy.typing import NDArray

from privacy_wall.discrete_gaussian import sample_discrete_gaussian

Ints = NDArray[np.int64]

_executor: ThreadPoolExecutor | None = None
_executor_pid = 0
_executor_lock = threading.Lock()


def _background() -> ThreadPoolExecutor:
    """This process's one noise thread (made anew after a fork: a parent's thread does not survive it)."""
    global _executor, _executor_pid
    with _executor_lock:
        if _executor is None or _executor_pid != os.getpid():
            _executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="vips-noise")
            _executor_pid = os.getpid()
        return _executor


def _fresh_draw(sigma2: Fraction, size: int) -> Ints:
    from privacy_wall.mechanisms import private_generator  # mechanisms imports this module

    return sample_discrete_gaussian(sigma2, size, private_generator().bit_generator)


class NoiseAhead:
    """Noise for one job's releases: `draw(sigma2, size)` returns N_Z(0, sigma2)^size, exactly, and starts
    drawing the next one of the same shape in the background. Not for seeded gates."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._next: tuple[Fraction, int, Future[Ints]] | None = None

    def draw(self, sigma2: Fraction, size: int) -> Ints:
        with self._lock:
            ahead, self._next = self._next, None
            if ahead is not None and ahead[0] == sigma2 and ahead[1] == size:
                noise = ahead[2].result()
            else:
                if ahead is not None:
                    ahead[2].cancel()  # a different grid: that draw is never used
                noise = _fresh_draw(sigma2, size)
            self._next = (sigma2, size, _background().submit(_fresh_draw, sigma2, size))
            return noise

    def close(self) -> None:
        """Drop the draw made ahead (the job is over)."""
        with self._lock:
            ahead, self._next = self._next, None
        if ahead is not None:
            ahead[2].cancel()
