"""What the dashboard's pages show, gathered with the same functions (and so the same scope rules) as
the HTTP API: a key sees on a page exactly what its role and scope see over /v1."""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Generic, TypeVar

from sqlalchemy import Engine, Row, func, select

from privacy_wall.accounting.accountants import PrivacyCost, configured_accountant
from privacy_wall.ledger.schema import budgets, charges
from privacy_wall.sqlengine import reading
from service.budgets.datasets import load_dataset
from service.budgets.job_costs import job_costs
from service.http.auth import sees_job
from service.routes.job_reads import list_jobs, to_public
from service.schemas import JobPublic
from service.store.keys import Principal, key_names
from service.store.models import jobs
from service.store.timestamps import aware
from service.ui import convergence
from service.ui.posterior_summary import Coefficient, TopicWords, coefficients, top_words

T = TypeVar("T")

#: Jobs per page of a dataset's jobs table.
JOBS_PER_PAGE = 25


@dataclass(frozen=True)
class SpendCurve:
    """Epsilon spent over time: one point per job that has charges, at its end (now, while it runs),
    the composition of every job's charges up to and including it, at the dataset's delta."""

    ends: list[datetime]
    cumulative: list[float]
    job_ids: list[str]
    start: datetime | None = None  # the first charged job's submission: the curve starts there at 0


class _Cache(Generic[T]):
    """A bounded map, least recently used out first, safe across the request threads."""

    def __init__(self, size: int = 64) -> None:
        self._items: OrderedDict[tuple[Any, ...], T] = OrderedDict()
        self._size = size
        self._lock = threading.Lock()

    def get(self, key: tuple[Any, ...]) -> T | None:
        with self._lock:
            value = self._items.get(key)
            if value is not None:
                self._items.move_to_end(key)
            return value

    def clear(self) -> None:
        with self._lock:
            self._items.clear()

    def put(self, key: tuple[Any, ...], value: T) -> None:
        with self._lock:
            self._items[key] = value
            self._items.move_to_end(key)
            while len(self._items) > self._size:
                self._items.popitem(last=False)


#: Keyed by the ledger's state (dataset, number of charges, last charge id, accountant, delta): a new
#: charge or another accountant is a new key, so nothing cached is ever stale.
_curves: _Cache[SpendCurve] = _Cache()
_plots: _Cache[bytes] = _Cache()


def clear_caches() -> None:
    """Forget every cached curve and plot (benchmarks measure the first request with this)."""
    _curves.clear()
    _plots.clear()
    convergence.clear()


def _ledger_state(conn: Any, dataset: str, delta: float) -> tuple[Any, ...]:
    count, last = conn.execute(
        select(func.count(), func.max(charges.c.id)).where(charges.c.dataset == dataset)
    ).one()
    # The database too: the caches are per process, and one process may serve several (the tests do).
    return (str(conn.engine.url), dataset, count, last, configured_accountant().version, delta)


def spend_plot(
    engine: Engine, dataset: str, budget: float | None, delta: float, principal: Principal | None = None
) -> bytes:
    """The SVG of the dataset's spend curve with its budget line (service.ui.plots), cached likewise; with
    a `principal`, each job's step is labelled for hover (step_labels: what that key may read)."""
    with reading(engine) as conn:
        state = _ledger_state(conn, dataset, delta)
    curve = spend_curve(engine, dataset, delta)
    labels = step_labels(engine, principal, dataset, curve) if principal is not None else None
    key = (*state, budget, None if labels is None else tuple(labels))
    svg = _plots.get(key)
    if svg is None:
        from service.ui import plots  # matplotlib: only when a plot is drawn

        title = f"Epsilon spent on dataset {dataset}, job by job"
        svg = plots.cumulative_epsilon(
            curve.start, curve.ends, curve.cumulative, budget, delta, title, labels
        )
        _plots.put(key, svg)
    return svg


def step_labels(engine: Engine, principal: Principal, name: str, curve: SpendCurve) -> list[str] | None:
    """Each job's hover label on the spend plot, in the curve's order: the job, the key that submitted it
    (its name and id), its share and the total after it, for jobs this key may read (GET /v1/jobs's
    rules, service.http.auth.sees_job); another key's job shows its share only. None beyond the plot's
    MARKERS_UP_TO jobs (they are not drawn one by one)."""
    from service.ui.plots import MARKERS_UP_TO

    if not curve.job_ids or len(curve.job_ids) > MARKERS_UP_TO:
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
    """Price the spend curve of every dataset whose ledger changed since its curve was cached, so that
    a custodian's first look after a job is not the one that waits for the accountant."""
    with reading(engine) as conn:
        budgeted = conn.execute(select(budgets.c.dataset, budgets.c.delta)).all()
    for dataset, delta in budgeted:
        spend_curve(engine, dataset, delta)


def spend_curve(engine: Engine, dataset: str, delta: float) -> SpendCurve:
    """The dataset's cumulative epsilon per job end (SpendCurve), priced by the configured accountant."""
    with reading(engine) as conn:
        key = _ledger_state(conn, dataset, delta)
        cached = _curves.get(key)
        if cached is not None:
            return cached
        charged = select(charges.c.job_id).where(charges.c.dataset == dataset).distinct()
        rows = conn.execute(
            select(jobs.c.id, jobs.c.finished_at, jobs.c.created_at).where(jobs.c.id.in_(charged))
        ).all()
    now = datetime.now(UTC)
    ordered = sorted(rows, key=lambda r: (aware(r.finished_at) or now, aware(r.created_at), r.id))
    costs = job_costs(engine, [r.id for r in ordered])
    curve = SpendCurve([], [], [], min((aware(r.created_at) for r in ordered), default=None))
    if ordered:
        prefix = PrivacyCost.zero(costs[ordered[0].id].accountant)
        for row in ordered:  # each prefix extends the last by one job (the accountant caches compositions)
            prefix = prefix + costs[row.id]
            curve.ends.append(aware(row.finished_at) or now)
            curve.cumulative.append(prefix.epsilon(delta))
            curve.job_ids.append(row.id)
    _curves.put(key, curve)
    return curve


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
    square_pixels: bool = False


def summarize(document: dict[str, Any], schema: dict[str, Any]) -> PosteriorSummary:
    model = str(document.get("model"))
    if model in ("blr", "linreg"):
        names = schema.get("features")
        return PosteriorSummary(
            model, coefficients=coefficients(document, names if isinstance(names, list) else None)
        )
    if model == "lda":
        return PosteriorSummary(model, topics=top_words(document, 10))
    if model == "sbn":
        weights = document["W"]
        pixels = len(weights)
        return PosteriorSummary(
            model,
            hidden_units=len(weights[0]) if weights else 0,
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
