"""The dashboard's plots, rendered server-side as SVG by matplotlib (no script, no font from elsewhere:
text is drawn as paths). Each has a title, labelled axes and units a custodian reads without help."""

from __future__ import annotations

import html
import io
import math
from collections.abc import Sequence
from datetime import datetime

import matplotlib

matplotlib.use("Agg")  # never a window, whatever the environment says
from matplotlib.dates import AutoDateLocator, ConciseDateFormatter
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter

matplotlib.rcParams["svg.fonttype"] = "path"
matplotlib.rcParams["svg.hashsalt"] = "vips"  # the same plot gives the same bytes

_SPENT, _BUDGET, _SHARE = "#1f5fa8", "#b8322a", "#9db7d6"
#: Room for the spend plot's axis labels and, under the x label, its legend (outside the axes, so never
#: over the data), as fractions of the figure.
_MARGINS = {"left": 0.12, "right": 0.98, "bottom": 0.27, "top": 0.91}


#: Above this many points a curve is drawn as a line alone (markers would be a blur, and slow to draw).
MARKERS_UP_TO = 200


def _svg(figure: Figure) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="svg", metadata={"Date": None})
    return buffer.getvalue()


def cumulative_epsilon(
    start: datetime | None,
    ends: Sequence[datetime],
    cumulative: Sequence[float],
    budget: float | None,
    delta: float,
    title: str,
    labels: Sequence[str] | None = None,
) -> bytes:
    """Epsilon spent over time (spend_figure) as SVG. With `labels` (one per job, at most MARKERS_UP_TO
    jobs), each job's step is its own group <g id="step-I"> whose <title> is its label: a browser shows it
    on hover when the SVG is in the page (service.ui.svg.inline)."""
    titled = labels is not None and len(labels) == len(ends) and len(ends) <= MARKERS_UP_TO
    svg = _svg(spend_figure(start, ends, cumulative, budget, delta, title, titled))
    if titled:
        assert labels is not None
        for i, label in enumerate(labels):
            group = f'<g id="step-{i}">'.encode()
            svg = svg.replace(group, group + f"<title>{html.escape(label)}</title>".encode(), 1)
    return svg


def spend_figure(
    start: datetime | None,
    ends: Sequence[datetime],
    cumulative: Sequence[float],
    budget: float | None,
    delta: float,
    title: str,
    titled: bool = False,
) -> Figure:
    """Epsilon spent over time: nothing at `start` (the first job's submission), then one point per job
    at its end, the composition of every job up to it (so each step is that job's share of the spend),
    and the budget's cap as a line. `titled`: each job's rise and point is its own artist, gid step-I.
    The legend is under the axes, never over the data."""
    figure = Figure(figsize=(7.5, 3.9), dpi=100)
    figure.subplots_adjust(**_MARGINS)  # fixed margins: half the time of a layout engine
    axes = figure.add_subplot()
    if ends:
        first = [start] if start is not None and start < ends[0] else []
        # matplotlib's dates: days since 1970 (UTC)
        days = [moment.timestamp() / 86400.0 for moment in [*first, *ends]]
        # From a sigma = 0 job (public data) on, the spend is unbounded: a shaded span, not a value.
        unbounded = next((i for i, value in enumerate(cumulative) if not math.isfinite(value)), None)
        cumulative = [0.0] * len(first) + [
            value if math.isfinite(value) else math.nan for value in cumulative
        ]
        span = days[-1] - days[0]
        pad = max(span * 0.04, 2 / 1440)  # at least two minutes either side
        axes.set_xlim(days[0] - pad, days[-1] + pad)
        axes.step(
            days, cumulative, where="post", color=_SPENT, linewidth=1.8, label="epsilon spent", gid="spend"
        )
        if titled:
            values = cumulative[len(first) :]
            for i, (day, low, high) in enumerate(
                zip(days[len(first) :], [0.0, *values[:-1]], values, strict=True)
            ):
                # the job's rise and its point: an invisible wide stroke to hover, and the marker
                axes.plot([day, day], [low, high], color=(0, 0, 0, 0), linewidth=9, solid_capstyle="butt",
                          marker="o", markevery=[1], markersize=4.5, markerfacecolor=_SPENT,
                          markeredgecolor=_SPENT, gid=f"step-{i}")  # fmt: skip
        elif len(days) <= MARKERS_UP_TO:
            axes.plot(days, cumulative, "o", color=_SPENT, markersize=3.5)
        axes.fill_between(days, cumulative, step="post", color=_SHARE, alpha=0.35)
        if unbounded is not None:
            axes.axvspan(
                days[len(first) + unbounded], days[-1] + pad, color=_BUDGET, alpha=0.12,
                label="unbounded: a sigma = 0 job (no privacy guarantee)",
            )  # fmt: skip
        locator = AutoDateLocator()  # type: ignore[no-untyped-call]
        axes.xaxis.set_major_locator(locator)
        axes.xaxis.set_major_formatter(ConciseDateFormatter(locator))  # type: ignore[no-untyped-call]
    else:
        axes.text(
            0.5, 0.5, "no job has spent any epsilon yet", ha="center", va="center", transform=axes.transAxes
        )
    top = max([value for value in cumulative if math.isfinite(value)] + [0.0])
    if budget is not None and math.isfinite(budget):
        axes.axhline(
            budget, color=_BUDGET, linestyle="--", linewidth=1.4, label=f"budget (epsilon {budget:g})"
        )
        top = max(top, budget)
    axes.set_ylim(0, top * 1.12 if top > 0 else 1.0)
    axes.set_ylabel(f"epsilon spent (at delta {delta:g})")
    axes.set_xlabel("time (UTC) at which each job ended")
    axes.set_title(title)
    axes.grid(alpha=0.3)
    if ends or budget is not None:
        handles, names = axes.get_legend_handles_labels()
        figure.legend(handles, names, loc="lower center", ncol=3, frameon=False, fontsize=9)
    return figure


