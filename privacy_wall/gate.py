"""The gate: the only function that returns anything computed from sensitive rows.

`Gate.release` samples exactly S rows uniformly, runs the query, divides the clipped sums by S, adds one
Gaussian mechanism's noise (multiplier sigma over the normalised blocks; in fixed point, exact discrete
Gaussian noise on a public grid: privacy_wall.noise.mechanisms.release_blocks), post-processes, and returns;
the iteration's charge is written to the ledger before any of this happens (write-ahead), and a refused
charge means nothing is computed. A release whose computation fails for a reason that cannot depend on
the rows' values (the sensitive database unreadable, memory exhausted on data of public shapes) is
withdrawn from the ledger: nothing of it left the wall, so charges = releases (so is a release whose
fixed-point grid cannot be made for its sigma and size, a GridError: public facts); any other failure, or a
withdrawal that fails, keeps the charge (the ledger only ever over-counts). Sampling and noise draw from a
CSPRNG-seeded generator (the noise on a background thread while the sums are computed:
privacy_wall.noise.draw_ahead); a seed or sigma = 0 is accepted only for datasets marked public. A private
dataset's release is handed back a whole number of slots after its charge (privacy_wall.timing), so what
the analyst sees of its time carries no data.

With shards (privacy_wall.shards), a full pass's clipped sums are added from the shard workers instead of
computed here: the same sum over the population of the same per-record clipped contributions (equal up
to floating-point order), so the blocks' sensitivities, the one charge and the one noise draw per
iteration are those of the unsharded release, whatever the number of shards. A uniform minibatch is
sampled here; its rows are summed here when the store holds the data in memory, else by the shards that
hold them (each over the sampled ids in its range: again the same sum).
"""

from __future__ import annotations

import logging
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from privacy_wall.accounting.events import SubsampledGaussianEvent
from privacy_wall.data.store import RowStore, uniform_rows
from privacy_wall.ledger.base import Charge, Ledger
from privacy_wall.noise.csprng import private_generator
from privacy_wall.noise.draw_ahead import NoiseAhead
from privacy_wall.noise.mechanisms import Array, GridError, fixed_point_grid, release_blocks
from privacy_wall.queries.base import Query, joint_sensitivity
from privacy_wall.sampling import ShuffledPasses
from privacy_wall.timing import StandInRelease, hold, release_slot

if TYPE_CHECKING:  # SQLAlchemy behind it: a gate without shards (`vips fit --local`) never loads it
    from privacy_wall.shards import ShardedSums

log = logging.getLogger(__name__)


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
    attempt: int = 0  # the ledger's (job, iteration, attempt) key of its charge


def noised_means(
    query: Query,
    sums: dict[str, Array],
    batch_size: int,
    sigma: float,
    dimension: int,
    noise: np.random.Generator | NoiseAhead,
) -> tuple[dict[str, Array], dict[str, float]]:
    """(post-processed statistics, noise std per block) of clipped sums over `batch_size` records: their
    means with one Gaussian mechanism of multiplier sigma over the query's blocks at their sensitivities
    (joint sensitivity sqrt(B) unless the query proves less). The gate's release, and the loop's public
    rehearsal of it (vips.runner.rehearse)."""
    sensitivities = {b.name: b.sensitivity(batch_size) for b in query.blocks(dimension)}
    means = {name: value / batch_size for name, value in sums.items()}
    joint = joint_sensitivity(query, dimension)
    noised = release_blocks(means, sensitivities, sigma, noise, joint_sensitivity=joint)
    return query.postprocess(noised.values, dimension), noised.noise_std


def _stand_in_release(query: Query, params: dict[str, Array], sigma: float) -> StandInRelease:
    """The gate's release code (sample, clipped sums, noise, post-processing) run on a public stand-in
    store for timing: a public generator, nothing charged, the output discarded."""

    def release(store: RowStore, records: int) -> object:
        generator = np.random.default_rng(0)
        sums = query.clipped_sums(store.sample(records, generator), params, generator)
        return noised_means(query, sums, records, sigma, store.info.dimension, generator)

    return release


