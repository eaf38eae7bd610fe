"""`vips fit`: a job on the server, or `--local`: in-process through the same gate and accountant.

The local fit reads the researcher's file with the wall's strict reader (tabular CSV, UCI docword with
its vocabulary, binary CSV), runs the estimators' loop on it without importing scikit-learn
(vips.fit_loop: in-memory store, throwaway ledger), writes the posterior and prints one JSON line with
its privacy: {"epsilon", "delta", "sigma", "iterations", "batch_size", ...}.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import scipy.sparse as sp

from control.planning.options import (
    MODEL_KINDS,
    algorithm_problem,
    option_problem,
    option_specs,
    schedule_problem,
    typed_options,
)
from privacy_wall.accounting.weak import WEAK_FLAG, weak_privacy_problem
from privacy_wall.data.docword import read_docword, read_vocabulary
from privacy_wall.data.formats import FIRST_DATA_LINE, read_binary_csv, read_tabular_csv
from privacy_wall.data.store import (
    BoundViolation,
    InMemoryBinaryStore,
    InMemoryBowStore,
    InMemoryTabularStore,
    RowStore,
    check_regression_bounds,
    check_tabular_bounds,
)
from vips.choices import DEFAULT_LABEL, KINDS
from vips.errors import NotAvailable, RuntimeFailure, UsageError
from vips.fit_loop import Schedule, fit_store, with_chosen
from vips.models.base import Array
from vips.output import check_writable, print_json
from vips.posterior import save_posterior
from vips.progress import delta_warning, epsilon_text, fit_progress, note


def parse_options(pairs: list[str], model: str, algorithm: str = "vips") -> dict[str, float]:
    """--option key=value pairs to a dict, checked against the option names and ranges of the model
    fitted by the algorithm; whole-number options (topics, hidden, ...) come out as ints."""
    valid = ", ".join(sorted(option_specs(model, algorithm)))
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
        problem = option_problem(model, name, value, algorithm)
        if problem is not None:
            raise UsageError(f"{problem} (got {text.strip()!r})")
        options[name] = value
    return dict(typed_options(model, options, algorithm))


def run(args: argparse.Namespace) -> int:
    if args.local and args.dry_run:
        raise UsageError("--dry-run quotes a server job; without a server, vips privacy epsilon|sigma quote")
    if not args.local:
        from vips.commands import remote  # the HTTP client: not loaded by a local fit

        return remote.run_fit_remote(args, parse_options(args.option or [], args.model, args.algorithm))
    return _run_local(args)


def _check_available(args: argparse.Namespace) -> None:
    if args.kind is None:
        raise UsageError(f"--local needs --kind ({', '.join(KINDS)})")
    if args.input is None:
        raise UsageError("--local needs --input FILE")
    pairing = algorithm_problem(args.model, args.algorithm)
    if pairing is not None:
        raise NotAvailable(pairing)
    if MODEL_KINDS[args.model] != args.kind:
        raise UsageError(f"--model {args.model} fits --kind {MODEL_KINDS[args.model]} data, not {args.kind}")
    if args.vocab is not None and args.kind != "bow":
        raise UsageError("--vocab is only for --kind bow")
    if args.vocab is None and args.kind == "bow":
        raise UsageError("--kind bow needs --vocab FILE (one word per line)")
    if args.label is not None and args.kind not in ("tabular", "regression"):
        raise UsageError("--label is only for --kind tabular and regression")
    if (args.sigma is None) == (args.epsilon is None):
        raise UsageError("give exactly one of --sigma and --epsilon")
    if not 0 < args.delta < 1:
        raise UsageError("--delta must be in (0, 1)")
    weak = (
        None
        if args.epsilon is None
        else weak_privacy_problem("a fit", args.epsilon, args.weak_privacy_ok, WEAK_FLAG)
    )
    if weak is not None:
        raise UsageError(weak)


@dataclass(frozen=True)
class LocalData:
    """A researcher's file read with the wall's strict reader, ready for an estimator."""

    rows: Any  # tabular/binary: (N, d) array; bow: CSR counts
    labels: Array | None
    population: int
    dimension: int
    vocabulary: tuple[str, ...] | None = None
    columns: tuple[str, ...] | None = None
    label: str | None = None


def read_local(args: argparse.Namespace) -> LocalData:
    path = Path(args.input)
    try:
        if args.kind in ("tabular", "regression"):
            regression = args.kind == "regression"
            table = read_tabular_csv(path, args.label or DEFAULT_LABEL, binary_label=not regression)
            assert table.labels is not None
            check = check_regression_bounds if regression else check_tabular_bounds
            check(table.features, table.labels)
            return LocalData(
                table.features,
                table.labels,
                table.rows,
                table.dimension,
                columns=table.feature_names,
                label=table.label_name,
            )
        if args.kind == "binary":
            table = read_binary_csv(path)
            return LocalData(table.features, None, table.rows, table.dimension, columns=table.feature_names)
        corpus = read_docword(path, read_vocabulary(Path(args.vocab)))
        counts = sp.csr_array(
            (corpus.counts, corpus.word_ids, corpus.indptr), shape=(corpus.documents, len(corpus.vocabulary))
        )
        return LocalData(counts, None, corpus.documents, len(corpus.vocabulary), vocabulary=corpus.vocabulary)
    except BoundViolation as exc:
        raise UsageError(
            f"{path}: {exc} (data rows count from 0: row r is on line r + {FIRST_DATA_LINE})"
        ) from None


def local_store(data: LocalData, kind: str, dataset: str) -> Callable[[bool], RowStore]:
    """The in-memory store of a file read for --local, built once the fit knows whether it is public."""

    def make(public: bool) -> RowStore:
        if kind in ("tabular", "regression"):
            assert data.labels is not None
            if kind == "regression":
                return InMemoryTabularStore(dataset, data.rows, data.labels, public=public, kind="regression")
            return InMemoryTabularStore(dataset, data.rows, data.labels, public=public)
        if kind == "binary":
            return InMemoryBinaryStore(dataset, data.rows, public=public)
        return InMemoryBowStore(dataset, data.rows, public=public)

    return make


def _run_local(args: argparse.Namespace) -> int:
    _check_available(args)
    if args.output is not None:
        check_writable(Path(args.output))
    options = parse_options(args.option or [], args.model, args.algorithm)
    data = read_local(args)
    path = Path(args.input)
    if data.population == 0:
        raise UsageError(f"{path} has no rows")
    if args.batch_size is not None and args.batch_size > data.population:
        raise UsageError(
            f"--batch-size {args.batch_size} is larger than the {data.population} rows of {path}"
        )
    # A target epsilon always means noise (sigma > 0).
    conflict = schedule_problem(args.model, options, math.inf if args.sigma is None else args.sigma)
    if conflict is not None:
        raise UsageError(f"option {conflict[0]!r}: {conflict[1]}")
    dataset = args.dataset or path.stem
    warning = delta_warning(args.delta, data.population)
    given = Schedule(
        epsilon=args.epsilon,
        delta=args.delta,
        sigma=args.sigma,
        batch_size=args.batch_size,
        iterations=args.iterations,
        tau0=options.get("tau0", 0.0),
        kappa=options.get("kappa", 1.0),
    )
    # as the server would choose
    schedule = with_chosen(given, args.model, args.algorithm, data.population, data.dimension, options)
    assert schedule.iterations is not None
    try:
        with fit_progress(f"{args.model} {args.algorithm}", schedule.iterations) as update:

            def progress(done: int, total: int, epsilon_spent: float) -> None:
                update(done, epsilon_spent, "running" if done < total else "done")

            fitted = fit_store(  # no scikit-learn: the estimators' loop without them (vips.fit_loop)
                args.model,
                args.algorithm,
                options,
                schedule,
                local_store(data, args.kind, dataset),
                data.population,
                dataset,
                progress=progress,
                dimension=data.dimension,
                vocabulary=data.vocabulary,
                columns=data.columns,
            )
    except BoundViolation as exc:
        raise UsageError(f"{path}: {exc}") from None
    document: dict[str, Any] = fitted.document
    if data.vocabulary is not None:
        document["vocabulary"] = list(data.vocabulary)
    if data.columns is not None:
        document["columns"] = list(data.columns)
    if data.label is not None:
        document["label"] = data.label
    if args.output is not None:
        _save(document, Path(args.output))
        note(f"posterior written to {args.output}")
    else:
        note("no -o given: the posterior was not saved")
    note(
        f"epsilon spent {epsilon_text(_spent(document))} at delta {args.delta:g} on your own file "
        "(a local fit charges no server budget)"
    )
    print_json({**_summary(document, args, fitted.options, data.dimension), "warning": warning})
    return 0


def _spent(document: dict[str, Any]) -> float:
    """The fit's epsilon from its posterior's privacy (inf for sigma = 0)."""
    privacy = document["privacy"]
    return math.inf if privacy["epsilon_is_infinite"] else float(privacy["epsilon"])


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
