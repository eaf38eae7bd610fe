"""`vips data prepare-text` (issue 24 item 5): texts to docword/vocab files that `data ingest --kind bow`
accepts, over a public vocabulary, with out-of-vocabulary words reported in aggregate only."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import numpy as np
import pytest

from privacy_wall.data.docword import read_docword, read_vocabulary
from privacy_wall.data.vocabulary import public_words
from tests.test_cli import run_error
from vips.bow import count_documents, frequent_words
from vips.cli import main
from vips.tokens import tokenize, unmatchable

SECRET = "zanzibarquux"  # an out-of-vocabulary word of the sensitive texts: it must never come out
VOCABULARY = ["cat", "dog", "fish", "café", "straße"]


def test_tokenize_follows_the_documented_rules() -> None:
    assert tokenize("The CAT's dog-fish, 3 fish!") == ["the", "cat", "s", "dog", "fish", "fish"]
    assert tokenize("Ｃａｆé ﬁsh x2y") == ["café", "fish", "x", "y"]  # NFKC: full width, ligature, digits
    assert tokenize("cafe\u0301 हिन्दी") == ["café", "हिन्दी"]  # combining marks stay in their word
    assert tokenize("STRASSE Straße") == ["strasse", "straße"]  # lower case, not case folding
    assert unmatchable(["cat", "Dog", "e-mail", "b2b", "fish"]) == 3


def test_counts_and_frequent_words() -> None:
    counts = count_documents(["cat cat dog", "nothing here", "Fish"], ["cat", "dog", "fish"])
    assert counts.matrix.toarray().tolist() == [[2, 1, 0], [0, 0, 0], [0, 0, 1]]
    assert (counts.tokens, counts.out_of_vocabulary, counts.kept, counts.empty_documents) == (6, 2, 4, 1)
    assert frequent_words(["b b a c", "c b"], 2) == ("b", "c")  # by count, ties alphabetical, then sorted


def _corpus(root: Path) -> Path:
    folder = root / "texts"
    (folder / "sub").mkdir(parents=True)
    (folder / "a.txt").write_text(f"The cat and the dog. {SECRET}!\n", encoding="utf-8")
    (folder / "sub" / "b.txt").write_text("\ufeffFISH fish, Café; STRAẞE\n", encoding="utf-8")
    (folder / "c.txt").write_text(f"{SECRET} only\n", encoding="utf-8")
    (folder / "notes.md").write_text("cat cat cat\n")  # not a .txt file: not a document
    return folder


def test_a_folder_of_texts_becomes_files_that_ingest_accepts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = _corpus(tmp_path)
    vocab = tmp_path / "public_vocab.txt"
    vocab.write_text("\n".join(VOCABULARY) + "\n", encoding="utf-8")
    prefix = tmp_path / "out" / "corpus"
    prefix.parent.mkdir()
    argv = ["data", "prepare-text", "--vocab", str(vocab), "--input-dir", str(folder), "-o", str(prefix)]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    summary = json.loads(out)
    assert summary["documents"] == 3 and summary["tokens"] == 12 and summary["out_of_vocabulary"] == 6
    assert summary["empty_documents"] == 1 and summary["out_of_vocabulary_share"] == pytest.approx(0.5)
    docword, vocab_out = Path(summary["docword"]), Path(summary["vocab"])
    assert (docword, vocab_out) == (Path(f"{prefix}.docword.txt"), Path(f"{prefix}.vocab.txt"))
    # documents in sorted path order: a.txt, c.txt, sub/b.txt; the vocabulary as given
    words = read_vocabulary(vocab_out)
    assert list(words) == VOCABULARY
    corpus = read_docword(docword, words)
    assert corpus.documents == 3 and np.diff(corpus.indptr).tolist() == [2, 0, 3]
    assert corpus.word_ids.tolist() == [0, 1, 2, 3, 4] and corpus.counts.tolist() == [1, 1, 2, 1, 1]
    # no text of the sensitive corpus anywhere but as counts over the public vocabulary
    for text in (out, err, docword.read_text(), vocab_out.read_text()):
        assert SECRET not in text
    assert "6 of them" in err and "50.0%" in err
    # a list the custodian gives is public only by their word: ingest will ask them to say so
    assert summary["vocabulary_source"] is None and "--vocab-is-public" in err
    # the counts are sensitive: written private to their owner, whatever the umask
    assert stat.S_IMODE(docword.stat().st_mode) & 0o077 == 0

    home = tmp_path / "home"
    monkeypatch.setenv("VIPS_HOME", str(home))
    for name in ("VIPS_CONTROL_DATABASE_URL", "VIPS_SENSITIVE_DATABASE_URL", "VIPS_BROKER_URL"):
        monkeypatch.delenv(name, raising=False)
    assert main(["migrate", "all"]) == 0
    capsys.readouterr()
    ingest = ["data", "ingest", "texts", "--kind", "bow", "--input", str(docword), "--vocab", str(vocab_out)]
    assert main(ingest) == 2  # refused: nothing says this list is public, and analysts would see it
    refusal = capsys.readouterr().err
    assert "--vocab-is-public" in refusal and "prepare-text --vocab-size" in refusal
    assert not any(word in refusal for word in VOCABULARY)  # the message names no word
    assert main([*ingest, "--vocab-is-public"]) == 0, capsys.readouterr().err
    stored = json.loads(capsys.readouterr().out)
    assert (stored["kind"], stored["population"], stored["dimension"]) == ("bow", 3, len(VOCABULARY))
    assert stored["vocabulary_source"] == "declared public by the custodian"


def test_the_default_vocabulary_is_wordfreqs_and_ingest_takes_it_as_public(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without --vocab or --vocab-from the vocabulary is wordfreq's --vocab-size most frequent English words
    (public by construction), which `data ingest` recognises without a confirmation."""
    folder = _corpus(tmp_path)
    prefix = tmp_path / "corpus"
    assert (
        main(["data", "prepare-text", "--vocab-size", "300", "--input-dir", str(folder), "-o", str(prefix)])
        == 0
    )
    out, err = capsys.readouterr()
    summary = json.loads(out)
    words = read_vocabulary(Path(summary["vocab"]))
    assert words == public_words(300) and words[:3] == ("the", "to", "and")
    assert "wordfreq" in summary["vocabulary_source"] and "--vocab-is-public" not in err
    assert (
        read_docword(Path(summary["docword"]), words).counts.sum()
        == summary["tokens"] - summary["out_of_vocabulary"]
    )
    monkeypatch.setenv("VIPS_HOME", str(tmp_path / "home"))
    for name in ("VIPS_CONTROL_DATABASE_URL", "VIPS_SENSITIVE_DATABASE_URL", "VIPS_BROKER_URL"):
        monkeypatch.delenv(name, raising=False)
    assert main(["migrate", "all"]) == 0
    capsys.readouterr()
    ingest = [
        "data",
        "ingest",
        "t",
        "--kind",
        "bow",
        "--input",
        summary["docword"],
        "--vocab",
        summary["vocab"],
    ]
    assert main(ingest) == 0, capsys.readouterr().err
    stored = json.loads(capsys.readouterr().out)
    assert stored["vocabulary_source"] == summary["vocabulary_source"]
    # the confirmation belongs to a new bag-of-words dataset's vocabulary
    assert (
        main(["data", "ingest", "u", "--kind", "tabular", "--input", summary["docword"], "--vocab-is-public"])
        == 2
    )
    assert "--vocab-is-public confirms" in capsys.readouterr().err


