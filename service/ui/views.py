"""What the dashboard's pages show, gathered with the same functions (and so the same scope rules) as
the HTTP API: a key sees on a page exactly what its role and scope see over /v1."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Engine, Row, select

from control.budgets import key_spend
from control.budgets.datasets import load_dataset
from control.caching import BoundedCache
from control.schemas import JobPublic
from control.store.keys import Principal, key_names
from control.store.models import jobs
from control.store.timestamps import aware
from privacy_wall.ledger.schema import budgets
from privacy_wall.sqlengine import reading
from service.http.auth import sees_job
from service.routes.job_reads import list_jobs, to_public
from service.ui import convergence
from service.ui import spend_curve as spend_curves
from service.ui.posterior_summary import (
    Coefficient,
    TopicWords,
    coefficients,
    repeated_topics_note,
    top_words,
)
from service.ui.spend_curve import SpendCurve, ledger_state, spend_curve

#: Jobs per page of a dataset's jobs table.
JOBS_PER_PAGE = 25

#: Keyed by the ledger's state (service.ui.spend_curve.ledger_state), the budget and the labels.
_plots: BoundedCache[bytes] = BoundedCache()


def clear_caches() -> None:
    """Forget every cached curve and plot (benchmarks measure the first request with this)."""
    spend_curves.clear()
    key_spend.clear_totals()
    _plots.clear()
    convergence.clear()


def spend_plot(
    engine: Engine, dataset: str, budget: float | None, delta: float, principal: Principal | None = None
) -> bytes:
    """The SVG of the dataset's spend curve with its budget line (service.ui.plots), cached likewise; with
    a `principal`, each job's step is labelled for hover (step_labels: what that key may read)."""
    with reading(engine) as conn:
        state = ledger_state(conn, dataset, delta)
    curve = spend_curve(engine, dataset, delta)
    labels = step_labels(engine, principal, dataset, curve) if principal is not None else None
    key = (*state, budget, None if labels is None else tuple(labels))

    def draw() -> bytes:
        from service.ui import plots  # matplotlib: only when a plot is drawn

        title = f"Epsilon spent on dataset {dataset}, job by job"
        if curve.jobs > len(curve.job_ids):
            title = f"Epsilon spent on dataset {dataset}: {curve.jobs:,} jobs, one in {curve.stride} drawn"
        ends, cumulative = curve.ends, curve.cumulative
        return plots.cumulative_epsilon(curve.start, ends, cumulative, budget, delta, title, labels)

    return _plots.get_or_compute(key, draw)


def step_labels(engine: Engine, principal: Principal, name: str, curve: SpendCurve) -> list[str] | None:
    """Each job's hover label on the spend plot, in the curve's order: the job, the key that submitted it
    (its name and id), its share and the total after it, for jobs this key may read (GET /v1/jobs's
    rules, service.http.auth.sees_job); another key's job shows its share only. None beyond the plot's
    MARKERS_UP_TO jobs (they are not drawn one by one)."""
    from service.ui.plots import MARKERS_UP_TO

    if not curve.job_ids or curve.jobs > MARKERS_UP_TO:
        return None
    with reading(engine) as conn:
        rows = {row.id: row for row in conn.execute(select(jobs).where(jobs.c.id.in_(curve.job_ids)))}
    dataset = load_dataset(engine, name) if principal.role == "custodian" else None
    owners = key_names(engine, (row.owner for row in rows.values()))
    labels, before = [], 0.0
    for job_id, total, end in zip(curve.job_ids, curve.cumulative, curve.ends, strict=True):
        share = "no privacy guarantee (sigma 0)" if not math.isfinite(total) else f"+{total - before:.4g}"
        when = end.strftime("%Y-%m-%d %H:%M:%S UTC")
        row = rows.get(job_id)
        if row is not None and sees_job(principal, row, dataset):
            owner = owners.get(row.owner)
            key = f"key {owner} ({row.owner})" if owner else f"key {row.owner}"
            who = f"job {job_id[:8]} by {key}, {row.model} {row.status}"
        else:
            who = "a job of another key"
        total_text = f"{total:.4g}" if math.isfinite(total) else "unbounded"
        labels.append(f"{who}: epsilon {share}, {total_text} in all, at {when}")
        before = total if math.isfinite(total) else before
    return labels


def warm_spend_curves(engine: Engine) -> None:
    """Compose the spend curve and the keys' totals of every dataset whose ledger changed since they were
    cached, so that a custodian's first look after a job is not the one that waits for the accountant."""
    with reading(engine) as conn:
        budgeted = conn.execute(select(budgets.c.dataset, budgets.c.delta)).all()
    spend_curves.warm(engine, [(dataset, delta) for dataset, delta in budgeted])
    for dataset, delta in budgeted:  # and each key's share of it (the custodian's table)
        key_spend.key_spend(engine, dataset, delta)


