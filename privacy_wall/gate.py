"""The gate: the only function that returns anything computed from sensitive rows.

`Gate.release` samples exactly S rows uniformly, runs the query, divides the clipped sums by S, adds one
Gaussian mechanism's noise (multiplier sigma over the normalised blocks), post-processes, and returns;
the iteration's charge is written to the ledger before any of this happens (write-ahead), and a refused
charge means nothing is computed. Sampling and noise draw from a CSPRNG-seeded generator; a seed or
sigma = 0 is accepted only for datasets marked public.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from privacy_wall.accounting import SubsampledGaussianEvent
from privacy_wall.ledger import Charge, Ledger
from privacy_wall.mechanisms import Array, private_generator, release_blocks
from privacy_wall.queries.base import Query, joint_sensitivity
from privacy_wall.sampling import ShuffledPasses
from privacy_wall.store import RowStore


class PrivacyError(ValueError):
    """A request that would weaken a privacy invariant (seeding or sigma = 0 on private data)."""


@dataclass(frozen=True)
class Release:
    """What leaves the wall for one iteration: noised, post-processed batch means and their provenance."""

    job_id: str
    iteration: int
    statistics: dict[str, Array]
    noise_std: dict[str, float]
    sigma: float
    batch_size: int
    population: int


class Gate:
    """Releases of one dataset, charged to one ledger."""

    def __init__(
        self, store: RowStore, ledger: Ledger, *, seed: int | None = None, passes: bool = False
    ) -> None:
        """`passes`: minibatches in shuffled passes over the rows (privacy_wall.sampling), for non-private
        fits (sigma = 0) of public data only; otherwise every minibatch is drawn uniformly."""
        info = store.info
        if seed is not None and not info.public:
            raise PrivacyError(f"dataset {info.name} is private: its releases cannot be seeded")
        if passes and not info.public:
            raise PrivacyError(f"dataset {info.name} is private: its minibatches are drawn uniformly")
        self._store = store
        self._ledger = ledger
        self._seeded = np.random.default_rng(seed) if seed is not None else None
        self._passes = ShuffledPasses() if passes else None

    @property
    def population(self) -> int:
        return self._store.info.population

    def _generator(self) -> np.random.Generator:
        return self._seeded if self._seeded is not None else private_generator()

    def release(
        self,
        query: Query,
        params: dict[str, Array],
        *,
        job_id: str,
        iteration: int,
        sigma: float,
        batch_size: int,
        attempt: int = 0,
    ) -> Release:
        """Charge (job, iteration, attempt), then sample, compute, clip, noise and post-process."""
        info = self._store.info
        if not sigma >= 0 or not np.isfinite(sigma):
            raise ValueError("sigma must be a finite number >= 0")
        if sigma == 0 and not info.public:
            raise PrivacyError(f"dataset {info.name} is private: sigma = 0 is not allowed")
        if self._passes is not None and sigma != 0:
            raise PrivacyError("shuffled passes have no privacy analysis: they are only for sigma = 0")
        if not 0 < batch_size <= info.population:
            raise ValueError(f"batch size must be between 1 and the population {info.population}")
        query.validate_params(params, info.dimension)
        event = SubsampledGaussianEvent(sigma, batch_size, info.population)
        self._ledger.commit(Charge(info.name, job_id, iteration, event, attempt))

        rng = self._generator()
        if self._passes is None:
            batch = self._store.sample(batch_size, rng)
        else:
            batch = self._store.take(self._passes.next_rows(info.population, batch_size, rng))
        blocks = query.blocks(info.dimension)
        sums = query.clipped_sums(batch, params, rng)
        means = {name: value / batch_size for name, value in sums.items()}
        sensitivities = {b.name: b.sensitivity(batch_size) for b in blocks}
        joint = joint_sensitivity(query, info.dimension)  # sqrt(B) unless the query proves less
        noised = release_blocks(means, sensitivities, sigma, rng, joint_sensitivity=joint)
        return Release(
            job_id=job_id,
            iteration=iteration,
            statistics=query.postprocess(noised.values, info.dimension),
            noise_std=noised.noise_std,
            sigma=sigma,
            batch_size=batch_size,
            population=info.population,
        )
