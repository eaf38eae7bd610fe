"""`vips fit --local`, `vips predict` and `vips evaluate` for LDA (UCI docword + vocabulary) and the sigmoid
belief network (0/1 CSV): in-process fits through the same gate and accountant, and bad input as one-line
errors."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.test_cli import run_error, run_ok
from vips.cli import main
from vips.commands.predict import warn_if_no_better
from vips.datasets.synthetic_lda import generate_corpus, planted_topics
from vips.datasets.wikipedia import write_bag_of_words
from vips.models.lda.model import unigram_perplexity
from vips.models.sbn.model import pixel_mean_metrics

TOPICS, WORDS = 3, 30


@dataclass(frozen=True)
class Corpus:
    train: Path
    test: Path
    vocab: Path
    unigram: float
    test_tokens: int


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Corpus:
    root = tmp_path_factory.mktemp("bow")
    truth = planted_topics(TOPICS, WORDS, seed=0)
    train = generate_corpus(400, truth, mean_length=40, seed=1).counts
    test = generate_corpus(100, truth, mean_length=40, seed=2).counts
    words = [f"w{v}" for v in range(WORDS)]
    write_bag_of_words(train, words, root / "train.docword", root / "vocab.txt")
    write_bag_of_words(test, words, root / "test.docword", root / "test-vocab.txt")
    unigram = unigram_perplexity(train, test)
    return Corpus(root / "train.docword", root / "test.docword", root / "vocab.txt", unigram, int(test.sum()))


def lda_argv(corpus: Corpus, *extra: str) -> list[str]:
    local = ["fit", "--local", "--kind", "bow", "--input", str(corpus.train), "--vocab", str(corpus.vocab)]
    return [*local, "--model", "lda", "--option", f"topics={TOPICS}", *extra]


def test_lda_local_fit_evaluate_and_predict(
    capsys: pytest.CaptureFixture[str], corpus: Corpus, tmp_path: Path
) -> None:
    posterior = tmp_path / "lda.json"
    summary = run_ok(
        capsys,
        lda_argv(
            corpus, "--sigma", "0", "--iterations", "10", "--option", "doc_length=0", "-o", str(posterior)
        ),
    )
    assert summary["model"] == "lda" and summary["kind"] == "bow" and summary["epsilon"] is None
    document = json.loads(posterior.read_text())
    assert document["vocabulary"] == [f"w{v}" for v in range(WORDS)]
    metrics = run_ok(capsys, ["evaluate", "--posterior", str(posterior), "--input", str(corpus.test),
                              "--vocab", str(corpus.vocab)])  # fmt: skip
    assert metrics["tokens"] == corpus.test_tokens and metrics["documents"] == 100
    # Three planted topics over 30 words: the fit beats word frequencies by far (observed 0.53x).
    assert metrics["perplexity"] < 0.75 * corpus.unigram, (metrics, corpus.unigram)
    # the printed baseline: word frequencies of the observed halves (close to the training ones)
    assert metrics["baseline"]["uniform_perplexity"] == WORDS
    assert metrics["baseline"]["perplexity"] == pytest.approx(corpus.unigram, rel=0.05)
    assert "warning" not in capsys.readouterr().err
    # Without --vocab the file is read in the posterior's own word ids: the same numbers.
    assert run_ok(capsys, ["evaluate", "--posterior", str(posterior), "--input", str(corpus.test)]) == metrics
    out = tmp_path / "theta.csv"
    assert main(["predict", "--posterior", str(posterior), "--input", str(corpus.test), "--vocab",
                 str(corpus.vocab), "-o", str(out)]) == 0  # fmt: skip
    header, *lines = out.read_text().splitlines()
    assert header == "topic_0,topic_1,topic_2" and len(lines) == 100
    theta = np.array([[float(v) for v in line.split(",")] for line in lines])
    np.testing.assert_allclose(theta.sum(axis=1), 1.0, rtol=1e-9)

    # vips topics: each fitted topic's top words come from one planted topic's word group, and the three
    # fitted topics find the three groups
    assert main(["topics", "--posterior", str(posterior), "--words", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == TOPICS
    planted = planted_topics(TOPICS, WORDS, seed=0).argmax(axis=0)  # each word's group
    groups = set()
    for k, line in enumerate(lines):
        prefix, words = line.split(": ")
        assert prefix.startswith(f"topic {k:>3} (") and prefix.endswith("%)")
        owners = {int(planted[int(word[1:])]) for word in words.split()}
        assert len(owners) == 1, line
        groups |= owners
    assert groups == set(range(TOPICS))
    assert "note" not in capsys.readouterr().err  # three distinct topics: nothing to say


def test_topics_say_when_they_are_the_private_word_frequencies(
    capsys: pytest.CaptureFixture[str], corpus: Corpus, tmp_path: Path
) -> None:
    """Issue 55: at an epsilon where no topic clears the release noise every topic is the fallback, the
    private word frequencies; `vips topics` (and the job page, service.ui.views) says so instead of
    printing the same words K times without a word."""
    posterior = tmp_path / "lda.json"
    run_ok(capsys, lda_argv(corpus, "--epsilon", "0.05", "--delta", "1e-5", "-o", str(posterior)))
    assert main(["topics", "--posterior", str(posterior), "--words", "3"]) == 0
    captured = capsys.readouterr()
    assert len({line.split(": ")[1] for line in captured.out.splitlines()}) == 1  # one distribution
    assert f"vips: note: All {TOPICS} topics are one word distribution" in captured.err


def test_repeated_topics_count_topics_of_one_distribution() -> None:
    """Rows proportional to each other are one distribution, whatever their mass; a row that differs in
    one word by more than the tolerance is not."""
    from service.ui.posterior_summary import repeated_topics, repeated_topics_note

    base = [5.0, 3.0, 2.0, 1.0]
    other = [1.0, 1.0, 1.0, 8.0]
    almost = [5.0, 3.0, 2.0, 1.0 + 1e-6]
    assert repeated_topics({"lambda": [base, [2 * v for v in base], other]}) == 2
    assert repeated_topics({"lambda": [base, other, almost]}) == 0
    assert repeated_topics({"lambda": [base, [3 * v for v in base], other, [0.5 * v for v in other]]}) == 4
    assert repeated_topics({"lambda": [base]}) == 0
    assert repeated_topics_note({"lambda": [base, other, almost]}) is None
    partly = repeated_topics_note({"lambda": [base, [2 * v for v in base], other]})
    assert str(partly).startswith("2 of the 3 topics are one word distribution")
    every = repeated_topics_note({"lambda": [base, [2 * v for v in base], [3 * v for v in base]]})
    assert str(every).startswith("All 3 topics are one word distribution")


def test_lda_local_private_fit_spends_at_most_epsilon(
    capsys: pytest.CaptureFixture[str], corpus: Corpus, tmp_path: Path
) -> None:
    summary = run_ok(
        capsys,
        lda_argv(corpus, "--epsilon", "2", "--delta", "1e-5", "--iterations", "5", "--batch-size", "100",
                 "--option", "doc_length=40"),
    )  # fmt: skip
    assert 0 < summary["epsilon"] <= 2.0 and summary["sigma"] > 0 and summary["batch_size"] == 100


def test_lda_evaluate_scores_the_fits_private_unigram(
    capsys: pytest.CaptureFixture[str], corpus: Corpus, tmp_path: Path
) -> None:
    """A private fit with the unigram block carries the private unigram it fell back to; `vips evaluate`
    scores it beside the topics (on the same held-out halves), and a posterior whose topics do no better
    than it gets a note naming both perplexities. A posterior with a malformed one is refused."""
    posterior = tmp_path / "lda.json"
    run_ok(
        capsys,
        lda_argv(corpus, "--epsilon", "5", "--iterations", "3", "--batch-size", "400", "--option",
                 "doc_length=40", "--option", "unigram_share=0.5", "-o", str(posterior)),
    )  # fmt: skip
    document = json.loads(posterior.read_text())
    unigram = np.array(document["private_unigram"])
    assert unigram.shape == (WORDS,) and np.all(unigram > 0) and abs(unigram.sum() - 1.0) < 1e-9
    evaluate = ["evaluate", "--posterior", str(posterior), "--input", str(corpus.test)]
    metrics = run_ok(capsys, evaluate)
    private = metrics["baseline"]["private_unigram_perplexity"]
    # 400 documents of 40 tokens over 30 words at epsilon 5: the private frequencies are close to the
    # training ones (a uniform guess over 30 words would be 30, the planted unigram ~25).
    assert private == pytest.approx(corpus.unigram, rel=0.1)
    # A posterior whose one topic is its private unigram gets the note on stderr, not the warning. Both are
    # the test file's own word frequencies here, so that they beat the observed halves' frequencies.
    test_counts = generate_corpus(100, planted_topics(TOPICS, WORDS, seed=0), mean_length=40, seed=2).counts
    frequencies = np.asarray(test_counts.sum(axis=0), dtype=np.float64).ravel()
    frequencies /= frequencies.sum()
    own = {**document, "lambda": [list(frequencies)], "variational_parameters": {"alpha": 1.0}}
    own["natural_parameters"] = {"expected_log_beta": [list(np.log(frequencies))]}
    own["topics"] = document["topics"][:1]
    own["private_unigram"] = list(frequencies)
    same = tmp_path / "same.json"
    same.write_text(json.dumps(own))
    assert main(["evaluate", "--posterior", str(same), "--input", str(corpus.test)]) == 0
    out, err = capsys.readouterr()
    scored = json.loads(out)
    assert scored["perplexity"] == pytest.approx(scored["baseline"]["private_unigram_perplexity"], rel=1e-9)
    assert scored["perplexity"] < scored["baseline"]["perplexity"]
    assert "note: the topics do no better than the private word frequencies" in err and "warning" not in err
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**document, "private_unigram": list(unigram[:-1])}))
    assert "private_unigram" in run_error(capsys, [*evaluate[:2], str(bad), *evaluate[3:]])


def test_lda_note_when_topics_do_not_beat_their_private_unigram(capsys: pytest.CaptureFixture[str]) -> None:
    def stderr(perplexity: float, private: float | None) -> str:
        baseline = {
            "perplexity": 100.0,
            **({} if private is None else {"private_unigram_perplexity": private}),
        }
        warn_if_no_better("lda", {"perplexity": perplexity, "baseline": baseline})
        return capsys.readouterr().err

    assert stderr(90.0, 95.0) == ""  # topics beat both
    assert "no better than the private" in stderr(95.0, 95.0) and "warning" not in stderr(95.0, 94.0)
    assert "no better than the private" in stderr(95.0 * (1 - 1e-12), 95.0)  # equal but for rounding
    assert stderr(90.0, None) == ""  # no private unigram in the posterior
    worse = stderr(105.0, 95.0)  # no better than the word frequencies: the warning alone
    assert "warning" in worse and "no better than the private" not in worse


def test_lda_errors(capsys: pytest.CaptureFixture[str], corpus: Corpus, tmp_path: Path) -> None:
    assert "doc_length" in run_error(capsys, lda_argv(corpus, "--epsilon", "1", "--option", "doc_length=0"))
    no_vocab = [
        "fit",
        "--local",
        "--kind",
        "bow",
        "--input",
        str(corpus.train),
        "--model",
        "lda",
        "--sigma",
        "0",
    ]
    assert "--vocab" in run_error(capsys, no_vocab)
    fractional = [*lda_argv(corpus)[:-2], "--option", "topics=2.5", "--sigma", "0"]  # instead of topics=3
    assert "whole number" in run_error(capsys, fractional)
    posterior = tmp_path / "lda.json"
    run_ok(capsys, lda_argv(corpus, "--sigma", "0", "--iterations", "2", "-o", str(posterior)))
    short_vocab = tmp_path / "short.txt"
    short_vocab.write_text("w0\nw1\n")
    error = run_error(capsys, ["evaluate", "--posterior", str(posterior), "--input", str(corpus.test),
                               "--vocab", str(short_vocab)])  # fmt: skip
    assert "W = 30" in error and "2 words" in error
    assert "--label" in run_error(
        capsys, ["evaluate", "--posterior", str(posterior), "--input", str(corpus.test), "--label", "y"]
    )


@dataclass(frozen=True)
class Images:
    train: Path
    test: Path
    baseline_nll: float
    baseline_accuracy: float


def write_binary(path: Path, rows: np.ndarray) -> Path:
    header = ",".join(f"p{j}" for j in range(rows.shape[1]))
    path.write_text(header + "\n" + "\n".join(",".join(str(int(v)) for v in row) for row in rows) + "\n")
    return path


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Images:
    """Two prototypes of 16 pixels with 5% of pixels flipped: a one-unit SBN explains them well."""
    root = tmp_path_factory.mktemp("binary")
    rng = np.random.default_rng(0)
    prototypes = np.array([[1] * 8 + [0] * 8, [0] * 8 + [1] * 8], dtype=np.float64)

    def draw(n: int) -> np.ndarray:
        rows = prototypes[rng.integers(0, 2, size=n)]
        flips = rng.random(rows.shape) < 0.05
        return np.where(flips, 1 - rows, rows)

    train, test = draw(600), draw(200)
    baseline = pixel_mean_metrics(train, test)
    return Images(
        write_binary(root / "train.csv", train),
        write_binary(root / "test.csv", test),
        baseline["nll"],
        baseline["pixel_accuracy"],
    )


def sbn_argv(images: Images, *extra: str) -> list[str]:
    local = ["fit", "--local", "--kind", "binary", "--input", str(images.train), "--model", "sbn"]
    return [*local, "--option", "hidden=2", *extra]


def test_sbn_local_fit_evaluate_and_predict(
    capsys: pytest.CaptureFixture[str], images: Images, tmp_path: Path
) -> None:
    posterior = tmp_path / "sbn.json"
    run_ok(capsys, sbn_argv(images, "--sigma", "0", "--iterations", "15", "-o", str(posterior)))
    document: dict[str, Any] = json.loads(posterior.read_text())
    assert document["columns"] == [f"p{j}" for j in range(16)]
    metrics = run_ok(capsys, ["evaluate", "--posterior", str(posterior), "--input", str(images.test)])
    # Per-pixel frequencies know nothing of the two prototypes (~11 nats per image, accuracy ~0.5); the
    # hidden unit that picks the prototype leaves only the 5% flips (observed 3.55 nats, accuracy 0.94).
    assert metrics["nll"] < 0.5 * images.baseline_nll, (metrics, images.baseline_nll)
    assert metrics["pixel_accuracy"] > 0.9 > images.baseline_accuracy + 0.2 and metrics["n"] == 200
    test_rows = np.loadtxt(images.test, delimiter=",", skiprows=1)
    assert metrics["baseline"] == pytest.approx(pixel_mean_metrics(test_rows, test_rows))
    # the held-out NLL sums the 2 units' 4 configurations out; the reconstruction score reads them from
    # each image and flatters the fit
    assert (metrics["nll_method"], metrics["nll_samples"], metrics["active_units"]) == ("exact", 4, 2)
    assert metrics["reconstruction_nll"] < metrics["nll"]
    # with every unit off the posterior is its pixel frequencies alone, and evaluate says so
    document["W"] = np.zeros((16, 2)).tolist()
    off = tmp_path / "off.json"
    off.write_text(json.dumps(document))
    assert main(["evaluate", "--posterior", str(off), "--input", str(images.test)]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["active_units"] == 0 and "every hidden unit is off" in err
    out = tmp_path / "reconstruction.csv"
    assert main(["predict", "--posterior", str(posterior), "--input", str(images.test), "-o", str(out)]) == 0
    header, *lines = out.read_text().splitlines()
    assert header.split(",") == document["columns"] and len(lines) == 200


def test_sbn_errors(capsys: pytest.CaptureFixture[str], images: Images, tmp_path: Path) -> None:
    posterior = tmp_path / "sbn.json"
    run_ok(capsys, sbn_argv(images, "--sigma", "0", "--iterations", "2", "-o", str(posterior)))
    narrow = write_binary(tmp_path / "narrow.csv", np.zeros((3, 5)))
    assert "5 columns" in run_error(
        capsys, ["evaluate", "--posterior", str(posterior), "--input", str(narrow)]
    )
    grey = tmp_path / "grey.csv"
    grey.write_text("p0,p1\n1,0\n0,0.5\n")
    grey_fit = ["fit", "--local", "--kind", "binary", "--input", str(grey), "--model", "sbn", "--sigma", "0"]
    assert "line 3" in run_error(capsys, grey_fit)
    assert "--vocab" in run_error(
        capsys, ["evaluate", "--posterior", str(posterior), "--input", str(images.test), "--vocab", "v.txt"]
    )
    assert "--kind binary" in run_error(
        capsys, ["fit", "--local", "--kind", "tabular", "--input", str(images.train), "--model", "sbn",
                 "--sigma", "0"]
    )  # fmt: skip


def test_top_words_name_the_documents_topics_with_their_shares() -> None:
    from service.ui.posterior_summary import top_words

    document = {
        "lambda": [[1.0, 5.0, 2.0, 2.0], [9.0, 1.0, 1.0, 1.0]],
        "vocabulary": ["a", "b", "c", "d"],
        "topics": [
            {"word_ids": [1, 2, 3, 0], "probabilities": [0.5, 0.2, 0.2, 0.1]},
            {"word_ids": [0, 1, 2, 3], "probabilities": [0.75, 1 / 12, 1 / 12, 1 / 12]},
        ],
    }
    first, second = top_words(document, 2)
    assert first.words == ("b", "c") and first.probabilities == (0.5, 0.2)
    assert second.words == ("a", "b") and second.probabilities[0] == 0.75
    assert (first.share, second.share) == (10 / 22, 12 / 22)


def test_topics_refuses_other_models(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    posterior = tmp_path / "blr.json"
    posterior.write_text(json.dumps({"model": "blr", "mean": [0.0], "covariance": [[1.0]]}))
    err = run_error(capsys, ["topics", "--posterior", str(posterior)])
    assert "is a blr posterior; topics are LDA's" in err
