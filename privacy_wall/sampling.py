"""How the gate chooses a minibatch's rows when it does not draw them uniformly.

Every release with noise uses uniform sampling: S distinct rows drawn uniformly at random, independently
for each iteration (`store.sample`), the subsampled Gaussian mechanism the accountant analyses (docs/design.md
section 2). `ShuffledPasses` is for non-private fits of public data only (the gate refuses it otherwise):
consecutive slices of a fresh random permutation for each pass over the data, as online variational Bayes
libraries (scikit-learn, gensim, onlineldavb) process a corpus, so every row is used once per pass.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray


class ShuffledPasses:
    """Rows in passes: each pass a fresh permutation (from the release's generator), cut into batches.

    A batch that straddles two passes takes the rest of the old pass and the first rows of the new one that
    it does not already hold; the new pass starts with those rows, so each pass still uses every row once
    and every batch holds distinct rows.
    """

    def __init__(self) -> None:
        self._order: NDArray[np.int64] | None = None
        self._position = 0

    def next_rows(self, population: int, size: int, rng: np.random.Generator) -> NDArray[np.int64]:
        if not 0 < size <= population:
            raise ValueError(f"batch size must be between 1 and the population {population}")
        if self._order is None or self._order.shape[0] != population:
            self._order, self._position = rng.permutation(population).astype(np.int64), 0
        rest = self._order[self._position : self._position + size]
        self._position += rest.shape[0]
        if rest.shape[0] == size:
            return rest
        fresh = rng.permutation(population).astype(np.int64)
        fill = fresh[~np.isin(fresh, rest)][: size - rest.shape[0]]
        self._order = np.concatenate([fill, fresh[~np.isin(fresh, fill)]])
        self._position = fill.shape[0]
        return np.concatenate([rest, fill])