class Gate:
    """Releases of one dataset, charged to one ledger."""

    def __init__(
        self,
        store: RowStore,
        ledger: Ledger,
        *,
        seed: int | None = None,
        passes: bool = False,
        shards: ShardedSums | None = None,
        shard_minibatches: bool = False,
        padded: bool = True,
    ) -> None:
        """`passes`: minibatches in shuffled passes over the rows (privacy_wall.sampling), for non-private
        fits (sigma = 0) of public data only; otherwise every minibatch is drawn uniformly. `shards`: full
        passes summed by shard workers (unseeded gates only: each shard draws its own randomness), and
        uniform minibatches too with `shard_minibatches` (for data the store cannot hold in memory).
        `padded` (the default): each release of a private dataset is held to its slot (privacy_wall.timing),
        so its visible time carries no data; False only where nobody but the data's holder sees the times
        (an in-process fit)."""
        info = store.info
        if seed is not None and not info.public:
            raise PrivacyError(f"dataset {info.name} is private: its releases cannot be seeded")
        if passes and not info.public:
            raise PrivacyError(f"dataset {info.name} is private: its minibatches are drawn uniformly")
        self._store = store
        self._ledger = ledger
        self._seeded = np.random.default_rng(seed) if seed is not None else None
        self._passes = ShuffledPasses() if passes else None
        if shards is not None and seed is not None:
            raise ValueError("a seeded gate computes every release itself: shards draw their own randomness")
        self._shards = shards
        self._shard_minibatches = shard_minibatches and shards is not None
        # Unseeded releases' noise is drawn while their sums are computed (privacy_wall.noise.draw_ahead).
        self._noise = NoiseAhead() if seed is None else None
        self._padded = padded and not info.public  # a public dataset's times have nothing to hide
        self._slot: tuple[Query, int, float, float] | None = None  # (query, S, sigma, its slot)

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
        if sigma > 0:
            fixed_point_grid(sigma, 1)  # sigma within the fixed-point range: refused before any charge
        slot = self._release_slot(query, params, batch_size, sigma) if self._padded else None
        charge = Charge(
            info.name, job_id, iteration, SubsampledGaussianEvent(sigma, batch_size, info.population), attempt
        )
        self._ledger.commit(charge)
        started = time.perf_counter()
        try:
            return self._compute(query, params, charge)
        except Exception as exc:
            if self._tells_nothing_of_the_values(exc):
                self._withdraw(charge)
            raise
        finally:
            if slot is not None:  # a failure's time is held too: the job's end is as visible as a release
                slots = hold(started, slot)
                if slots > 1:
                    log.info("job %s: release %d overran its %.3f s slot", job_id, iteration, slot)

    def _release_slot(self, query: Query, params: dict[str, Array], batch_size: int, sigma: float) -> float:
        """The slot of this query's releases of `batch_size` records at `sigma` (privacy_wall.timing),
        calibrated on a public stand-in at the first such release, before its charge."""
        cached = self._slot
        if cached is not None and cached[0] is query and cached[1:3] == (batch_size, sigma):
            return cached[3]
        slot = release_slot(self._store.info, batch_size, _stand_in_release(query, params, sigma))
        self._slot = (query, batch_size, sigma, slot)
        return slot

    def _tells_nothing_of_the_values(self, failure: Exception) -> bool:
        """Whether a failure of the computation is independent of the rows' values, so that dropping the
        release unseen, and its charge with it, leaves everything the analyst sees (the job failed) a
        function of public facts: the sensitive database could not be read, or memory ran out on data
        whose arrays have public shapes (not bag-of-words: the lengths of the sampled documents are
        data), or shard workers did not answer in time on such data (their work has public shapes too),
        or no fixed-point grid exists for the release's sigma and size (GridError, raised from those
        two public numbers only, before any noise is drawn). Anything else (a numerical error, an unknown
        one) keeps its charge."""
        database = sys.modules.get("sqlalchemy.exc")  # not loaded: no database error can have occurred
        if database is not None and isinstance(failure, database.OperationalError | database.InterfaceError):
            return True
        if isinstance(failure, GridError):
            return True
        shards = sys.modules.get("privacy_wall.shards")  # not loaded: no shard was asked
        unanswered = shards is not None and isinstance(failure, shards.ShardsUnavailable)
        return (isinstance(failure, MemoryError) or unanswered) and self._store.info.kind != "bow"

    def withdraw(self, release: Release) -> None:
        """The caller dropped `release` without storing or showing it (it could not be stored): remove its
        charge. Only for a release of which no copy survives anywhere."""
        info = self._store.info
        event = SubsampledGaussianEvent(release.sigma, release.batch_size, info.population)
        self._withdraw(Charge(info.name, release.job_id, release.iteration, event, release.attempt))

    def _withdraw(self, charge: Charge) -> None:
        try:
            self._ledger.withdraw(charge)
        except Exception:  # the charge stays: over-counted, never under-counted
            log.warning(
                "job %s: the charge of release %d (attempt %d) could not be withdrawn; it stays charged",
                charge.job_id,
                charge.iteration,
                charge.attempt,
                exc_info=True,
            )

    def _compute(self, query: Query, params: dict[str, Array], charge: Charge) -> Release:
        """Sample, compute, clip, noise and post-process the release `charge` paid for."""
        info = self._store.info
        batch_size, sigma = charge.event.sample_size, charge.event.noise_multiplier
        rng = self._generator()
        if self._noise is not None:
            self._noise.start()  # its noise, drawn while the sums are computed
        full = batch_size == info.population
        if self._shards is not None and self._passes is None and (full or self._shard_minibatches):
            sums = self._shards.clipped_sums(
                params,
                job_id=charge.job_id,
                iteration=charge.iteration,
                attempt=charge.attempt,
                rows=None if full else np.sort(np.asarray(uniform_rows(info.population, batch_size, rng))),
            )
        else:
            if self._passes is None:
                batch = self._store.sample(batch_size, rng)
            else:
                batch = self._store.take(self._passes.next_rows(info.population, batch_size, rng))
            sums = query.clipped_sums(batch, params, rng)
        noise = rng if self._noise is None else self._noise
        statistics, noise_std = noised_means(query, sums, batch_size, sigma, info.dimension, noise)
        return Release(
            job_id=charge.job_id,
            iteration=charge.iteration,
            statistics=statistics,
            noise_std=noise_std,
            sigma=sigma,
            batch_size=batch_size,
            population=info.population,
            attempt=charge.attempt,
        )
