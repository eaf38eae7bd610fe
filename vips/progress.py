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
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol

from privacy_wall.ledger.delta_policy import delta_problem


class Update(Protocol):
    """update(iterations done, epsilon spent so far or None when unknown, status, *, elapsed, eta): moves
    the bar. `elapsed`: seconds the shown span has already run (a reattached job's time since it started,
    so the clock does not restart at 0:00:00); `eta`: seconds left when the caller knows them better than
    the rate of the iterations seen (a queued job: at least the time of the job ahead of it)."""

    def __call__(
        self,
        done: int,
        epsilon: float | None,
        status: str,
        *,
        elapsed: float | None = None,
        eta: float | None = None,
    ) -> None: ...


def epsilon_text(epsilon: float | None) -> str:
    """Epsilon as people read it: 3 significant digits; inf for a non-private (sigma = 0) fit."""
    if epsilon is None:
        return "-"
    return "inf (sigma 0)" if math.isinf(epsilon) else f"{epsilon:.3g}"


def _clock(seconds: float) -> str:
    whole = max(0, int(seconds))
    return f"{whole // 3600}:{whole // 60 % 60:02d}:{whole % 60:02d}"


class _Clock:
    """Elapsed time and the estimated time left of one bar, from its own start (moved back by the
    `elapsed` a caller gives) and the iterations done since; an `eta` given wins until the next update."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.start = time.monotonic()
        self.done = 0
        self.eta: float | None = None
        self.eta_at = self.start

    def update(self, done: int, elapsed: float | None, eta: float | None) -> None:
        now = time.monotonic()
        if elapsed is not None:
            self.start = now - max(0.0, elapsed)
        self.done = int(done)
        self.eta, self.eta_at = eta, now

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def elapsed_text(self) -> str:
        return _clock(self.elapsed())

    def eta_text(self) -> str:
        if self.eta is not None:  # a floor the caller gave (the queue ahead), counted down
            return f">= {_clock(self.eta - (time.monotonic() - self.eta_at))}"
        if self.done >= self.total:
            return _clock(0)
        if self.done <= 0:
            return "-:--:--"
        return _clock(self.elapsed() / self.done * (self.total - self.done))


@contextmanager
def fit_progress(label: str, total: int, status: str = "running") -> Iterator[Update]:
    """A bar for `total` iterations of `label` on stderr; yields the function that moves it."""
    clock = _Clock(total)
    if sys.stderr.isatty():
        with _live_bar(label, total, status, clock) as live:
            yield live
        return
    shown: tuple[int, float | None, str] = (0, None, status)

    def update(
        done: int,
        epsilon: float | None,
        status: str,
        *,
        elapsed: float | None = None,
        eta: float | None = None,
    ) -> None:
        nonlocal shown
        shown = (int(done), epsilon, status)
        clock.update(done, elapsed, eta)

    try:
        yield update
    finally:
        done, epsilon, last = shown
        print(
            f"{label} {last} {done}/{total} eps {epsilon_text(epsilon)} {clock.elapsed_text()}",
            file=sys.stderr,
        )


@contextmanager
def _live_bar(label: str, total: int, status: str, clock: _Clock) -> Iterator[Update]:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, ProgressColumn, Task, TextColumn
    from rich.text import Text

    class _Elapsed(ProgressColumn):
        def render(self, task: Task) -> Text:
            return Text(clock.elapsed_text(), style="progress.elapsed")

    class _Remaining(ProgressColumn):
        def render(self, task: Task) -> Text:
            return Text(f"ETA {clock.eta_text()}", style="progress.remaining")

    columns = (
        TextColumn("{task.description} {task.fields[status]}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("eps {task.fields[epsilon]}"),
        _Elapsed(),
        _Remaining(),
    )
    with Progress(*columns, console=Console(stderr=True), transient=False) as bar:
        task = bar.add_task(label, total=total, status=status, epsilon=epsilon_text(None))

        def update(
            done: int,
            epsilon: float | None,
            status: str,
            *,
            elapsed: float | None = None,
            eta: float | None = None,
        ) -> None:
            clock.update(done, elapsed, eta)
            bar.update(task, completed=done, status=status, epsilon=epsilon_text(epsilon))

        yield update


def note(message: str) -> None:
    """A line for people on stderr, prefixed like every other CLI message."""
    print(f"vips: {message}", file=sys.stderr, flush=True)


def delta_warning(delta: float, population: int) -> str | None:
    """The warning of a calculator that takes a population (`vips privacy`, `vips fit --local`) when delta
    is not below 1/N, noted on stderr; None when it is. They price it all the same (the papers' settings
    have such deltas); a private dataset's budget refuses it (privacy_wall.ledger.delta_policy)."""
    problem = delta_problem(delta, population)
    if problem is None:
        return None
    warning = f"{problem}; a private dataset's budget with this delta is refused"
    note(f"warning: {warning}")
    return warning
