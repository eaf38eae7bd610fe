"""The VIPS loop (paper Alg. 2/4), independent of Celery and HTTP.

for t = 1..T: the gate samples S records and releases the noisy expected sufficient statistics of the
E-step at the current expected natural parameters; the model's M-step mixes them in with
rho_t = (tau0 + t)^-kappa.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, Protocol

import numpy as np
import scipy.sparse as sp

from privacy_wall.data.store import Batch
from privacy_wall.gate import Release, noised_means
from privacy_wall.queries.base import Array, Query
from vips.models.base import State, VipsModel
from vips.models.spec import step_size


class Releaser(Protocol):
    """What the loop needs of the gate (or of a store of already-charged releases in front of it)."""

    def release(
        self,
        query: Query,
        params: dict[str, Array],
        *,
        job_id: str,
        iteration: int,
        sigma: float,
        batch_size: int,
    ) -> Release: ...


@dataclass(frozen=True)
class LoopSettings:
    """A job's schedule: T iterations of S records at multiplier sigma, step sizes (tau0 + t)^-kappa."""

    iterations: int
    batch_size: int
    sigma: float
    tau0: float = 0.0
    kappa: float = 1.0

    def __post_init__(self) -> None:
        if self.iterations < 1:
            raise ValueError("iterations must be >= 1")
        if self.batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        if self.tau0 < 0:
            raise ValueError("tau0 must be >= 0")
        if not 0 <= self.kappa <= 1:
            raise ValueError("kappa must be in [0, 1]")


@dataclass
class LoopResult(Generic[State]):
    state: State
    releases: list[Release]


def _rho(settings: LoopSettings, population: int, t: int) -> float:
    """The step size of iteration t. Non-private batch mode (S = N, sigma = 0) is plain VB: rho = 1 reaches
    its fixed point. With noise, (tau0 + t)^-kappa averages the noisy estimates (rho = 1 lets the noise
    feed back through q(alpha))."""
    exact_batch = settings.batch_size >= population and settings.sigma == 0
    return 1.0 if exact_batch else step_size(t, settings.tau0, settings.kappa)


class UnrunnableOptions(ValueError):
    """The job's first update fails on a public stand-in: its options cannot run; nothing was charged."""


def _finite(value: Any) -> bool:
    """Whether every number in `value` is finite: arrays and lists of numbers at once, dicts, other lists
    and dataclass states (a model's state) item by item; other values (strings, None) count as finite."""
    if isinstance(value, np.ndarray):
        return value.dtype.kind not in "fc" or bool(np.all(np.isfinite(value)))
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, Mapping):
        return all(_finite(item) for item in value.values())
    if isinstance(value, list | tuple):
        try:  # a (nested) list of numbers, as posterior documents hold them: checked at once
            return bool(np.all(np.isfinite(np.asarray(value, dtype=np.float64))))
        except (TypeError, ValueError):
            return all(_finite(item) for item in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return all(_finite(getattr(value, field.name)) for field in dataclasses.fields(value))
    return True


def rehearse(
    query: Query, model: VipsModel[State], settings: LoopSettings, *, dimension: int, population: int
) -> None:
    """Run the first iteration on a public stand-in, before anything is charged: the query on one record
    of zeros (a one-word document for bag-of-words queries), the release's noise at the job's sigma drawn
    from a fixed public generator, the post-processing and the model's first update. Options with which
    that update fails or leaves a non-finite number (an overflow, a division by zero: issue 52) raise
    UnrunnableOptions. No sensitive value is read, so the check and its message are public. It costs about
    one iteration's public work (0.6 s for LDA with 50 topics over 20,000 words)."""
    state = model.initial_state(dimension)
    params = model.public_params(state)
    counts = sp.csr_array(([1.0], ([0], [0])), shape=(1, dimension))
    stand_in = Batch(np.zeros((1, dimension)), np.zeros(1), counts)
    generator = np.random.default_rng(0)  # public: the rehearsal's output is never released
    try:
        # One record's sums stand for a batch's mean: the noise is the batch's, at settings.batch_size.
        sums = query.clipped_sums(stand_in, params, generator)
        sums = {name: value * settings.batch_size for name, value in sums.items()}
        statistics, noise_std = noised_means(
            query, sums, settings.batch_size, settings.sigma, dimension, generator
        )
        with np.errstate(all="ignore"):
            state = model.m_step(state, statistics, population, _rho(settings, population, 1), noise_std)
            finite = all(map(_finite, (state, model.public_params(state), model.posterior(state))))
    except (ArithmeticError, ValueError, np.linalg.LinAlgError) as exc:
        raise UnrunnableOptions(
            f"the job's options cannot run: its first update, tried on a public stand-in before anything "
            f"was charged, failed ({type(exc).__name__}: {exc}); nothing was spent"
        ) from exc
    if not finite:
        raise UnrunnableOptions(
            "the job's options cannot run: its first update, tried on a public stand-in before anything "
            "was charged, gives non-finite values (an overflow or a division by zero); nothing was spent"
        )


def run_vips(
    gate: Releaser,
    query: Query,
    model: VipsModel[State],
    settings: LoopSettings,
    *,
    job_id: str,
    dimension: int,
    population: int,
    start: State | None = None,
    first_iteration: int = 1,
    on_iteration: Callable[[int, Release, State], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> LoopResult[State]:
    """Run iterations first_iteration..T from `start` (the prior by default); a fresh run rehearses its
    first iteration on a public stand-in first (rehearse), so options that cannot run charge nothing."""
    if start is None and first_iteration == 1:
        rehearse(query, model, settings, dimension=dimension, population=population)
    state = model.initial_state(dimension) if start is None else start
    releases: list[Release] = []
    for t in range(first_iteration, settings.iterations + 1):
        if should_stop is not None and should_stop():
            break
        rho = _rho(settings, population, t)
        release = gate.release(
            query,
            model.public_params(state),
            job_id=job_id,
            iteration=t,
            sigma=settings.sigma,
            batch_size=settings.batch_size,
        )
        state = model.m_step(state, release.statistics, population, rho, release.noise_std)
        releases.append(release)
        if on_iteration is not None:
            on_iteration(t, release, state)
    return LoopResult(state, releases)
