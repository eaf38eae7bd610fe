"""Per-key quotas: a custodian's cap on what one key may spend on one dataset (epsilon at the dataset's
delta), kept in key_quotas and checked under the dataset's budget lock at admission
(service.routes.submission) and for every charge beyond its job's reservation (check_charge_quota, which the
worker's ledger runs).

A quota bounds the composition of the key's own releases on the dataset (control.budgets.key_spend.key_cost:
its charges plus its open reservations), composed as the dataset's ledger composes all of them. It is an
allowance inside the dataset's budget, not a privacy guarantee of its own: the dataset's budget is that.
A key without a quota is bounded by the dataset's budget alone."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import Connection, Engine, delete, insert, select, update
from sqlalchemy.exc import IntegrityError

from control.budgets.key_spend import key_cost
from control.store.models import jobs, key_quotas
from privacy_wall.accounting.accountants import PrivacyCost, configured_accountant
from privacy_wall.accounting.events import SubsampledGaussianEvent
from privacy_wall.ledger.base import BudgetExceeded, Charge
from privacy_wall.ledger.refusals import headroom_epsilon
from privacy_wall.sqlengine import reading


class QuotaExceeded(BudgetExceeded):
    """The key's own releases on the dataset with the job would exceed the key's quota there."""


@dataclass(frozen=True)
class QuotaQuote:
    """A job against the submitting key's quota (epsilons composed at the dataset's delta)."""

    quota: float
    epsilon_reserved: float  # the key's charges and open reservations on the dataset now
    epsilon_after: float  # with the job
    largest_epsilon: float | None  # the largest job epsilon of this schedule within the quota

    @property
    def admissible(self) -> bool:
        return self.epsilon_after <= self.quota  # NaN: not admissible

    @property
    def remaining(self) -> float:
        return max(self.quota - self.epsilon_reserved, 0.0)


def quota_of(conn: Connection, dataset: str, key_id: str) -> float | None:
    """The key's quota on the dataset; None without one."""
    found = conn.execute(
        select(key_quotas.c.epsilon).where(key_quotas.c.dataset == dataset, key_quotas.c.key_id == key_id)
    ).scalar_one_or_none()
    return None if found is None else float(found)


def quotas(engine: Engine, dataset: str) -> dict[str, float]:
    """Every quota on the dataset, by key id."""
    with reading(engine) as conn:
        rows = conn.execute(
            select(key_quotas.c.key_id, key_quotas.c.epsilon).where(key_quotas.c.dataset == dataset)
        )
        return {row.key_id: float(row.epsilon) for row in rows}


def set_quota(engine: Engine, dataset: str, key_id: str, epsilon: float) -> None:
    """Create or change the key's quota on the dataset (epsilon > 0 and finite)."""
    if not (epsilon > 0 and math.isfinite(epsilon)):
        raise ValueError("a quota's epsilon must be > 0 and finite")
    now = datetime.now(UTC)
    where = (key_quotas.c.dataset == dataset, key_quotas.c.key_id == key_id)
    try:
        with engine.begin() as conn:
            if conn.execute(
                update(key_quotas).where(*where).values(epsilon=epsilon, updated_at=now)
            ).rowcount:
                return
            conn.execute(
                insert(key_quotas).values(dataset=dataset, key_id=key_id, epsilon=epsilon, updated_at=now)
            )
    except IntegrityError:  # a concurrent first setting inserted it: this one changes it
        with engine.begin() as conn:
            conn.execute(update(key_quotas).where(*where).values(epsilon=epsilon, updated_at=now))


def clear_quota(engine: Engine, dataset: str, key_id: str) -> bool:
    """Remove the key's quota on the dataset; returns whether it had one."""
    with engine.begin() as conn:
        removed = conn.execute(
            delete(key_quotas).where(key_quotas.c.dataset == dataset, key_quotas.c.key_id == key_id)
        ).rowcount
    return bool(removed)


def check_quota(
    conn: Connection,
    dataset: str,
    key_id: str,
    job: PrivacyCost,
    delta: float,
    what: str = "this job",
) -> None:
    """Raise QuotaExceeded unless the key's releases on the dataset composed with `job` (`what` the
    refusal calls it) fit its quota.

    Call it in the admission's transaction after the dataset's budget row is locked (ledger_db's
    reserve_within locks it) and before the job's row is written: every admission and charge on the
    dataset waits for that lock, so concurrent submissions by one key are checked one after another."""
    quota = quota_of(conn, dataset, key_id)
    if quota is None:
        return
    base = key_cost(conn, dataset, key_id)
    now, after = base.epsilon(delta), (base + job).epsilon(delta)
    if not after <= quota:
        raise QuotaExceeded(
            f"key {key_id}'s quota on dataset {dataset}: epsilon {now:.4g} of its quota {quota:.4g} is "
            f"spent or reserved by its jobs (delta {delta:g}); {what} would bring it to {after:.4g}",
            spent=now,
            requested=after,
            budget=quota,
        )


def check_charge_quota(conn: Connection, charge: Charge, cost: PrivacyCost, delta: float) -> None:
    """The ledger_db.ChargeCheck of the worker's ledger: a charge its job's reservation does not cover (a
    retried attempt once the reservation is used up, a charge after the job's refund) must fit the quota
    of the key that submitted the job, as the job did at admission. commit_charge runs it in the charge's
    transaction under the dataset's budget lock, so concurrent charges of one key's jobs are checked one
    after another. A charge of no job of the service has no key, hence no quota."""
    owner = conn.execute(select(jobs.c.owner).where(jobs.c.id == charge.job_id)).scalar_one_or_none()
    if owner is None:
        return
    what = f"charge {charge.iteration} (attempt {charge.attempt}) of job {charge.job_id}"
    check_quota(conn, charge.dataset, owner, cost, delta, what)


def quota_quote(
    engine: Engine, dataset: str, key_id: str, event: SubsampledGaussianEvent, iterations: int, delta: float
) -> QuotaQuote | None:
    """The job of `iterations` releases of `event` against the key's quota; None without a quota."""
    with reading(engine) as conn:
        quota = quota_of(conn, dataset, key_id)
        if quota is None:
            return None
        base = key_cost(conn, dataset, key_id)
    after = (base + configured_accountant().cost(event).scaled(iterations)).epsilon(delta)
    largest = headroom_epsilon(base, quota, delta, event.sample_size, event.population, iterations)
    return QuotaQuote(quota, base.epsilon(delta), after, largest)


def tighter(dataset_largest: float | None, dataset_capped: bool, quota: QuotaQuote | None) -> float | None:
    """The largest job epsilon that fits both the dataset's budget and the key's quota (epsilon falls as
    sigma grows, so that is the smaller of the two); None when either cap leaves no job or neither exists."""
    limits = [dataset_largest] if dataset_capped else []
    if quota is not None:
        limits.append(quota.largest_epsilon)
    if not limits or any(value is None for value in limits):
        return None
    return min(value for value in limits if value is not None)
