"""Text documents to bag-of-words counts over a public vocabulary (`vips data prepare-text`).

Words are vips.tokens' (NFKC, lower case, maximal runs of letters). A word counts when the vocabulary has
it; every other word is out of vocabulary and is only ever totalled (how many, what share), never listed:
the texts are sensitive, the vocabulary is public.
"""

from __future__ import annotations

from array import array
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from vips.tokens import tokenize


@dataclass(frozen=True, eq=False)
class Counts:
    """Documents x vocabulary word counts (CSR, int32) and the aggregate totals that may be reported."""

    matrix: sp.csr_array
    tokens: int
    out_of_vocabulary: int

    @property
    def documents(self) -> int:
        return int(self.matrix.shape[0])

    @property
    def kept(self) -> int:
        return self.tokens - self.out_of_vocabulary

    @property
    def empty_documents(self) -> int:
        return int(np.count_nonzero(np.diff(self.matrix.indptr) == 0))


def count_documents(texts: Iterable[str], vocabulary: Sequence[str]) -> Counts:
    """Each text's in-vocabulary word counts (one row per text, in order) and the corpus's totals."""
    index = {word: i for i, word in enumerate(vocabulary)}
    # compact arrays, not lists of ints: a large corpus's entries take 4 bytes each while they are counted
    indptr, ids, values = array("q", [0]), array("i"), array("i")
    tokens = out = 0
    for text in texts:
        words = tokenize(text)
        counter = Counter(index[w] for w in words if w in index)
        tokens += len(words)
        out += len(words) - sum(counter.values())
        for word, count in sorted(counter.items()):
            ids.append(word)
            values.append(count)
        indptr.append(len(ids))
    matrix = sp.csr_array(
        (
            np.frombuffer(values, dtype=np.int32),
            np.frombuffer(ids, dtype=np.int32),
            np.frombuffer(indptr, dtype=np.int64),
        ),
        shape=(len(indptr) - 1, len(vocabulary)),
    )
    return Counts(matrix, tokens, out)


def frequent_words(texts: Iterable[str], size: int) -> tuple[str, ...]:
    """The `size` most frequent words of (public!) texts, by total count, ties in alphabetical order;
    returned in alphabetical order (word ids then do not depend on the counts)."""
    frequency: Counter[str] = Counter()
    for text in texts:
        frequency.update(tokenize(text))
    ranked = sorted(frequency, key=lambda word: (-frequency[word], word))
    return tuple(sorted(ranked[:size]))
