"""What each job has spent so far, priced from its committed charges by the configured accountant."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable

from sqlalchemy import Connection, Engine, func, select

from privacy_wall.accounting.accountants import PrivacyCost, configured_accountant
from privacy_wall.accounting.events import event_from_dict
from privacy_wall.ledger.schema import charges, reservations
from privacy_wall.sqlengine import reading


def epsilon_spent(engine: Engine, deltas: dict[str, float]) -> dict[str, float]:
    """Epsilon of the charges each job has committed so far, on their own, at the job's delta."""
    costs = job_costs(engine, list(deltas))
    return {job_id: costs[job_id].epsilon(delta) for job_id, delta in deltas.items()}


def job_costs(engine: Engine, ids: list[str]) -> dict[str, PrivacyCost]:
    """The additive privacy cost of the charges each job has committed so far (compose by adding).

    Priced from the stored events by the configured accountant. A job whose every charge was covered by
    its reservation (the count of its charges equals the reservation's committed count) has spent
    exactly committed x the reserved per-iteration event: one row read. Otherwise (a retried attempt
    beyond the reservation, a job without one) its charges' events are counted and priced once each.
    """
    with reading(engine) as conn:
        return job_costs_within(conn, ids)


def job_costs_within(conn: Connection, ids: list[str]) -> dict[str, PrivacyCost]:
    """`job_costs` read on the caller's connection (inside its transaction, e.g. under the budget lock)."""
    accountant = configured_accountant()
    totals: dict[str, PrivacyCost] = {}
    charge_count = select(func.count()).where(charges.c.job_id == reservations.c.job_id).scalar_subquery()
    for chunk in id_chunks(ids):
        rows = conn.execute(
            select(
                reservations.c.job_id,
                reservations.c.event,
                reservations.c.committed,
                charge_count.label("charges"),
            ).where(reservations.c.job_id.in_(chunk))
        )
        for job_id, event, committed, count in rows:
            if committed == count:
                totals[job_id] = accountant.cost(event_from_dict(event)).scaled(committed)
    rest = [job_id for job_id in ids if job_id not in totals]
    counts: dict[str, Counter[str]] = {job_id: Counter() for job_id in rest}
    for chunk in id_chunks(rest):
        stored = conn.execute(select(charges.c.job_id, charges.c.event).where(charges.c.job_id.in_(chunk)))
        for job_id, event in stored:
            counts[job_id][json.dumps(event, sort_keys=True)] += 1
    for job_id, counter in counts.items():
        total = accountant.zero()
        for key, n in counter.items():
            total = total + accountant.cost(event_from_dict(json.loads(key))).scaled(n)
        totals[job_id] = total
    return totals


def id_chunks(ids: list[str], size: int = 500) -> Iterable[list[str]]:
    """Ids in chunks small enough for one IN (...) on every backend."""
    for start in range(0, len(ids), size):
        yield ids[start : start + size]
