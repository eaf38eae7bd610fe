"""`vips fit`: `--local` fits in-process through the same gate and accountant; server mode comes later.

The local fit reads the researcher's file with the wall's strict reader, hands the rows to
worker.estimator.VIPSLogisticRegression (in-memory store, throwaway ledger), writes the posterior and
prints one JSON line with its privacy: {"epsilon", "delta", "sigma", "iterations", "batch_size", ...}.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from privacy_wall.formats import FIRST_DATA_LINE, read_tabular_csv
from privacy_wall.store import BoundViolation, check_tabular_bounds
from service.options import option_problem, option_specs
from vips.commands import remote
from vips.errors import NotAvailable, RuntimeFailure, UsageError
from vips.output import print_json
from worker.estimator import VIPSLogisticRegression
from worker.posterior import save_posterior

KINDS = ("tabular", "bow", "binary")
MODELS = ("blr", "lda", "sbn")
ALGORITHMS = ("vips", "dpvi", "dpsep")
DEFAULT_LABEL = "label"
DEFAULT_DELTA = 1e-5
DEFAULT_ITERATIONS = 10


def parse_options(pairs: list[str], model: str) -> dict[str, float]:
    """--option key=value pairs to a dict, checked against the model's option names and ranges."""
    valid = ", ".join(sorted(option_specs(model)))
    options: dict[str, float] = {}
    for pair in pairs:
        name, sep, text = pair.partition("=")
        name = name.strip()
        if not sep or not name:
            raise UsageError(f"--option takes key=value (got {pair!r}); valid names for {model}: {valid}")
        if name in options:
            raise UsageError(f"option {name!r} is given more than once")
        try:
            value = float(text)
        except ValueError:
            raise UsageError(f"option {name!r} needs a number (got {text.strip()!r})") from None
        problem = option_problem(model, name, value)
        if problem is not None:
            raise UsageError(f"{problem} (got {text.strip()!r})")
        options[name] = value
    return options


def run(args: argparse.Namespace) -> int:
    if not args.local:
        return remote.run_fit_remote(args, parse_options(args.option or [], args.model))
    return _run_local(args)


def _check_available(args: argparse.Namespace) -> None:
    if args.kind is None:
        raise UsageError(f"--local needs --kind ({', '.join(KINDS)})")
    if args.input is None:
        raise UsageError("--local needs --input FILE")
    if args.kind != "tabular":
        raise NotAvailable(f"--kind {args.kind} is not available yet; this version fits --kind tabular")
    if args.model != "blr":
        raise NotAvailable(f"--model {args.model} is not available yet; this version fits --model blr")
    if args.algorithm != "vips":
        raise NotAvailable(f"--algorithm {args.algorithm} is not available yet; this version runs vips")
    if args.vocab is not None:
        raise UsageError("--vocab is only for --kind bow")
    if (args.sigma is None) == (args.epsilon is None):
        raise UsageError("give exactly one of --sigma and --epsilon")
    if not 0 < args.delta < 1:
        raise UsageError("--delta must be in (0, 1)")


def _run_local(args: argparse.Namespace) -> int:
    _check_available(args)
    options = parse_options(args.option or [], args.model)
    path = Path(args.input)
    table = read_tabular_csv(path, args.label or DEFAULT_LABEL)
    assert table.labels is not None
    population = table.rows
    batch_size = population if args.batch_size is None else args.batch_size
    if batch_size > population:
        raise UsageError(f"--batch-size {batch_size} is larger than the {population} rows of {path}")
    dataset = args.dataset or path.stem
    model_options: dict[str, Any] = dict(options)  # names checked above; all are float keywords
    estimator = VIPSLogisticRegression(
        epsilon=args.epsilon,
        delta=args.delta,
        sigma=args.sigma,
        batch_size=batch_size,
        iterations=args.iterations,
        **model_options,
    )
    try:
        check_tabular_bounds(
            table.features, table.labels
        )  # the store checks too; this fails before calibration
        estimator.fit(table.features, table.labels, dataset=dataset)
    except BoundViolation as exc:
        raise UsageError(
            f"{path}: {exc} (data rows count from 0: row r is on line r + {FIRST_DATA_LINE})"
        ) from None
    if args.output is not None:
        _save(estimator.posterior_, Path(args.output))
    else:
        print("vips: note: no -o given, the posterior was not saved", file=sys.stderr)
    print_json(_summary(estimator.posterior_, args, options, table.dimension))
    return 0


def _save(document: dict[str, Any], path: Path) -> None:
    try:
        save_posterior(document, path)
    except OSError as exc:
        raise RuntimeFailure(f"cannot write {path}: {exc.strerror}") from None


def _summary(
    document: dict[str, Any], args: argparse.Namespace, options: dict[str, float], dimension: int
) -> dict[str, Any]:
    privacy: dict[str, Any] = document["privacy"]
    return {
        **privacy,
        "sampling_rate": privacy["batch_size"] / privacy["population"],
        "model": document["model"],
        "algorithm": document["algorithm"],
        "dataset": document["dataset"],
        "job_id": document["job_id"],
        "kind": args.kind,
        "dimension": dimension,
        "options": options,
        "target_epsilon": args.epsilon,
        "posterior": None if args.output is None else str(args.output),
    }
