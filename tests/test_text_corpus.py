"""bench.text_corpus: a public CSV text corpus as bench.lda's held-out check (--text-csv)."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

from bench.text_corpus import text_corpus


def _write(path: Path, texts: list[str]) -> Path:
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["id", "text"])
        for i, text in enumerate(texts):
            writer.writerow([i, text])
    return path


def test_split_vocabulary_and_counts(tmp_path: Path) -> None:
    texts = [f"The river flows; river {i} and the bank, a bank of rivers." for i in range(10)]
    texts += ["", "   "]
    corpus = text_corpus(_write(tmp_path / "c.csv", texts), size=3)
    # 10 non-blank texts: 8 training, 2 test (80 / 20); blank rows are not documents.
    assert corpus.train.shape == (8, 3)
    assert corpus.test.shape == (2, 3)
    # Stop words ("the", "and", "of", "a") and digits never count; ids are alphabetical.
    assert all(word not in {"the", "and", "of", "a"} for word in corpus.vocabulary)
    assert list(corpus.vocabulary) == sorted(corpus.vocabulary)
    assert len(corpus.vocabulary) == 3
    # The training half decides the vocabulary: "river" and "bank" are in every river text.
    assert {"river", "bank"} <= set(corpus.vocabulary)
    column = corpus.vocabulary.index("river")
    row = corpus.train.toarray()
    assert np.all(row[:, column][row.sum(axis=1) > 0] >= 1)
    assert corpus.name == "c"


def test_missing_column_names_it(tmp_path: Path) -> None:
    path = _write(tmp_path / "c.csv", ["a text"])
    with pytest.raises(SystemExit, match="no column 'body'"):
        text_corpus(path, column="body")
