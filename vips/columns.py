"""Input columns matched to a posterior's by name, so that their order in a file or a frame does not matter.

A posterior of a tabular model names its feature columns (`columns`, docs/posterior-format.md); an input
that names its columns too (a CSV header, a DataFrame-like object's `columns`, a numpy structured array's
fields) is reordered to them, and any column missing from the input or unknown to the posterior is an
error naming every such column. Names are public schema (never cell values), so errors may show them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from privacy_wall.names import did_you_mean


class ColumnMismatch(ValueError):
    """An input whose column names are not the posterior's: the message names every missing and unexpected
    column (also kept as `missing` and `unexpected`)."""

    def __init__(self, message: str, missing: Sequence[str] = (), unexpected: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.missing = tuple(missing)
        self.unexpected = tuple(unexpected)


#: Columns a mismatch names in each of its lists before "and N more".
SHOWN_COLUMNS = 5


def _first(names: Sequence[str], shown: Callable[[str], str]) -> str:
    """The first SHOWN_COLUMNS names, each as `shown` renders it, and how many more there are."""
    listed = ", ".join(shown(name) for name in names[:SHOWN_COLUMNS])
    more = len(names) - SHOWN_COLUMNS
    return listed + (f" and {more} more" if more > 0 else "")


def column_order(
    given: Sequence[str], expected: Sequence[str], *, source: str = "the input"
) -> NDArray[np.intp]:
    """Indices into `given` that put its columns in `expected`'s order; ColumnMismatch naming every missing,
    unexpected and repeated column otherwise."""
    position: dict[str, int] = {}
    repeated: list[str] = []
    for index, name in enumerate(given):
        if name in position and name not in repeated:
            repeated.append(name)
        position.setdefault(name, index)
    known = set(expected)
    missing = [name for name in expected if name not in position]
    unexpected = [name for name in position if name not in known]
    if missing or unexpected or repeated:
        shared = len(known) - len(missing)
        # a missing column next to an unexpected one of a close name is a typo: name the pair (only where a
        # few are missing: between two unrelated files every close name would be a false lead)
        typos = len(missing) <= SHOWN_COLUMNS and shared > 0
        problems = [
            f"{label} {_first(names, (lambda n: f'{n!r}{did_you_mean(n, unexpected)}') if typo else repr)}"
            for label, names, typo in (
                ("missing", missing, typos),
                ("unexpected", unexpected, False),
                ("repeated", repeated, False),
            )
            if names
        ]
        unrelated = (
            " (none of them is one of the posterior's: a file for another dataset?)" if not shared else ""
        )
        raise ColumnMismatch(
            f"{source}: its {len(given)} columns do not match the posterior's {len(expected)} columns"
            f"{unrelated}: " + "; ".join(problems),
            missing,
            unexpected,
        )
    return np.fromiter((position[name] for name in expected), dtype=np.intp, count=len(expected))


def input_columns(X: Any) -> tuple[str, ...] | None:
    """The column names X carries: a DataFrame-like `columns` of strings, or a numpy structured array's
    fields; None for anything else (a plain array, a list, a sparse matrix)."""
    fields = getattr(getattr(X, "dtype", None), "names", None)
    if isinstance(X, np.ndarray) and fields:
        return tuple(fields)
    columns = getattr(X, "columns", None)
    if columns is None or isinstance(X, np.ndarray):
        return None
    names = tuple(columns)
    if names and all(isinstance(name, str) for name in names):
        return names
    return None


def by_name(X: Any, expected: Sequence[str] | None, *, source: str = "X") -> Any:
    """X as a float array with its columns in `expected`'s order when X names its columns (input_columns)
    and `expected` is known; otherwise X unchanged (positional, as for any array), but a structured array
    as a float array of its fields in their order."""
    given = input_columns(X)
    structured = isinstance(X, np.ndarray) and bool(X.dtype.names)
    if given is None or (expected is None and not structured):
        return X
    names = given if expected is None else expected
    order = column_order(given, names, source=source)
    if structured:
        return np.column_stack([np.asarray(X[name], dtype=np.float64) for name in names])
    return np.asarray(X, dtype=np.float64)[:, order]
