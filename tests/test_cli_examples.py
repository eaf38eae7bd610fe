"""`vips data examples`: the bundled public datasets written as files that the readers of `vips data ingest`
and `vips fit --local` read back as the datasets themselves; an existing file is never replaced."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from privacy_wall.data.docword import read_docword, read_vocabulary
from privacy_wall.data.formats import read_tabular_csv
from vips.cli import main
from vips.datasets.adult import load_adult
from vips.datasets.wikipedia import load_wikipedia


@pytest.mark.slow
def test_the_examples_read_back_as_the_bundled_datasets(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "new" / "examples"  # made if missing
    assert main(["data", "examples", "--output", str(folder)]) == 0
    out, err = capsys.readouterr()
    paths = {key: Path(value) for key, value in json.loads(out).items()}
    assert set(paths) == {"adult_train", "adult_test", "wiki_docword", "wiki_vocab", "wiki_test_docword"}
    assert sorted(p.name for p in folder.iterdir()) == sorted(p.name for p in paths.values())  # no leftovers
    for split in ("train", "test"):
        expected = load_adult(split)
        table = read_tabular_csv(paths[f"adult_{split}"], "label")
        np.testing.assert_array_equal(table.features, expected.features)  # %.17g: bit for bit
        np.testing.assert_array_equal(table.labels, expected.labels)
    corpus = load_wikipedia()
    vocabulary = read_vocabulary(paths["wiki_vocab"])
    assert vocabulary == corpus.vocabulary
    for key, expected in (("wiki_docword", corpus.train), ("wiki_test_docword", corpus.test)):
        read = read_docword(paths[key], vocabulary)
        assert read.documents == expected.shape[0]
        np.testing.assert_array_equal(read.indptr, expected.indptr)
        np.testing.assert_array_equal(read.word_ids, expected.indices)
        np.testing.assert_array_equal(read.counts, expected.data)
    assert "vips data ingest adult" in err


def test_existing_files_are_never_replaced(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "wiki.vocab.txt").write_text("mine\n")
    assert main(["data", "examples", "--output", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "wiki.vocab.txt" in err and "already exist" in err
    assert [p.name for p in tmp_path.iterdir()] == ["wiki.vocab.txt"]  # nothing else written
    assert (tmp_path / "wiki.vocab.txt").read_text() == "mine\n"
