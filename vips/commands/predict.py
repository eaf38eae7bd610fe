"""`vips predict` and `vips evaluate`: use a downloaded posterior on public data, outside the wall."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np

from privacy_wall.formats import TabularFile, read_tabular_csv
from vips.errors import NotAvailable, UsageError
from vips.output import print_json, write_text_atomically
from worker.models.base import Array
from worker.models.blr import predict_proba
from worker.posterior import blr_parameters, load_posterior

DEFAULT_LABEL = "label"


def _blr_probabilities(posterior: Path, table: TabularFile, input_path: Path) -> Array:
    """P(y = 1 | x) for each row of the table under a BLR posterior."""
    document: dict[str, Any] = load_posterior(posterior)
    if document["model"] != "blr":
        raise NotAvailable(f"predicting with a {document['model']} posterior is not available yet")
    mean, covariance = blr_parameters(document)
    if table.dimension != mean.shape[0]:
        hint = "" if table.labels is not None else " (name a label column to drop with --label)"
        raise UsageError(
            f"{input_path} has {table.dimension} feature columns, the posterior {posterior} expects "
            f"{mean.shape[0]}{hint}"
        )
    return predict_proba(mean, covariance, table.features)


def run_predict(args: argparse.Namespace) -> int:
    table = read_tabular_csv(Path(args.input), args.label)
    p = _blr_probabilities(Path(args.posterior), table, Path(args.input))
    text = "p\n" + "".join(f"{value!r}\n" for value in p.tolist())
    if args.output is None:
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        write_text_atomically(Path(args.output), text)
    return 0


def run_evaluate(args: argparse.Namespace) -> int:
    if args.vocab is not None:
        raise UsageError("--vocab is only for LDA posteriors")
    from sklearn.metrics import accuracy_score, log_loss, roc_auc_score  # slow import: only here

    label = args.label or DEFAULT_LABEL
    table = read_tabular_csv(Path(args.input), label)
    assert table.labels is not None
    p = _blr_probabilities(Path(args.posterior), table, Path(args.input))
    y = table.labels
    if np.unique(y).size < 2:
        raise UsageError(f"{args.input}: AUC needs both classes, but every {label!r} is the same")
    print_json(
        {
            "auc": float(roc_auc_score(y, p)),
            "accuracy": float(accuracy_score(y, (p >= 0.5).astype(np.float64))),
            "log_loss": float(log_loss(y, p, labels=[0.0, 1.0])),
            "n": table.rows,
        }
    )
    return 0
