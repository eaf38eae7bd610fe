"""The progress of `vips fit --local` and `vips fit --wait` (on stderr; stdout keeps its JSON line).

On a terminal, rich's live bar: what runs and its status, a bar, iterations done of T, the epsilon spent
so far (at the job's delta), time elapsed and the estimated time left. Elsewhere (a file, a pipe) one
line with the final state when the fit ends, and rich is never imported (~60-100 ms of a local fit's
start-up).
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from privacy_wall.delta_policy import delta_problem

#: update(iterations done, epsilon spent so far or None when unknown, status)
Update = Callable[[int, float | None, str], None]


def epsilon_text(epsilon: float | None) -> str:
    """Epsilon as people read it: 3 significant digits; inf for a non-private (sigma = 0) fit."""
    if epsilon is None:
        return "-"
    return "inf (sigma 0)" if math.isinf(epsilon) else f"{epsilon:.3g}"


def _clock(seconds: float) -> str:
    whole = max(0, int(seconds))
    return f"{whole // 3600}:{whole // 60 % 60:02d}:{whole % 60:02d}"


@contextmanager
def fit_progress(label: str, total: int, status: str = "running") -> Iterator[Update]:
    """A bar for `total` iterations of `label` on stderr; yields the function that moves it."""
    if sys.stderr.isatty():
        with _live_bar(label, total, status) as live:
            yield live
        return
    started = time.monotonic()
    shown: tuple[int, float | None, str] = (0, None, status)

    def update(done: int, epsilon: float | None, now_status: str) -> None:
        nonlocal shown
        shown = (int(done), epsilon, now_status)

    try:
        yield update
    finally:
        done, epsilon, last = shown
        elapsed = _clock(time.monotonic() - started)
        print(f"{label} {last} {done}/{total} eps {epsilon_text(epsilon)} {elapsed}", file=sys.stderr)


@contextmanager
def _live_bar(label: str, total: int, status: str) -> Iterator[Update]:
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

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
    print(f"vips: {message}", file=sys.stderr, flush=True)


def delta_warning(delta: float, population: int) -> str | None:
    """The warning of a calculator that takes a population (`vips privacy`, `vips fit --local`) when delta
    is not below 1/N, noted on stderr; None when it is. They price it all the same (the papers' settings
    have such deltas); a private dataset's budget refuses it (privacy_wall.delta_policy)."""
    problem = delta_problem(delta, population)
    if problem is None:
        return None
    warning = f"{problem}; a private dataset's budget with this delta is refused"
    note(f"warning: {warning}")
    return warning
