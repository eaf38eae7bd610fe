"""The protocol every data-touching query follows: declared blocks with per-record bounds, one vectorised
function from a batch and public parameters to clipped per-block sums, and (optionally) a proven joint
sensitivity of the normalised blocks."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from numpy.typing import NDArray

from privacy_wall.data.store import Batch

Array = NDArray[np.float64]

#: Values (rows x columns) a per-record query handles at once (chunked_sums): its temporaries stay near
#: 2 MiB per array, in cache, whatever the batch size. Measured against one pass (10^6 rows of 21
#: columns, one BLAS thread, best of 5): BLR 229 -> 154 ms, linear regression 176 -> 117, DPVI 1826 ->
#: 413, DP-SEP 7268 -> 2292 (logistic) and 289 -> 179 (linear). control.planning.resources mirrors it.
CHUNK_ELEMENTS = 1 << 18
#: Fewer rows than this per chunk would spend more on numpy's per-call overhead than cache saves.
MIN_CHUNK_ROWS = 256


def chunked_sums(
    batch: Batch, sums: Callable[[Batch], dict[str, Array]], rows: int | None = None
) -> dict[str, Array]:
    """`sums(batch)` computed on consecutive chunks of at most `rows` rows and added block by block.

    Equal to one call up to floating-point order when each block is a sum of per-record contributions
    that depend on that record and the public parameters alone (what clipping to a per-record bound needs
    anyway): the sensitivity and the accounting do not change. `rows` defaults to CHUNK_ELEMENTS / d.
    """
    rows = rows or max(MIN_CHUNK_ROWS, CHUNK_ELEMENTS // max(1, batch.features.shape[1]))
    if batch.size <= rows:
        return sums(batch)
    total: dict[str, Array] = {}
    for start in range(0, batch.size, rows):
        for name, value in sums(batch.rows(start, start + rows)).items():
            if name in total:
                total[name] += value
            else:
                total[name] = np.array(value, dtype=np.float64)
    return total


@dataclass(frozen=True)
class Block:
    """One released block: each record contributes a vector of L2 norm <= bound (after clipping).

    Under replace-one neighbours the sum moves by at most 2 C in general, and by sqrt(2) C when every
    contribution is entrywise non-negative or a PSD matrix (then <u, v> >= 0 and
    ||u - v||^2 <= ||u||^2 + ||v||^2). The released mean divides by S.
    """

    name: str
    bound: float
    nonnegative_or_psd: bool = False

    def sensitivity(self, batch_size: int) -> float:
        """L2 sensitivity Delta_b of the block's batch mean under replace-one."""
        factor = math.sqrt(2.0) if self.nonnegative_or_psd else 2.0
        return factor * self.bound / batch_size


class Query(Protocol):
    """A model's E-step behind the wall.

    A query may also define `joint_sensitivity(dimension) -> float`: a proven bound J on the L2 norm of
    the change of the concatenated normalised blocks (block b divided by its Delta_b) under one
    replacement, when its blocks cannot all reach their bounds at once. It is optional (read through
    `joint_sensitivity` below), and without it J = sqrt(B). The proof belongs in the query's docstring.
    """

    name: str

    def blocks(self, dimension: int) -> tuple[Block, ...]:
        """The released blocks for data of this dimension, with their per-record bounds."""
        ...

    def validate_params(self, params: dict[str, Array], dimension: int) -> None:
        """Raise ValueError (naming the parameter, never data) if public parameters are malformed."""
        ...

    def clipped_sums(
        self, batch: Batch, params: dict[str, Array], rng: np.random.Generator
    ) -> dict[str, Array]:
        """Per-block sums over the batch of per-record contributions, each clipped to its bound.

        `rng` is the release's generator (the OS's CSPRNG on private data), for queries that randomise
        inside the wall (LDA resamples documents). A query must draw from it a number of values that does
        not depend on the data, and each record's randomness must not depend on the other records, so
        that replacing one record leaves every other record's contribution unchanged.
        """
        ...

    def postprocess(self, noised_means: dict[str, Array], dimension: int) -> dict[str, Array]:
        """Data-independent post-processing of the noised means (e.g. mirror and PSD projection)."""
        ...


def joint_sensitivity(query: Query, dimension: int) -> float:
    """The query's declared joint sensitivity J of its normalised blocks, sqrt(B) if it declares none.

    Raises ValueError unless 0 < J <= sqrt(B): sqrt(B) always holds (each normalised block moves by at most
    1), so a larger declaration is an error, not a proof.
    """
    ceiling = math.sqrt(len(query.blocks(dimension)))
    declare = getattr(query, "joint_sensitivity", None)
    if declare is None:
        return ceiling
    value = float(declare(dimension))
    if not 0 < value <= ceiling:
        raise ValueError(f"query {query.name}: joint sensitivity {value} is not in (0, sqrt(B) = {ceiling}]")
    return value
