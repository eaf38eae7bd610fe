"""The dashboard's pieces of issue 37 item 5 without a browser (tests/test_ui_browser.py has them in one):
the spend plot's step labels and legend, its SVG made fit for the page, and a job's elapsed time and ETA."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from control.schemas import JobPublic
from service.ui import plots
from service.ui.svg import inline
from service.ui.views import job_timing

NOW = datetime(2026, 11, 28, 12, 0, 0, tzinfo=UTC)


def _spend(labels: list[str] | None, cumulative: list[float], budget: float | None = 1.0) -> bytes:
    ends = [NOW - timedelta(minutes=10 * (len(cumulative) - i)) for i in range(len(cumulative))]
    return plots.cumulative_epsilon(NOW - timedelta(hours=2), ends, cumulative, budget, 1e-5, "t", labels)


def test_each_step_is_a_group_titled_with_its_label_escaped() -> None:
    svg = _spend(["job a <b> & key", "job c", "job d"], [0.2, 0.5, float("inf")]).decode()
    titles = re.findall(r'<g id="step-(\d+)">\s*<title>(.*?)</title>', svg)
    assert titles == [("0", "job a &lt;b&gt; &amp; key"), ("1", "job c"), ("2", "job d")]
    assert '<g id="step-' not in _spend(None, [0.2, 0.5]).decode()  # no labels, no groups
    many = [0.01 * i for i in range(1, plots.MARKERS_UP_TO + 2)]
    assert "<title>" not in _spend(["x"] * len(many), many).decode()  # too many to draw one by one


@pytest.mark.slow
def test_the_legend_is_below_the_axes() -> None:
    unbounded = [0.2, float("inf")]
    cases = [([0.2, 0.5], 1.0, True), (unbounded, None, False), (unbounded, 3.0, True), ([], 1.0, False)]
    for cumulative, budget, titled in cases:
        ends = [NOW - timedelta(minutes=10 * (len(cumulative) - i)) for i in range(len(cumulative))]
        figure = plots.spend_figure(NOW - timedelta(hours=1), ends, cumulative, budget, 1e-5, "t", titled)
        figure.draw_without_rendering()
        (legend,) = figure.legends
        axes, box = figure.axes[0].get_window_extent(), legend.get_window_extent()
        assert box.y1 < axes.y0, (cumulative, budget)  # display coordinates: y grows upwards
        x_axis = figure.axes[0].xaxis
        for text in (x_axis.label, x_axis.get_offset_text(), *x_axis.get_ticklabels()):
            if text.get_text():
                assert box.y1 <= text.get_window_extent().y0, (text.get_text(), cumulative)
        assert box.x0 >= 0 and box.x1 <= figure.bbox.x1 and box.y0 >= 0  # and within the figure


def test_inline_svg_has_no_style_attribute_or_element_and_keeps_its_colours() -> None:
    page = inline(_spend(["job a"], [0.3]), css_class="plot spend", label='spend "on" x')
    assert page.startswith("<svg ") and "<?xml" not in page and "<!DOCTYPE" not in page
    assert "style=" not in page and "<style" not in page and "<metadata" not in page
    assert 'class="plot spend"' in page and 'aria-label="spend &quot;on&quot; x"' in page
    assert 'stroke-linejoin="round"' in page.split(">", 1)[0]  # matplotlib's * rule, on the root
    assert 'stroke="#1f5fa8"' in page and 'viewBox="' in page and 'width="' not in page.split(">", 1)[0]


def _job(**fields: Any) -> JobPublic:
    base: dict[str, Any] = {
        "id": "a" * 32, "dataset": "d", "key_name": None, "model": "blr", "algorithm": "vips",
        "status": "running", "iteration": 0, "iterations": 10, "batch_size": 5, "sigma": 1.0,
        "epsilon_target": None, "epsilon_job": 1.0, "epsilon_spent": 0.0, "delta": 1e-5, "options": {},
        "cancel_requested": False, "error": None, "created_at": NOW - timedelta(seconds=100),
        "started_at": None, "finished_at": None, "stored_bytes": 0, "outputs_deleted_at": None,
    }  # fmt: skip
    return JobPublic(**{**base, **fields})


def test_elapsed_time_counts_the_queue_and_the_eta_the_rate_so_far() -> None:
    queued = job_timing(_job(status="queued"), NOW)
    assert (queued.elapsed, queued.queued, queued.eta) == ("0:01:40", "0:01:40", "unknown until it starts")
    started = NOW - timedelta(seconds=40)
    first = job_timing(_job(started_at=started), NOW)
    assert first.queued == "0:01:00" and first.eta == "unknown until its first iteration"
    running = job_timing(_job(started_at=started, iteration=4), NOW)  # 10 s an iteration, 6 to go
    assert running.elapsed == "0:01:40" and running.eta == "0:01:00 (at the rate so far)"
    done = job_timing(
        _job(status="succeeded", started_at=started, iteration=10, finished_at=NOW - timedelta(seconds=3600)),
        NOW,
    )
    assert done.eta is None
    ended = _job(status="succeeded", started_at=started, iteration=10, finished_at=NOW)
    assert job_timing(ended, NOW + timedelta(hours=5)).elapsed == "0:01:40"  # stops at its end
