"""What each key has spent on a dataset: its own releases there composed by the configured accountant,
exactly as the dataset's ledger composes all of them (additive costs of the stored events, priced once
per event; docs/design.md section 3), at the dataset's delta. Never a sum of per-job epsilons."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Engine, func, select

from control.budgets.job_costs import id_chunks, job_costs_within
from control.caching import BoundedCache
from control.store.keys import key_names
from control.store.models import jobs, key_quotas
from privacy_wall.accounting.accountants import PrivacyCost, configured_accountant, sum_costs
from privacy_wall.accounting.events import event_from_dict
from privacy_wall.ledger import database as ledger_db
from privacy_wall.ledger.schema import reservations
from privacy_wall.sqlengine import reading


@dataclass(frozen=True)
class KeySpend:
    """One key's share of a dataset's ledger (epsilons composed at the dataset's delta)."""

    key_id: str
    key_name: str | None
    jobs: int  # jobs the key submitted on the dataset, in any state
    iterations_charged: int  # distinct charged iterations over those jobs
    epsilon_spent: float  # the key's committed releases composed (inf: unbounded)
    epsilon_reserved: float  # committed plus the uncommitted rest of its open reservations, composed
    quota: float | None  # the key's cap on this dataset (control.budgets.quotas); None: only the dataset's


def key_cost(conn: Connection, dataset: str, key_id: str) -> PrivacyCost:
    """The composed cost of the key's releases on the dataset: its jobs' charges plus the uncommitted
    rest of their open reservations (what a quota is checked against), read on the caller's connection."""
    ids = list(
        conn.execute(select(jobs.c.id).where(jobs.c.dataset == dataset, jobs.c.owner == key_id)).scalars()
    )
    charged, rest = _charged_and_rest(conn, ids)
    return sum_costs([*charged.values(), *rest.values()], configured_accountant().name)


@dataclass(frozen=True)
class _KeyTotal:
    """One key's jobs on a dataset, summed: how many, their distinct charged iterations, and the cost of
    their charges and of their charges plus the rest of their open reservations."""

    jobs: int
    iterations: int
    spent: PrivacyCost
    reserved: PrivacyCost


#: Per dataset state (_spend_state): the keys' totals in order of their first job, summed once for every
#: reader of that state (a dashboard page or GET .../ledger/keys with 10,000 jobs reads them in a few ms).
_totals: BoundedCache[dict[str, _KeyTotal]] = BoundedCache()


def clear_totals() -> None:
    """Forget every key's cached totals (benchmarks measure the first request with this)."""
    _totals.clear()


def _spend_state(conn: Connection, dataset: str) -> tuple[Any, ...]:
    """What the keys' totals depend on: the dataset's charges (each commit and withdrawal), its
    reservations (each admission and each refund closes one) and its jobs, and the accountant."""
    charged = ledger_db.ledger_charges(conn, dataset)
    reserved = conn.execute(
        select(func.count(), func.count().filter(reservations.c.open.is_(True))).where(
            reservations.c.dataset == dataset
        )
    ).one()
    submitted = conn.execute(select(func.count()).where(jobs.c.dataset == dataset)).scalar_one()
    return (str(conn.engine.url), dataset, *charged, *reserved, submitted, configured_accountant().version)


def key_spend(engine: Engine, dataset: str, delta: float, key_id: str | None = None) -> list[KeySpend]:
    """Per key with a job or a quota on the dataset (only `key_id`'s row when given, also without either),
    in order of its first job, then the keys with a quota only."""
    with reading(engine) as conn:
        state = _spend_state(conn, dataset)
        quota_query = select(key_quotas.c.key_id, key_quotas.c.epsilon).where(key_quotas.c.dataset == dataset)
        if key_id is not None:
            quota_query = quota_query.where(key_quotas.c.key_id == key_id)
        quotas = {row.key_id: float(row.epsilon) for row in conn.execute(quota_query)}
    totals = _totals.get_or_compute(state, lambda: _key_totals(engine, dataset))
    keys = [key_id] if key_id is not None else [*totals, *(k for k in quotas if k not in totals)]
    names = key_names(engine, keys)
    zero = PrivacyCost.zero(configured_accountant().name)
    rows = []
    for key in keys:
        total = totals.get(key, _KeyTotal(0, 0, zero, zero))
        rows.append(
            KeySpend(
                key_id=key,
                key_name=names.get(key),
                jobs=total.jobs,
                iterations_charged=total.iterations,
                epsilon_spent=total.spent.epsilon(delta),
                epsilon_reserved=total.reserved.epsilon(delta),
                quota=quotas.get(key),
            )
        )
    return rows


def _key_totals(engine: Engine, dataset: str) -> dict[str, _KeyTotal]:
    with reading(engine) as conn:
        query = select(jobs.c.id, jobs.c.owner).where(jobs.c.dataset == dataset).order_by(jobs.c.created_at)
        owners = {row.id: row.owner for row in conn.execute(query)}
        charged, rest = _charged_and_rest(conn, list(owners))
    iterations = {c["job_id"]: c["iterations"] for c in ledger_db.charges_per_job(engine, dataset)}
    by_key: dict[str, list[str]] = defaultdict(list)
    for job_id, owner in owners.items():
        by_key[owner].append(job_id)
    name = configured_accountant().name
    totals = {}
    for key, ids in by_key.items():
        spent = sum_costs([charged[j] for j in ids], name)
        totals[key] = _KeyTotal(
            jobs=len(ids),
            iterations=sum(iterations.get(j, 0) for j in ids),
            spent=spent,
            reserved=spent + sum_costs([rest[j] for j in ids if j in rest], name),
        )
    return totals


def _charged_and_rest(
    conn: Connection, ids: list[str]
) -> tuple[dict[str, PrivacyCost], dict[str, PrivacyCost]]:
    """Per job: the cost of its charges (control.budgets.job_costs) and of the uncommitted rest of its open
    reservation (jobs without an open one are left out of the second), as the dataset's ledger prices them."""
    accountant = configured_accountant()
    rest: dict[str, PrivacyCost] = {}
    for chunk in id_chunks(ids):
        rows = conn.execute(
            select(
                reservations.c.job_id,
                reservations.c.event,
                reservations.c.iterations,
                reservations.c.committed,
            ).where(
                reservations.c.job_id.in_(chunk),
                reservations.c.open.is_(True),
                reservations.c.committed < reservations.c.iterations,
            )
        )
        for job_id, event, total, committed in rows:
            rest[job_id] = accountant.cost(event_from_dict(event)).scaled(total - committed)
    return job_costs_within(conn, ids), rest