@dataclass(frozen=True)
class JobsPage:
    """One page of the jobs a key may read, newest first: their public views, the submitting key's id
    of each where the key administers the job's dataset (custodians and admins; None otherwise), and
    whether older jobs follow."""

    jobs: list[JobPublic]
    owners: dict[str, str] | None
    page: int
    more: bool


def readable_jobs(engine: Engine, principal: Principal, page: int, dataset: str | None = None) -> JobsPage:
    """Page `page` of the jobs this key may read (service.routes.job_reads.list_jobs: the rules of GET
    /v1/jobs), on `dataset` only if given."""
    rows = list_jobs(engine, principal, dataset=dataset, limit=JOBS_PER_PAGE + 1, offset=page * JOBS_PER_PAGE)
    shown = rows[:JOBS_PER_PAGE]
    owners = {row.id: row.owner for row in shown} if principal.role in ("admin", "custodian") else None
    return JobsPage(to_public(engine, shown), owners, page, len(rows) > JOBS_PER_PAGE)


def convergence_plot(engine: Engine, job: Row[Any], population: int) -> bytes:
    """The SVG of the job's convergence signal (service.ui.convergence), cached by (job, iterations
    released): a new release is a new key, so nothing cached is ever stale."""
    key = ("convergence", job.id, convergence.released_count(engine, job.id))
    svg = _plots.get(key)
    if svg is None:
        from service.ui import plots  # matplotlib: only when a plot is drawn

        shown = convergence.curve(engine, job, population)
        title = f"Is job {job.id[:8]} still moving? {shown.last} iterations released"
        svg = plots.convergence(
            shown.iterations, shown.values, shown.signal.label, title, shown.signal is convergence.NATURAL
        )
        _plots.put(key, svg)
    return svg


@dataclass(frozen=True)
class PosteriorSummary:
    """What a job page shows of its posterior, by model family."""

    model: str
    coefficients: list[Coefficient] | None = None
    topics: list[TopicWords] | None = None
    hidden_units: int | None = None
    #: SBN: units with any non-zero weight (the noise-aware M-step switches off what the noise cannot
    #: support; none active: the posterior is its private pixel frequencies alone, the fallback).
    active_units: int | None = None
    square_pixels: bool = False
    #: LDA: what to say when topics are one word distribution, the private word frequencies (None: none are).
    topics_note: str | None = None


def summarize(document: dict[str, Any], schema: dict[str, Any]) -> PosteriorSummary:
    model = str(document.get("model"))
    if model in ("blr", "linreg"):
        names = schema.get("features")
        return PosteriorSummary(
            model, coefficients=coefficients(document, names if isinstance(names, list) else None)
        )
    if model == "lda":
        return PosteriorSummary(
            model, topics=top_words(document, 10), topics_note=repeated_topics_note(document)
        )
    if model == "sbn":
        weights = document["W"]
        pixels = len(weights)
        return PosteriorSummary(
            model,
            hidden_units=len(weights[0]) if weights else 0,
            active_units=sum(any(row[k] != 0 for row in weights) for k in range(len(weights[0])))
            if weights
            else 0,
            square_pixels=math.isqrt(pixels) ** 2 == pixels,
        )
    return PosteriorSummary(model)


def remaining_fraction(budget: Any) -> tuple[float, float]:
    """The spent and reserved shares of a capped budget, for its bar (each in [0, 1])."""
    if budget is None or budget.epsilon is None or budget.epsilon <= 0:
        return 0.0, 0.0
    spent = min(budget.epsilon_spent / budget.epsilon, 1.0)
    held = (
        0.0
        if budget.epsilon_reserved == budget.epsilon_spent
        else budget.epsilon_reserved - budget.epsilon_spent
    )
    reserved = min(max(held, 0.0) / budget.epsilon, 1.0 - spent)
    return spent, reserved


def _clock(seconds: float) -> str:
    whole = max(0, int(seconds))
    return f"{whole // 3600}:{whole // 60 % 60:02d}:{whole % 60:02d}"


@dataclass(frozen=True)
class Timing:
    """A job page's clock: time since submission (to its end, or now), of which queued, and the time
    left at the rate of the iterations so far (running jobs) or why it is not known yet."""

    elapsed: str
    queued: str
    eta: str | None


def job_timing(job: JobPublic, now: datetime | None = None) -> Timing:
    now = now or datetime.now(UTC)
    created, started, finished = aware(job.created_at), aware(job.started_at), aware(job.finished_at)
    end = finished or now
    eta: str | None = None
    if job.status == "queued":
        eta = "unknown until it starts"
    elif job.status == "running":
        if started is None or job.iteration <= 0:
            eta = "unknown until its first iteration"
        else:
            per_iteration = (now - started).total_seconds() / job.iteration
            eta = f"{_clock(per_iteration * (job.iterations - job.iteration))} (at the rate so far)"
    queued = _clock(((started or end) - created).total_seconds())
    return Timing(_clock((end - created).total_seconds()), queued, eta)