def _plain(value: float, unit: str) -> str:
    """A tick label as people write numbers: 0.01, 2.5, 300 (no exponent), with the unit (%) if any."""
    text = f"{value:.6f}".rstrip("0").rstrip(".") if value < 1000 else f"{value:,.0f}"
    return f"{text}{unit}"


def convergence(
    iterations: Sequence[int], values: Sequence[float], label: str, title: str, percent: bool
) -> bytes:
    """One line per job: the signal of service.ui.convergence at each iteration (log scale when it spans
    more than a decade and stays above 0), labelled in words, with plain tick labels."""
    figure = Figure(figsize=(7.5, 3.4), dpi=100)
    figure.subplots_adjust(left=0.12, right=0.97, bottom=0.16, top=0.9)
    axes = figure.add_subplot()
    unit = "%" if percent else ""
    if values:
        marker = "o" if len(values) <= MARKERS_UP_TO else None
        axes.plot(list(iterations), list(values), color=_SPENT, linewidth=1.4, marker=marker, markersize=3)
        low, high = min(values), max(values)
        if low > 0 and high > 10 * low:
            axes.set_yscale("log")
            axes.yaxis.set_major_locator(LogLocator(base=10, numticks=8))
            axes.yaxis.set_minor_formatter(NullFormatter())
        else:
            axes.set_ylim(0, high * 1.1 if high > 0 else 1.0)
            axes.yaxis.set_major_locator(MaxNLocator(nbins=6))
        axes.yaxis.set_major_formatter(FuncFormatter(lambda v, _: _plain(v, unit)))
    else:
        axes.text(0.5, 0.5, "two releases are needed to see a change", ha="center", va="center",
                  transform=axes.transAxes)  # fmt: skip
        axes.set_yticks([])
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.0f}"))
    axes.set_xlabel("iteration")
    axes.set_ylabel(label, fontsize=9)
    axes.set_title(title)
    axes.grid(alpha=0.3)
    return _svg(figure)


def coefficients(names: Sequence[str], means: Sequence[float], lower: Sequence[float], upper: Sequence[float],
                 title: str) -> bytes:  # fmt: skip
    """Posterior means with their 95% credible intervals, one row per coefficient."""
    rows = len(names)
    figure = Figure(layout="constrained", figsize=(7.5, 0.9 + 0.24 * rows), dpi=100)
    axes = figure.add_subplot()
    positions = list(range(rows))[::-1]
    errors = [
        [m - lo for m, lo in zip(means, lower, strict=True)],
        [hi - m for m, hi in zip(means, upper, strict=True)],
    ]
    axes.errorbar(
        means, positions, xerr=errors, fmt="o", color=_SPENT, ecolor=_SHARE, capsize=2, markersize=4
    )
    axes.axvline(0.0, color="#666666", linewidth=0.8)
    axes.set_yticks(positions, labels=list(names), fontsize=8)
    axes.set_xlabel("coefficient (posterior mean, 95% credible interval)")
    axes.set_title(title)
    axes.grid(alpha=0.3, axis="x")
    return _svg(figure)


def weight_images(weights: Sequence[Sequence[float]], title: str) -> bytes:
    """Each hidden unit's weights over the pixels as a small square image (blue negative, red
    positive, on one colour scale), for SBN posteriors whose pixels form a square."""
    units = len(weights)
    side = math.isqrt(len(weights[0]))
    columns = min(units, 10)
    rows = math.ceil(units / columns)
    figure = Figure(layout="constrained", figsize=(0.8 * columns + 0.6, 0.8 * rows + 0.6), dpi=100)
    scale = max(max(abs(v) for v in row) for row in weights) or 1.0
    for j, row in enumerate(weights):
        axes = figure.add_subplot(rows, columns, j + 1)
        image = [list(row[r * side : (r + 1) * side]) for r in range(side)]
        axes.imshow(image, cmap="RdBu_r", vmin=-scale, vmax=scale, interpolation="nearest")
        axes.set_xticks([])
        axes.set_yticks([])
        axes.set_title(f"unit {j}", fontsize=7)
    figure.suptitle(title, fontsize=10)
    return _svg(figure)
