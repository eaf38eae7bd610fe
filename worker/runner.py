"""The VIPS loop (paper Alg. 2/4), independent of Celery and HTTP.

for t = 1..T: the gate samples S records and releases the noisy expected sufficient statistics of the
E-step at the current expected natural parameters; the model's M-step mixes them in with
rho_t = (tau0 + t)^-kappa.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, Protocol

from privacy_wall.gate import Release
from privacy_wall.queries.base import Array, Query
from worker.models.base import State, VipsModel, step_size


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
    """Run iterations first_iteration..T from `start` (the prior by default)."""
    state = model.initial_state(dimension) if start is None else start
    releases: list[Release] = []
    for t in range(first_iteration, settings.iterations + 1):
        if should_stop is not None and should_stop():
            break
        # Non-private batch mode (S = N, sigma = 0) is plain VB: rho = 1 reaches its fixed point. With noise,
        # (tau0 + t)^-kappa averages the noisy estimates (rho = 1 lets the noise feed back through q(alpha)).
        exact_batch = settings.batch_size >= population and settings.sigma == 0
        rho = 1.0 if exact_batch else step_size(t, settings.tau0, settings.kappa)
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
