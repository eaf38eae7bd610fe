"""A dataset's spend curve: the composed epsilon after each job, in the order the jobs ended, computed
once per ledger state for every viewer and extended, not recomputed, as jobs end (issue 52).

The curve's points are prefixes of the ledger: point i is the composition of the first i + 1 jobs' charges
(control.budgets.job_costs) at the dataset's delta, by the configured accountant. Each ledger (database,
dataset, accountant, delta) keeps what it last composed: the jobs in order with each one's cost, and the
running total every CHECKPOINT jobs. A new ledger state reads again only the jobs charged since and those
then running, re-adds only from the last checkpoint before the first of them in the curve's order, and
prices only the points drawn after it. Beyond DRAWN_POINTS jobs the curve is drawn through every 2^k-th
job (and the last, each running job, and the first without a guarantee): the composed spend only grows,
so the coarser step curve is the same picture, and a history of 10,000 jobs costs 512 pricings once and
a few per job after.
"""

from __future__ import annotations

import heapq
import math
import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, Engine, func, select

from control.budgets.job_costs import id_chunks, job_costs
from control.caching import BoundedCache
from control.store.models import jobs
from control.store.timestamps import aware
from privacy_wall.accounting.accountants import PrivacyCost, configured_accountant
from privacy_wall.ledger import database as ledger_db
from privacy_wall.ledger.schema import charges
from privacy_wall.sqlengine import reading

#: Jobs between two stored running totals (a changed job re-adds at most this many before it).
CHECKPOINT = 256
#: Above this many jobs the curve is drawn through every 2^k-th job (see the module docstring).
DRAWN_POINTS = 512


@dataclass(frozen=True)
class SpendCurve:
    """Epsilon spent over time: one point per job that has charges (every 2^k-th beyond DRAWN_POINTS
    jobs), at its end (now, while it runs), the composition of every job's charges up to and including
    it, at the dataset's delta. `jobs`: how many jobs the curve composes; `stride`: one in how many is
    drawn (service.ui.spend_curve.stride)."""

    ends: list[datetime]
    cumulative: list[float]
    job_ids: list[str]
    start: datetime | None = None  # the first charged job's submission: the curve starts there at 0
    jobs: int = 0
    stride: int = 1


@dataclass
class _Composed:
    """What one ledger composed last: its jobs in curve order, each one's cost and (end, submission), the
    total of the first i jobs at each checkpoint i (a multiple of CHECKPOINT), the epsilon after job i at
    the points priced so far, and the ledger's charge count and last charge id it read."""

    job_ids: list[str] = field(default_factory=list)
    costs: dict[str, PrivacyCost] = field(default_factory=dict)
    times: dict[str, tuple[datetime | None, datetime]] = field(default_factory=dict)
    totals: dict[int, PrivacyCost] = field(default_factory=dict)
    epsilons: dict[int, float] = field(default_factory=dict)
    charges: int = 0
    last_charge: int | None = None
    last_which: tuple[Any, ...] | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)


#: Keyed by the ledger's state (ledger_state): a new charge or another accountant is a new key, so a
#: cached curve is never stale; viewers of one state share one computation.
_curves: BoundedCache[SpendCurve] = BoundedCache()
#: Keyed by the ledger alone (database, dataset, accountant, delta): what the next state extends.
_composed: BoundedCache[_Composed] = BoundedCache()
_composed_lock = threading.Lock()


def clear() -> None:
    """Forget every curve and composition (benchmarks measure the first request with this)."""
    _curves.clear()
    _composed.clear()


def ledger_state(conn: Any, dataset: str, delta: float) -> tuple[Any, ...]:
    """(database, dataset, the ledger's charges (ledger_charges), accountant version, delta): changes with
    every charge and every withdrawn one."""
    # The database too: the caches are per process, and one process may serve several (the tests do).
    return (
        str(conn.engine.url),
        dataset,
        *ledger_db.ledger_charges(conn, dataset),
        configured_accountant().version,
        delta,
    )


def spend_curve(engine: Engine, dataset: str, delta: float) -> SpendCurve:
    """The dataset's cumulative epsilon per job end (SpendCurve), priced by the configured accountant."""
    with reading(engine) as conn:
        state = ledger_state(conn, dataset, delta)
    cached = _curves.get(state)
    if cached is not None:
        return cached
    ledger = (state[0], dataset, configured_accountant().version, delta)
    with _composed_lock:
        composed = _composed.get(ledger)
        if composed is None:
            composed = _Composed()
            _composed.put(ledger, composed)
    with composed.lock:  # one computation per ledger; viewers that waited find the curve cached
        cached = _curves.get(state)
        if cached is None:
            cached = _extend(engine, dataset, delta, composed)
            _curves.put(state, cached)
    return cached


def stride(count: int) -> int:
    """One point in how many is drawn among `count` jobs: the least power of 2 that keeps the points
    within DRAWN_POINTS (1 up to it). Doubling keeps every point already priced."""
    step = 1
    while count > step * DRAWN_POINTS:
        step *= 2
    return step


