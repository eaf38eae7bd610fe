"""`vips predict` and `vips evaluate`: use a downloaded posterior on public data, outside the wall.

The posterior's model decides the input and the output (docs/design.md section 6):
- blr: a numeric CSV (a label column, if named, is dropped; columns are matched to the posterior's by name,
  vips.posterior_input; --no-header for a file without names); predict writes column p = P(y = 1 | x);
  evaluate prints {"auc", "accuracy", "log_loss", "n"}.
- linreg: a numeric CSV (a target column, if named, is dropped); predict writes the predictive mean and
  variance of y (columns mean, variance); evaluate prints {"rmse", "mean_log_density", "n"} (targets in
  the units the model was fitted in).
- lda: a UCI docword file with its vocabulary (--vocab; words are matched to the posterior's vocabulary
  by spelling, unknown words dropped; without --vocab the file must use the posterior's word ids);
  predict writes each document's topic proportions (columns topic_0 ... topic_{K-1}); evaluate prints
  {"perplexity" (document completion), "perplexity_bound", "documents", "tokens"}, and in "baseline" also
  "private_unigram_perplexity" when the posterior carries the private unigram its fit fell back to.
- sbn: a CSV of 0/1 columns (matched to the posterior's by name when it names them); predict writes
  reconstruction probabilities (one column per posterior column);
  evaluate prints {"nll": the held-out negative log-likelihood -log p(y) with z summed out, nats per row,
  "nll_method" ("exact" up to 12 hidden units, else "importance sampling", an upper bound in expectation),
  "nll_samples", "reconstruction_nll": -log p(y | <z>) with z read from the scored row itself (it flatters
  the fit: not a likelihood of held-out data), "pixel_accuracy" of that reconstruction, "active_units"
  (hidden units with any non-zero weight; with none a note says the posterior is its private pixel
  frequencies alone), "n"}.
Every evaluation also prints "baseline": the same metrics of a model that ignores structure (a constant
prediction, the mean target, word frequencies, independent pixels), computed on the evaluation file
itself, and warns on stderr when the posterior does not beat it (BLR: in AUC or in log loss, so
probabilities worse than the base rate's are flagged even where the ranking is good).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from privacy_wall.data.docword import read_docword, read_vocabulary
from privacy_wall.data.formats import TabularFile, read_binary_csv
from vips.columns import ColumnMismatch, column_order
from vips.errors import UsageError
from vips.models.base import Array
from vips.models.blr.model import predict_proba
from vips.models.lda.model import (
    completion_perplexity,
    document_topics,
    perplexity_bound,
    split_documents,
    unigram_perplexity,
    word_frequency_perplexity,
)
from vips.models.linreg.model import predict as linreg_predict
from vips.models.linreg.model import rmse
from vips.models.sbn.model import heldout_nll, pixel_mean_metrics, reconstruct_proba, reconstruction_metrics
from vips.output import print_json, write_text_atomically
from vips.posterior import (
    LdaPosterior,
    SbnPosterior,
    blr_parameters,
    lda_parameters,
    linreg_parameters,
    load_posterior,
    sbn_parameters,
)
from vips.posterior_input import read_for_posterior


def _blr_probabilities(
    document: dict[str, Any], args: argparse.Namespace, *, need_label: bool
) -> tuple[Array, TabularFile]:
    """P(y = 1 | x) for each row of the input under a BLR posterior, and the rows read."""
    mean, covariance = blr_parameters(document)
    table = read_for_posterior(
        document,
        mean.shape[0],
        Path(args.input),
        label=args.label,
        need_label=need_label,
        binary_label=True,
        no_header=args.no_header,
    )
    return predict_proba(mean, covariance, table.features), table


def _linreg_predictions(
    document: dict[str, Any], args: argparse.Namespace, *, need_label: bool
) -> tuple[Array, Array, TabularFile]:
    """Predictive mean and variance of y for each row of the input under a linear regression posterior,
    and the rows read."""
    mean, covariance, noise_variance = linreg_parameters(document)
    table = read_for_posterior(
        document,
        mean.shape[0],
        Path(args.input),
        label=args.label,
        need_label=need_label,
        binary_label=False,
        no_header=args.no_header,
    )
    return (*linreg_predict(mean, covariance, noise_variance, table.features), table)


def _lda_counts(fitted: LdaPosterior, input_path: Path, vocab: str | None) -> sp.csr_array:
    """The docword file's counts over the posterior's vocabulary (D x V)."""
    words = fitted.lam.shape[1]
    if vocab is None:
        if fitted.vocabulary is not None:
            vocabulary = fitted.vocabulary
        else:
            vocabulary = tuple(str(i) for i in range(words))
        corpus = read_docword(input_path, vocabulary)
        return sp.csr_array((corpus.counts, corpus.word_ids, corpus.indptr), shape=(corpus.documents, words))
    corpus = read_docword(input_path, read_vocabulary(Path(vocab)))
    if fitted.vocabulary is None:
        raise UsageError(
            "this lda posterior carries no vocabulary: give the file in its word ids, without --vocab"
        )
    index = {word: i for i, word in enumerate(fitted.vocabulary)}
    mapping = np.array([index.get(word, -1) for word in corpus.vocabulary], dtype=np.int64)
    ids = mapping[corpus.word_ids]
    rows = np.repeat(np.arange(corpus.documents), np.diff(corpus.indptr))
    known = ids >= 0
    return sp.csr_array((corpus.counts[known], (rows[known], ids[known])), shape=(corpus.documents, words))


def _sbn_rows(fitted: SbnPosterior, input_path: Path) -> TabularFile:
    """The input's 0/1 rows with their columns in the posterior's order (by name when it names them)."""
    table = read_binary_csv(input_path)
    visible = fitted.W.shape[0]
    if fitted.columns is None:
        if table.dimension != visible:
            raise UsageError(
                f"{input_path} has {table.dimension} columns, the sbn posterior expects {visible}"
            )
        return table
    try:
        order = column_order(table.feature_names, fitted.columns, source=str(input_path))
    except ColumnMismatch as exc:
        raise UsageError(str(exc)) from None
    return TabularFile(table.features[:, order], None, fitted.columns)


def _check_flags(model: str, args: argparse.Namespace) -> None:
    if getattr(args, "vocab", None) is not None and model != "lda":
        raise UsageError("--vocab is only for lda posteriors")
    if args.label is not None and model not in ("blr", "linreg"):
        raise UsageError("--label is only for blr and linreg posteriors")
    if getattr(args, "no_header", False) and model not in ("blr", "linreg"):
        raise UsageError("--no-header is only for blr and linreg posteriors")


def _csv(header: list[str], values: Array) -> str:
    lines = [",".join(header)]
    lines.extend(",".join(repr(float(v)) for v in row) for row in np.atleast_2d(values))
    return "\n".join(lines) + "\n"


def run_predict(args: argparse.Namespace) -> int:
    posterior, input_path = Path(args.posterior), Path(args.input)
    document = load_posterior(posterior)
    model = document["model"]
    _check_flags(model, args)
    if model == "blr":
        p, _ = _blr_probabilities(document, args, need_label=False)
        text = "p\n" + "".join(f"{value!r}\n" for value in p.tolist())
    elif model == "linreg":
        mean, variance, _ = _linreg_predictions(document, args, need_label=False)
        text = _csv(["mean", "variance"], np.column_stack([mean, variance]))
    elif model == "lda":
        fitted = lda_parameters(document)
        theta = document_topics(fitted.lam, _lda_counts(fitted, input_path, args.vocab), fitted.alpha)
        text = _csv([f"topic_{k}" for k in range(theta.shape[1])], theta)
    else:
        sbn = sbn_parameters(document)
        table = _sbn_rows(sbn, input_path)
        proba = reconstruct_proba(table.features, sbn.W, sbn.b, sbn.c)
        text = _csv(list(table.feature_names), proba)
    if args.output is None:
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        write_text_atomically(Path(args.output), text)
    return 0


def _evaluate_blr(document: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    from sklearn.metrics import accuracy_score, log_loss, roc_auc_score  # slow import: only here

    p, table = _blr_probabilities(document, args, need_label=True)
    assert table.labels is not None
    y = table.labels
    if np.unique(y).size < 2:
        raise UsageError(f"{args.input}: AUC needs both classes, but every {table.label_name!r} is the same")
    rate = float(np.mean(y))
    return {
        "auc": float(roc_auc_score(y, p)),
        "accuracy": float(accuracy_score(y, (p >= 0.5).astype(np.float64))),
        "log_loss": float(log_loss(y, p, labels=[0.0, 1.0])),
        "n": table.rows,
        # a constant prediction: the file's own positive rate (the best constant, so an optimistic bar)
        "baseline": {
            "auc": 0.5,
            "accuracy": max(rate, 1.0 - rate),
            "log_loss": float(log_loss(y, np.full_like(y, rate), labels=[0.0, 1.0])),
        },
    }


def _evaluate_linreg(document: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    mean, variance, table = _linreg_predictions(document, args, need_label=True)
    assert table.labels is not None
    y = table.labels
    log_density = -0.5 * (np.log(2 * np.pi * variance) + (y - mean) ** 2 / variance)
    return {
        "rmse": rmse(mean, y),
        "mean_log_density": float(np.mean(log_density)),
        "n": table.rows,
        # predicting the file's own mean target for every row (an optimistic bar)
        "baseline": {"rmse": rmse(np.full_like(y, float(np.mean(y))), y)},
    }


def _evaluate_lda(document: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    fitted = lda_parameters(document)
    counts = _lda_counts(fitted, Path(args.input), args.vocab)
    tokens = int(counts.sum())
    if tokens < 2:
        raise UsageError(f"{args.input}: perplexity needs held-out tokens, the file has {tokens} known words")
    observed, held_out = split_documents(counts, seed=0)
    baseline: dict[str, float] = {
        # the observed halves' word frequencies scoring the held-out halves; V for uniform words
        "perplexity": unigram_perplexity(observed, held_out),
        "uniform_perplexity": int(counts.shape[1]),
    }
    if fitted.private_unigram is not None:
        # the fit's own private word frequencies scoring the held-out halves: what the topics add to them
        baseline["private_unigram_perplexity"] = word_frequency_perplexity(fitted.private_unigram, held_out)
    return {
        "perplexity": completion_perplexity(fitted.lam, observed, held_out, fitted.alpha),
        "perplexity_bound": perplexity_bound(fitted.lam, counts, fitted.alpha),
        "documents": int(counts.shape[0]),
        "tokens": tokens,
        "baseline": baseline,
    }


def _evaluate_sbn(document: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    sbn = sbn_parameters(document)
    table = _sbn_rows(sbn, Path(args.input))
    if table.rows == 0:
        raise UsageError(f"{args.input} has no rows")
    reconstruction = reconstruction_metrics(table.features, sbn.W, sbn.b, sbn.c)
    heldout = heldout_nll(table.features, sbn.W, sbn.b, sbn.c)
    metrics = {
        "nll": heldout["nll"],
        "nll_method": heldout["method"],
        "nll_samples": heldout["samples"],
        "reconstruction_nll": reconstruction["nll"],
        "pixel_accuracy": reconstruction["pixel_accuracy"],
        # units with any non-zero weight (the noise-aware M-step switches off what noise cannot support)
        "active_units": int(np.count_nonzero(np.any(sbn.W != 0.0, axis=0))),
    }
    # every pixel on its own at the file's own pixel means (an optimistic bar; its nll is exact)
    return {**metrics, "n": table.rows, "baseline": pixel_mean_metrics(table.features, table.features)}


#: The metrics each model is judged on against its baseline: (name, whether higher is better, what the
#: baseline's value is). BLR by its ranking (AUC) and by its probabilities (log loss, a proper score: a fit
#: that ranks well can still state probabilities worse than the base rate's).
HEADLINE: dict[str, tuple[tuple[str, bool, str], ...]] = {
    "blr": (
        ("auc", True, "AUC of a constant prediction"),
        ("log_loss", False, "log loss of predicting the file's positive rate for every row"),
    ),
    "linreg": (("rmse", False, "RMSE of predicting the mean target"),),
    "lda": (("perplexity", False, "unigram perplexity (word frequencies alone)"),),
    "sbn": (("nll", False, "held-out NLL of independent pixels at their means"),),
}


def warn_if_no_better(model: str, metrics: dict[str, Any]) -> None:
    """One warning on stderr when the posterior does not beat its model's baseline in a headline metric;
    for an LDA posterior with a private unigram that does beat it, one note when its topics do not beat
    that private unigram; for an SBN whose hidden units are all off, one note that it is its private pixel
    frequencies alone."""
    if model == "sbn" and metrics["active_units"] == 0:
        print(
            "vips: note: every hidden unit is off: this posterior is its private pixel frequencies alone "
            "(no unit could be told from the noise; a larger epsilon x N lets units learn)",
            file=sys.stderr,
        )
    failed = [
        f"{name} {metrics[name]:.4g} vs {metrics['baseline'][name]:.4g}, the {baseline}"
        for name, higher_is_better, baseline in HEADLINE[model]
        if not (
            (metrics[name] > metrics["baseline"][name])
            if higher_is_better
            else (metrics[name] < metrics["baseline"][name])
        )
    ]
    if failed:
        print(
            f"vips: warning: this posterior is no better than the baseline: {'; '.join(failed)}; more data, "
            "a larger epsilon or fewer parameters may help",
            file=sys.stderr,
        )
        return
    private = metrics["baseline"].get("private_unigram_perplexity")
    score = metrics[HEADLINE[model][0][0]]
    # equal to rounding (a one-topic posterior that is its private unigram scores it to the last bits)
    if private is not None and score >= private * (1.0 - 1e-9):
        print(
            f"vips: note: the topics do no better than the private word frequencies released with them: "
            f"perplexity {score:.4g} vs {private:.4g} (more documents or a larger epsilon let topics pay)",
            file=sys.stderr,
        )


def run_evaluate(args: argparse.Namespace) -> int:
    document = load_posterior(Path(args.posterior))
    model = document["model"]
    _check_flags(model, args)
    evaluate = {
        "blr": _evaluate_blr,
        "linreg": _evaluate_linreg,
        "lda": _evaluate_lda,
        "sbn": _evaluate_sbn,
    }[model]
    metrics = evaluate(document, args)
    print_json(metrics)
    warn_if_no_better(model, metrics)
    return 0
