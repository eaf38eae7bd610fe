"""A tabular CSV read for a posterior (`vips predict` / `vips evaluate`): columns matched by name.

With a header (the default), the file's columns are matched to the posterior's feature columns by name, in
any order (vips.columns): a missing or unexpected column is an error naming it. The label column is
`--label`, else the posterior's label (evaluate needs it; predict drops it when the file has it), else
`label`. A file without a header is read only with --no-header: its columns are then the posterior's
feature columns in the posterior's order (evaluate: then the label, last). A posterior written before
column names were kept is matched by position, as before, with a note saying so.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np

from privacy_wall.data.formats import MissingHeader, TabularFile, TabularStream, read_tabular_csv
from vips.choices import DEFAULT_LABEL
from vips.columns import ColumnMismatch, column_order
from vips.errors import UsageError
from vips.posterior import feature_columns, label_column

POSITIONAL_NOTE = (
    "vips: note: this posterior was written before posteriors kept column names: the input's columns are "
    "taken by position, in the order the model was fitted with"
)


def read_for_posterior(
    document: dict[str, Any],
    dimension: int,
    input_path: Path,
    *,
    label: str | None,
    need_label: bool,
    binary_label: bool,
    no_header: bool,
) -> TabularFile:
    """The input's rows with their features in the posterior's column order (and the label split off when
    `need_label` or the file has one); UsageError naming every column that does not match."""
    expected = feature_columns(document, dimension)
    fitted_label = label_column(document)
    if no_header:
        return _read_headerless(
            expected, dimension, input_path, label, need_label, fitted_label, binary_label
        )
    try:
        header = TabularStream(input_path, None).names
    except MissingHeader as exc:
        raise UsageError(
            f"{exc}; for a file without a header, give --no-header (its columns are then taken as the "
            "posterior's feature columns, in order)"
        ) from None
    if label is None:
        fallback = DEFAULT_LABEL if need_label else None
        label = fitted_label if fitted_label is not None and fitted_label in header else fallback
    if label is not None and label not in header:
        TabularStream(input_path, label)  # the reader's error for a missing label column (header only)
    if expected is None:
        table = read_tabular_csv(input_path, label, binary_label=binary_label)
        print(POSITIONAL_NOTE, file=sys.stderr)
        _check_width(table, dimension, input_path)
        return table
    try:  # checked on the header, before the rows are read
        order = column_order([name for name in header if name != label], expected, source=str(input_path))
    except ColumnMismatch as exc:
        hint = " (name a label column to drop with --label)" if label is None and exc.unexpected else ""
        raise UsageError(f"{exc}{hint}") from None
    table = read_tabular_csv(input_path, label, binary_label=binary_label)
    features = table.features if (order == np.arange(dimension)).all() else table.features[:, order]
    return TabularFile(features, table.labels, expected, table.label_name)


def _read_headerless(
    expected: tuple[str, ...] | None,
    dimension: int,
    input_path: Path,
    label: str | None,
    need_label: bool,
    fitted_label: str | None,
    binary_label: bool,
) -> TabularFile:
    if label is not None:
        raise UsageError("--label names a header column: a file read with --no-header has none")
    names = expected or tuple(f"column {i + 1}" for i in range(dimension))
    label_name = None
    if need_label:
        label_name = fitted_label or DEFAULT_LABEL
        names = (*names, label_name)
    return read_tabular_csv(input_path, label_name, binary_label=binary_label, names=names)


def _check_width(table: TabularFile, expected: int, input_path: Path) -> None:
    if table.dimension != expected:
        hint = "" if table.labels is not None else " (name a label column to drop with --label)"
        raise UsageError(
            f"{input_path} has {table.dimension} feature columns, the posterior expects {expected}{hint}"
        )