def drawn(count: int, running_from: int) -> list[int]:
    """The indices of the points drawn among `count` jobs, of which those from `running_from` on are
    still running: every stride(count)-th, the last and every running job."""
    step = stride(count)
    chosen = set(range(step - 1, count, step)) | set(range(running_from, count))
    if count:
        chosen.add(count - 1)
    return sorted(chosen)


def _extend(engine: Engine, dataset: str, delta: float, composed: _Composed) -> SpendCurve:
    """Bring `composed` up to the ledger's present state and return the curve: only the jobs charged since
    it last read the ledger, and those then running, are read again (all of them after a withdrawn
    charge); only the points from the first job that moved or changed are priced again."""
    with reading(engine) as conn:
        count, last, which = ledger_db.ledger_charges(conn, dataset)
        changed = _changed_jobs(conn, dataset, composed, count)
        if changed is None:  # compose afresh
            composed.job_ids, composed.costs, composed.times = [], {}, {}
            composed.totals, composed.epsilons = {}, {}
            charged = select(charges.c.job_id).where(charges.c.dataset == dataset).distinct()
            rows = conn.execute(
                select(jobs.c.id, jobs.c.finished_at, jobs.c.created_at).where(jobs.c.id.in_(charged))
            ).all()
        else:
            rows = [
                row
                for chunk in id_chunks(sorted(changed))
                for row in conn.execute(
                    select(jobs.c.id, jobs.c.finished_at, jobs.c.created_at).where(jobs.c.id.in_(chunk))
                )
            ]
    composed.charges, composed.last_charge, composed.last_which = count, last, which
    moved = {row.id for row in rows}
    composed.costs.update(job_costs(engine, sorted(moved)))
    for row in rows:
        composed.times[row.id] = (aware(row.finished_at), aware(row.created_at))
    now = datetime.now(UTC)

    def order(job_id: str) -> tuple[datetime, datetime, str]:
        end, submitted = composed.times[job_id]
        return (end or now, submitted, job_id)

    previous = composed.job_ids
    # The jobs not read again ended before and keep their places; the others are sorted in among them.
    ids = list(heapq.merge([i for i in previous if i not in moved], sorted(moved, key=order), key=order))
    same = 0  # the jobs composed before, unchanged and in the same place
    for old_id, new_id in zip(previous, ids, strict=False):
        if old_id != new_id or old_id in moved:
            break
        same += 1
    base = (same // CHECKPOINT) * CHECKPOINT
    composed.job_ids = ids
    composed.totals = {i: total for i, total in composed.totals.items() if i <= base}
    composed.epsilons = {i: eps for i, eps in composed.epsilons.items() if i < same}
    running_from = next((i for i, job_id in enumerate(ids) if composed.times[job_id][0] is None), len(ids))
    points = drawn(len(ids), running_from)
    wanted = {i for i in points if i not in composed.epsilons}
    if ids:
        total = composed.totals.get(base, PrivacyCost.zero(composed.costs[ids[0]].accountant))
        bounded = _finite(total)
        for i in range(base, len(ids)):
            if i % CHECKPOINT == 0:
                composed.totals[i] = total
            total = total + composed.costs[ids[i]]
            if bounded and not _finite(total):
                bounded = False
                wanted.add(i)  # the first job without a guarantee: where the plot's shading starts
            if i in wanted and i not in composed.epsilons:
                composed.epsilons[i] = total.epsilon(delta)
    unbounded = min((i for i, eps in composed.epsilons.items() if not math.isfinite(eps)), default=None)
    if unbounded is not None:
        points = sorted({*points, unbounded})
    return SpendCurve(
        ends=[composed.times[ids[i]][0] or now for i in points],
        cumulative=[composed.epsilons[i] for i in points],
        job_ids=[ids[i] for i in points],
        start=min((submitted for _, submitted in composed.times.values()), default=None),
        jobs=len(ids),
        stride=stride(len(ids)),
    )


def _changed_jobs(conn: Connection, dataset: str, composed: _Composed, count: int) -> set[str] | None:
    """The jobs charged since `composed` last read the ledger, and those then running; None when it must
    be composed afresh (never composed, or a charge was withdrawn: the count does not add up)."""
    if composed.last_charge is None:
        return None
    then = conn.execute(
        select(charges.c.job_id, charges.c.iteration, charges.c.attempt).where(
            charges.c.id == composed.last_charge
        )
    ).one_or_none()
    if then is None or tuple(then) != composed.last_which:  # withdrawn, its id perhaps given to another
        return None
    fresh = conn.execute(
        select(charges.c.job_id, func.count())
        .where(charges.c.dataset == dataset, charges.c.id > composed.last_charge)
        .group_by(charges.c.job_id)
    ).all()
    if composed.charges + sum(int(n) for _, n in fresh) != count:
        return None
    running = {job_id for job_id, (end, _) in composed.times.items() if end is None}
    return {job_id for job_id, _ in fresh} | running


def _finite(cost: PrivacyCost) -> bool:
    return all(math.isfinite(v) for v in cost.values)


def warm(engine: Engine, budgeted: list[tuple[str, float]]) -> None:
    """Compose the curve of each (dataset, delta) whose ledger changed since it was last composed."""
    for dataset, delta in budgeted:
        spend_curve(engine, dataset, delta)