def test_a_csv_column_and_a_vocabulary_from_a_public_corpus(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    texts = tmp_path / "notes.csv"
    texts.write_text(f'id,text\n1,"dog dog\ncat"\n2,{SECRET} fish\n\n', encoding="utf-8")
    public = tmp_path / "public"
    public.mkdir()
    (public / "p.txt").write_text("dog dog dog cat cat bird\n")
    prefix = tmp_path / "notes"
    argv = ["data", "prepare-text", "--input-csv", str(texts), "--text-column", "text", "-o", str(prefix)]
    assert main([*argv, "--vocab-from", str(public), "--vocab-size", "2"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert (summary["documents"], summary["vocabulary"], summary["out_of_vocabulary"]) == (2, 2, 2)
    assert read_vocabulary(Path(f"{prefix}.vocab.txt")) == ("cat", "dog")

    # never a vocabulary built from the sensitive texts themselves
    err = run_error(capsys, [*argv, "--vocab-from", str(texts)])
    assert "public" in err and SECRET not in err
    folder = _corpus(tmp_path / "x")
    overlap = ["data", "prepare-text", "--input-dir", str(folder), "-o", str(prefix)]
    assert "overlaps" in run_error(capsys, [*overlap, "--vocab-from", str(folder / "sub")])
    err = run_error(
        capsys, [*argv[:-4], "--text-column", "body", "-o", str(prefix), "--vocab-from", str(public)]
    )
    assert "no column 'body'" in err


def test_prepare_text_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    vocab = tmp_path / "v.txt"
    vocab.write_text("cat\n")
    base = ["data", "prepare-text", "--vocab", str(vocab), "-o", str(tmp_path / "p")]
    assert "--text-column" in run_error(capsys, [*base, "--input-csv", str(vocab)])
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "no .txt files" in run_error(capsys, [*base, "--input-dir", str(empty)])
    assert "--vocab-size" in run_error(capsys, [*base, "--input-dir", str(tmp_path), "--vocab-size", "3"])
    bad = tmp_path / "bad" / "x.txt"
    bad.parent.mkdir()
    bad.write_bytes(b"cat \xff\xfe secret")
    err = run_error(capsys, [*base, "--input-dir", str(bad.parent)])
    assert "not UTF-8" in err and "secret" not in err
    assert main(["data", "prepare-text", "--help"]) == 0
    assert "NFKC" in capsys.readouterr().out
