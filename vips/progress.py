"""The progress bar of `vips fit --local` and `vips fit --wait` (on stderr; stdout keeps its JSON line).

One line: what runs and its status, a bar, iterations done of T, the epsilon spent so far (at the
job's delta), time elapsed and the estimated time left.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

#: update(iterations done, epsilon spent so far or None when unknown, status)
Update = Callable[[int, float | None, str], None]


def epsilon_text(epsilon: float | None) -> str:
    """Epsilon as people read it: 3 significant digits; inf for a non-private (sigma = 0) fit."""
    if epsilon is None:
        return "-"
    return "inf (sigma 0)" if math.isinf(epsilon) else f"{epsilon:.3g}"


@contextmanager
def fit_progress(label: str, total: int, status: str = "running") -> Iterator[Update]:
    """A bar for `total` iterations of `label`; yields the function that moves it."""
    columns = (
        TextColumn("{task.description} {task.fields[status]}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("eps {task.fields[epsilon]}"),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=Console(stderr=True), transient=False) as bar:
        task = bar.add_task(label, total=total, status=status, epsilon=epsilon_text(None))

        def update(done: int, epsilon: float | None, status: str) -> None:
            bar.update(task, completed=done, status=status, epsilon=epsilon_text(epsilon))

        yield update


def note(message: str) -> None:
    """A line for people on stderr, prefixed like every other CLI message."""
    Console(stderr=True, highlight=False, soft_wrap=True).print(f"vips: {message}", markup=False)
