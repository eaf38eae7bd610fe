"""`vips scale`: a raw numeric CSV to rows of norm <= 1 from public bounds (vips.preprocessing), ready
for `vips data ingest` or `vips fit --local`.

--bounds is a CSV `column,lower,upper` naming every feature column (and the label column, for a
regression target to map onto [-1, 1]; a 0/1 label passes through). The output has the label last and,
unless --no-intercept, an `intercept` column first. The note on stderr counts clipped values per
column (never the values): the custodian's own data, on the custodian's machine. The output holds those
rows, so it is private to its owner (mode 0600): the verb runs under umask 077, as `data prepare-text`
does (vips.cli).
"""

from __future__ import annotations

import argparse
import csv
import io
import math
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from privacy_wall.data.formats import read_tabular_csv
from privacy_wall.names import did_you_mean
from vips.choices import DEFAULT_LABEL
from vips.errors import UsageError
from vips.output import check_writable, write_text_atomically
from vips.preprocessing import PublicBoundsScaler, to_unit_interval


def read_bounds(path: Path) -> dict[str, tuple[float, float]]:
    """column -> (lower, upper) from a CSV with the header column,lower,upper."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror}") from None
    rows = list(csv.reader(io.StringIO(text)))
    if not rows or [cell.strip() for cell in rows[0]] != ["column", "lower", "upper"]:
        raise UsageError(f"{path}: the header must be column,lower,upper")
    bounds: dict[str, tuple[float, float]] = {}
    for line, row in enumerate(rows[1:], start=2):
        if not row:
            continue
        if len(row) != 3:
            raise UsageError(f"{path}, line {line}: expected column,lower,upper")
        try:
            low, high = float(row[1]), float(row[2])
        except ValueError:
            raise UsageError(f"{path}, line {line}: lower and upper must be numbers") from None
        if not (math.isfinite(low) and math.isfinite(high) and low < high):
            raise UsageError(f"{path}, line {line}: need finite bounds with lower < upper")
        bounds[row[0].strip()] = (low, high)
    return bounds


def run(args: argparse.Namespace) -> int:
    output = Path(args.output)
    check_writable(output)
    label = args.label or DEFAULT_LABEL
    bounds = read_bounds(Path(args.bounds))
    table = read_tabular_csv(Path(args.input), label, binary_label=label not in bounds)
    missing = [name for name in table.feature_names if name not in bounds]
    if missing:
        raise UsageError(
            _missing_bounds(args.bounds, args.input, missing, table.feature_names, bounds, label)
        )
    lower = [bounds[name][0] for name in table.feature_names]
    upper = [bounds[name][1] for name in table.feature_names]
    scaler = PublicBoundsScaler(lower, upper, intercept=not args.no_intercept).fit(table.features)
    features = scaler.transform(table.features)
    clipped = ((table.features < lower) | (table.features > upper)).sum(axis=0)
    columns = [str(name) for name in scaler.get_feature_names_out(list(table.feature_names))]
    labels = table.labels
    if labels is not None and label in bounds:
        clipped_label = int(np.sum((labels < bounds[label][0]) | (labels > bounds[label][1])))
        labels = to_unit_interval(labels, *bounds[label])
    else:
        clipped_label = 0
    lines = [",".join([*columns, *([label] if labels is not None else [])])]
    for i, row in enumerate(features):
        cells = [repr(float(v)) for v in row]
        if labels is not None:
            cells.append(repr(float(labels[i])) if label in bounds else f"{labels[i]:g}")
        lines.append(",".join(cells))
    write_text_atomically(output, "\n".join(lines) + "\n")
    counts = [f"{name} {int(n)}" for name, n in zip(table.feature_names, clipped, strict=True) if n]
    if clipped_label:
        counts.append(f"{label} {clipped_label}")
    note = f"; clipped to their bounds: {', '.join(counts)}" if counts else ""
    print(
        f"vips: wrote {table.rows} rows of norm <= 1 ({len(columns)} columns) to {output}{note}",
        file=sys.stderr,
    )
    return 0


def _missing_bounds(
    bounds_path: str,
    input_path: str,
    missing: list[str],
    columns: Sequence[str],
    bounds: dict[str, tuple[float, float]],
    label: str,
) -> str:
    """The error of a bounds file that misses feature columns: each missing one (with the unexpected name
    that is close to it, a typo), and the names of the bounds file that are no column of the input."""
    unexpected = [name for name in bounds if name not in columns and name != label]
    named = ", ".join(f"{name}{did_you_mean(name, unexpected)}" for name in missing)
    message = f"{bounds_path} has no bounds for column(s) {named}"
    if unexpected:
        message += f"; its bounds for {', '.join(unexpected)} name no column of {input_path}"
    return message
