"""The budget ledger in the control database (docs/design.md section 3), over the tables of ledger/schema.py.

Every admission-changing operation runs in one transaction that first locks the dataset's budget row
(SELECT ... FOR UPDATE in PostgreSQL; BEGIN IMMEDIATE in SQLite, see sqlengine), so concurrent
submissions and commits on one dataset are serialised and can never jointly overspend. A charge beyond
its job's reservation is admitted under that lock by the dataset's budget and by the caller's ChargeCheck
(the service's worker passes the submitting key's quota), so neither is overspent by concurrent charges.

Costs are stored as the configured accountant's additive vectors (privacy_wall.accounting.accountants): the
budget row holds the committed sum, each reservation its per-iteration cost, and `budgets.accountant` the
version that priced them. A row priced by another version is re-priced from the stored events (charges
and reservations) the first time a write locks it, and the change is recorded in accountant_changes;
reads in between price the events on the fly. Each charge row keeps the cost its accountant gave it.
"""

from __future__ import annotations

import hashlib
import json
import math
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    Connection,
    Engine,
    Executable,
    Text,
    and_,
    bindparam,
    delete,
    func,
    insert,
    select,
    update,
)
from sqlalchemy import cast as sa_cast
from sqlalchemy.exc import IntegrityError

from privacy_wall.accounting.accountants import (
    ACCOUNTANTS,
    FORMER_FILTERS,
    ORDERS,
    Accountant,
    PrivacyCost,
    configured_accountant,
)
from privacy_wall.accounting.events import SubsampledGaussianEvent, event_from_dict, event_to_dict
from privacy_wall.ledger.base import BudgetExceeded, Charge, DuplicateCharge, budget_exceeded
from privacy_wall.ledger.delta_policy import check_budget_delta
from privacy_wall.ledger.refusals import headroom_epsilon
from privacy_wall.ledger.schema import accountant_changes, budgets, charges, reservations
from privacy_wall.sqlengine import Bind, reading, run_writes, transaction


class UnknownDataset(LookupError):
    """No budget row exists for the dataset."""


#: What a charge its job's reservation does not cover must fit besides the dataset's budget (the
#: service's worker passes the submitting key's quota, control.budgets.quotas.check_charge_quota).
#: commit_charge calls it in the charge's transaction, under the dataset's budget lock and once the budget has
#: admitted the charge, with the charge, its cost and the dataset's delta; it raises BudgetExceeded to refuse
#: the charge, and nothing is written.
ChargeCheck = Callable[[Connection, Charge, PrivacyCost, float], None]


@dataclass(frozen=True)
class BudgetStatus:
    """A dataset's budget as the custodian sees it (epsilons at the dataset's delta)."""

    dataset: str
    epsilon_budget: float | None
    delta: float
    epsilon_spent: float
    epsilon_reserved: float  # spent + open reservations

    @property
    def epsilon_remaining(self) -> float | None:
        if self.epsilon_budget is None:
            return None
        return max(self.epsilon_budget - self.epsilon_reserved, 0.0)


@dataclass(frozen=True)
class Quote:
    """What a job would cost and what would remain, without reserving anything."""

    status: BudgetStatus
    job_epsilon: float  # the job on its own
    epsilon_after: float  # spent + reserved + this job
    admissible: bool
    largest_epsilon: float | None  # the largest job epsilon of this schedule that would fit (see below)


def _now() -> datetime:
    return datetime.now(UTC)


def _curve(stored: Any, accountant: Accountant | None = None) -> PrivacyCost:
    return PrivacyCost.from_json(stored, (accountant or configured_accountant()).name)


def _event_cost(payload: dict[str, Any], accountant: Accountant) -> PrivacyCost:
    return accountant.cost(event_from_dict(payload))


def _json_curve(curve: PrivacyCost) -> dict[str, Any]:
    return curve.to_json()


def _lock_budget(conn: Connection, dataset: str) -> Any:
    """Lock the dataset's budget row, re-priced by the configured accountant if another priced it."""
    row = conn.execute(select(budgets).where(budgets.c.dataset == dataset).with_for_update()).one_or_none()
    if row is None:
        raise UnknownDataset(f"dataset {dataset!r} has no budget")
    return reprice(conn, row)


def _current(row: Any) -> bool:
    """Whether the budget row was priced by the configured accountant on today's grid of orders."""
    return bool(row.accountant == configured_accountant().version and _same_orders(row.orders))


def _same_orders(stored: Any) -> bool:
    return (
        isinstance(stored, list)
        and len(stored) == len(ORDERS)
        and all(float(a) == float(b) for a, b in zip(stored, ORDERS, strict=True))
    )


#: Parsed per-iteration costs of reservations, by the digest of the stored JSON text and the accountant
#: that parses it: a stored curve is read as text (no JSON parsing) and parsed only when its text is new to
#: this process, so an entry can never be stale (a re-priced curve has another text) and the jobs of one
#: schedule share one entry. Admission had parsed every open reservation's JSON on each submission, under
#: the budget's lock: quadratic in the queue under contention (issue 52 item 5).
_RESERVATION_COSTS: dict[tuple[bytes, str], PrivacyCost] = {}
RESERVATION_COSTS_KEPT = 4_096
_RESERVATION_COSTS_LOCK = threading.Lock()


def _cost_of_stored(text: str, accountant: Accountant) -> PrivacyCost:
    """The PrivacyCost a reservation's stored curve (its JSON text) holds, parsed once per distinct text."""
    key = (hashlib.blake2b(text.encode(), digest_size=16).digest(), accountant.name)
    with _RESERVATION_COSTS_LOCK:
        cost = _RESERVATION_COSTS.get(key)
    if cost is None:
        cost = _curve(json.loads(text), accountant)
        with _RESERVATION_COSTS_LOCK:
            if len(_RESERVATION_COSTS) >= RESERVATION_COSTS_KEPT:
                _RESERVATION_COSTS.clear()
            _RESERVATION_COSTS[key] = cost
    return cost


def _reserved_curve(conn: Connection, row: Any) -> PrivacyCost:
    """The open reservations' uncommitted cost, by the configured accountant."""
    accountant = configured_accountant()
    total = accountant.zero()
    current = _current(row)
    stored = sa_cast(reservations.c.per_iteration_curve, Text) if current else reservations.c.event
    rows = conn.execute(
        select(stored, reservations.c.iterations, reservations.c.committed)
        .where(
            reservations.c.dataset == row.dataset,
            reservations.c.open.is_(True),
            reservations.c.committed < reservations.c.iterations,  # fully committed: nothing left to add
        )
        .order_by(reservations.c.created_at, reservations.c.job_id)  # one order: composed prefixes are cached
    )
    for value, iterations, committed in rows:
        # priced by another accountant (the next write re-prices the row): from the event
        per_iteration = _cost_of_stored(value, accountant) if current else _event_cost(value, accountant)
        total = total + per_iteration.scaled(iterations - committed)
    return total


def _committed_from_events(conn: Connection, dataset: str, accountant: Accountant) -> PrivacyCost:
    """The committed cost recomputed from the dataset's charges, identical events counted once."""
    counts: Counter[str] = Counter()  # in order of first charge, as the running sum adds them
    query = select(charges.c.event).where(charges.c.dataset == dataset).order_by(charges.c.id)
    for (event,) in conn.execute(query):
        counts[json.dumps(event, sort_keys=True)] += 1
    total = accountant.zero()
    for key, n in counts.items():
        total = total + _event_cost(json.loads(key), accountant).scaled(n)
    return total


def _committed_curve(conn: Connection, row: Any) -> PrivacyCost:
    if _current(row):
        return _curve(row.committed_curve)
    return _committed_from_events(conn, row.dataset, configured_accountant())


def _old_epsilon(row: Any) -> float:
    """The spend as the row's own accountant priced it (an unknown or pre-0002 accountant: the paper's
    classic conversion of the stored RDP curve, which is what ledgers before migration 0002 used); inf
    when the stored cost is on another grid of orders."""
    stored = row.committed_curve
    former = FORMER_FILTERS.get(row.accountant)
    if former is not None:  # the same stored form, priced at the delta split of its time
        try:
            cost = PrivacyCost.from_json(stored, former.name)
            return former.epsilon(cost, row.delta) if any(cost.values) else 0.0
        except ValueError:
            return math.inf
    if row.accountant == _PLD_BEFORE_0006:  # S = N alone: the exact Gaussian; anything subsampled: RDP
        name = "rdp" if len(stored) == len(ORDERS) + 2 and stored[-1] else "pld"
    else:
        name = next((a.name for a in ACCOUNTANTS.values() if a.version == row.accountant), "paper")
        if isinstance(stored, list) and len(stored) == len(ORDERS):
            stored = [*stored, 0.0, 1.0 if any(stored) else 0.0]  # an RDP curve alone: priced as RDP
    try:
        return PrivacyCost.from_json(stored, name).epsilon(row.delta)
    except ValueError:
        return math.inf


#: The `pld` accountant before migration 0006 (the RDP curve as soon as anything was subsampled).
_PLD_BEFORE_0006 = "pld/gdp-full-batch/rdp-wbk19-thm27-v2/balle20/grid-v1"


def reprice(conn: Connection, row: Any, accountant: Accountant | None = None) -> Any:
    """Re-price a locked budget row's committed and reserved costs from their events; record the change.

    Returns the updated row. Used by migration 0002 and whenever a write finds a row priced by another
    accountant version than the configured one.
    """
    accountant = accountant or configured_accountant()
    if row.accountant == accountant.version and _same_orders(row.orders):
        return row
    committed = _committed_from_events(conn, row.dataset, accountant)
    for job_id, event in conn.execute(
        select(reservations.c.job_id, reservations.c.event).where(reservations.c.dataset == row.dataset)
    ):
        conn.execute(
            update(reservations)
            .where(reservations.c.job_id == job_id)
            .values(per_iteration_curve=_json_curve(_event_cost(event, accountant)))
        )
    conn.execute(
        update(budgets)
        .where(budgets.c.dataset == row.dataset)
        .values(
            committed_curve=_json_curve(committed),
            orders=[float(a) for a in ORDERS],
            accountant=accountant.version,
            updated_at=_now(),
        )
    )
    before, after = _old_epsilon(row), committed.epsilon(row.delta)
    conn.execute(
        insert(accountant_changes).values(
            dataset=row.dataset,
            old_accountant=row.accountant,
            new_accountant=accountant.version,
            epsilon_spent_before=before if math.isfinite(before) else None,
            epsilon_spent_after=after if math.isfinite(after) else None,
            changed_at=_now(),
        )
    )
    return conn.execute(select(budgets).where(budgets.c.dataset == row.dataset)).one()


def reprice_all(conn: Connection) -> None:
    """Re-price every ledger by the configured accountant (`reprice`): the migrations that change it."""
    for row in conn.execute(select(budgets)).all():
        reprice(conn, row)


def _status(conn: Connection, row: Any) -> BudgetStatus:
    return _status_of(row, _committed_curve(conn, row), _reserved_curve(conn, row))


def _status_of(row: Any, committed: PrivacyCost, reserved: PrivacyCost) -> BudgetStatus:
    return BudgetStatus(
        dataset=row.dataset,
        epsilon_budget=row.epsilon,
        delta=row.delta,
        epsilon_spent=committed.epsilon(row.delta),
        epsilon_reserved=(committed + reserved).epsilon(row.delta),
    )


def _check(row: Any, conn: Connection, extra: PrivacyCost) -> tuple[BudgetStatus, float]:
    committed, reserved = _committed_curve(conn, row), _reserved_curve(conn, row)
    return _status_of(row, committed, reserved), (committed + reserved + extra).epsilon(row.delta)


def _refuse(status: BudgetStatus, after: float) -> BudgetExceeded:
    assert status.epsilon_budget is not None
    return budget_exceeded(
        f"dataset {status.dataset}", status.epsilon_reserved, status.epsilon_budget, status.delta, after
    )


def set_budget(engine: Engine, dataset: str, epsilon: float | None, delta: float) -> BudgetStatus:
    """Create or change a dataset's cap. Delta cannot change once anything was charged, and must be below
    1/N of a catalogued private dataset (DeltaTooLarge otherwise)."""
    if epsilon is not None and not epsilon > 0:
        raise ValueError("epsilon budget must be > 0")
    if not 0 < delta < 1:
        raise ValueError("delta must be in (0, 1)")
    with engine.begin() as conn:
        row = conn.execute(
            select(budgets).where(budgets.c.dataset == dataset).with_for_update()
        ).one_or_none()
        check_budget_delta(conn, dataset, delta)  # below 1/N (privacy_wall.ledger.delta_policy)
        if row is None:
            conn.execute(
                insert(budgets).values(
                    dataset=dataset,
                    epsilon=epsilon,
                    delta=delta,
                    committed_curve=_json_curve(PrivacyCost.zero()),
                    orders=[float(a) for a in ORDERS],
                    accountant=configured_accountant().version,
                    updated_at=_now(),
                )
            )
        else:
            row = reprice(conn, row)
            if delta != row.delta and _curve(row.committed_curve) != PrivacyCost.zero():
                raise ValueError("delta cannot change after releases were charged against it")
            conn.execute(
                update(budgets)
                .where(budgets.c.dataset == dataset)
                .values(epsilon=epsilon, delta=delta, updated_at=_now())
            )
        return _status(conn, _lock_budget(conn, dataset))


def budget_delta(engine: Engine, dataset: str) -> float | None:
    """The dataset's delta, None without a budget: what admission needs before pricing, read without
    pricing the spend."""
    with reading(engine) as conn:
        delta = conn.execute(select(budgets.c.delta).where(budgets.c.dataset == dataset)).scalar_one_or_none()
    return None if delta is None else float(delta)


def budget_status(engine: Engine, dataset: str) -> BudgetStatus:
    with reading(engine) as conn:
        row = conn.execute(select(budgets).where(budgets.c.dataset == dataset)).one_or_none()
        if row is None:
            raise UnknownDataset(f"dataset {dataset!r} has no budget")
        return _status(conn, row)


def quote(engine: Engine, dataset: str, event: SubsampledGaussianEvent, iterations: int) -> Quote:
    """The cost of a job of `iterations` releases of `event`, and what would remain; reserves nothing."""
    job_curve = configured_accountant().cost(event).scaled(iterations)
    with reading(engine) as conn:
        row = _budget_row(conn, dataset)
        committed, reserved = _committed_curve(conn, row), _reserved_curve(conn, row)
    status = _status_of(row, committed, reserved)
    base = committed + reserved
    after = (base + job_curve).epsilon(status.delta)
    admissible = status.epsilon_budget is None or after <= status.epsilon_budget  # NaN: not admissible
    largest = _largest_epsilon(base, status, event.sample_size, event.population, iterations)
    return Quote(status, job_curve.epsilon(status.delta), after, admissible, largest)


def _budget_row(conn: Connection, dataset: str) -> Any:
    row = conn.execute(select(budgets).where(budgets.c.dataset == dataset)).one_or_none()
    if row is None:
        raise UnknownDataset(f"dataset {dataset!r} has no budget")
    return row


def _largest_epsilon(
    base: PrivacyCost, status: BudgetStatus, sample_size: int, population: int, iterations: int
) -> float | None:
    return headroom_epsilon(base, status.epsilon_budget, status.delta, sample_size, population, iterations)


def largest_epsilon(
    engine: Engine, dataset: str, sample_size: int, population: int, iterations: int
) -> float | None:
    """The budget's remaining headroom priced exactly for one schedule (S of N records, T iterations):
    the job epsilon (on its own, at the dataset's delta) of the smallest noise multiplier whose job,
    composed with everything spent and reserved now, stays within the cap. A job asking for this epsilon
    is admitted (as long as nothing else is reserved first); None without a cap or when no job fits."""
    with reading(engine) as conn:
        row = _budget_row(conn, dataset)
        status = _status(conn, row)
        base = _committed_curve(conn, row) + _reserved_curve(conn, row)
    return _largest_epsilon(base, status, sample_size, population, iterations)


def reserve(
    engine: Engine, dataset: str, job_id: str, event: SubsampledGaussianEvent, iterations: int
) -> BudgetStatus:
    """Admit a job by reserving its whole curve atomically, or raise BudgetExceeded reserving nothing."""
    per_iteration = _reservation_cost(event, iterations)
    with engine.begin() as conn:
        return _reserve(conn, dataset, job_id, event, iterations, per_iteration)


def reserve_within(
    conn: Connection, dataset: str, job_id: str, event: SubsampledGaussianEvent, iterations: int
) -> BudgetStatus:
    """`reserve` inside the caller's transaction, so what the caller writes with it (the job's row) commits
    together with the reservation or not at all. On BudgetExceeded nothing was written: roll back."""
    return _reserve(conn, dataset, job_id, event, iterations, _reservation_cost(event, iterations))


def _reservation_cost(event: SubsampledGaussianEvent, iterations: int) -> PrivacyCost:
    """One iteration's cost (priced before the budget is locked)."""
    if isinstance(iterations, bool) or not isinstance(iterations, int) or iterations < 1:
        raise ValueError("iterations must be an integer >= 1")
    return configured_accountant().cost(event)


def _reserve(
    conn: Connection,
    dataset: str,
    job_id: str,
    event: SubsampledGaussianEvent,
    iterations: int,
    per_iteration: PrivacyCost,
) -> BudgetStatus:
    row = _lock_budget(conn, dataset)
    # Priced once under the lock: the spend with everything reserved and this job (the status before it
    # only for a refusal's message); its reservation then adds exactly this job's curve.
    committed, reserved = _committed_curve(conn, row), _reserved_curve(conn, row)
    after = (committed + reserved + per_iteration.scaled(iterations)).epsilon(row.delta)
    if row.epsilon is not None and not after <= row.epsilon:
        raise _refuse(_status_of(row, committed, reserved), after)
    conn.execute(
        insert(reservations).values(
            job_id=job_id,
            dataset=dataset,
            event=event_to_dict(event),
            per_iteration_curve=_json_curve(per_iteration),
            iterations=iterations,
            committed=0,
            open=True,
            created_at=_now(),
        )
    )
    return BudgetStatus(
        dataset=row.dataset,
        epsilon_budget=row.epsilon,
        delta=row.delta,
        epsilon_spent=committed.epsilon(row.delta),
        epsilon_reserved=after,
    )


def refund(engine: Engine, job_id: str) -> int:
    """Close a job's reservation: its uncommitted iterations stop counting. Returns how many were refunded."""
    with engine.begin() as conn:
        return close_reservation(conn, job_id)


def close_reservation(conn: Connection, job_id: str) -> int:
    """`refund` inside the caller's transaction (so a job's end and its refund commit together)."""
    found = conn.execute(
        select(reservations.c.dataset, reservations.c.open).where(reservations.c.job_id == job_id)
    ).one_or_none()
    if found is None or not found.open:
        return 0
    _lock_budget(conn, found.dataset)  # then read again: a charge committed meanwhile is not refunded
    res = conn.execute(select(reservations).where(reservations.c.job_id == job_id)).one()
    if not res.open:
        return 0
    conn.execute(update(reservations).where(reservations.c.job_id == job_id).values(open=False))
    return int(res.iterations - res.committed)


# commit_charge runs once per iteration of every job: its statements are built once, with bound parameters.
_LOCK_WITH_RESERVATION = (
    select(
        budgets,
        reservations.c.open,
        reservations.c.committed,
        reservations.c.iterations,
        reservations.c.per_iteration_curve,
    )
    .select_from(
        budgets.outerjoin(
            reservations,
            and_(reservations.c.job_id == bindparam("p_job_id"), reservations.c.dataset == budgets.c.dataset),
        )
    )
    .where(budgets.c.dataset == bindparam("p_dataset"))
    .with_for_update(of=budgets)
)
_COMMIT_FROM_RESERVATION = (
    update(reservations)
    .where(reservations.c.job_id == bindparam("p_job_id"))
    .values(committed=reservations.c.committed + 1)
)
_INSERT_CHARGE = insert(charges).values(
    dataset=bindparam("p_dataset"),
    job_id=bindparam("p_job_id"),
    iteration=bindparam("p_iteration"),
    attempt=bindparam("p_attempt"),
    event=bindparam("p_event", type_=charges.c.event.type),
    curve=bindparam("p_curve", type_=charges.c.curve.type),
    accountant=bindparam("p_accountant"),
    created_at=bindparam("p_created_at", type_=charges.c.created_at.type),
)
_ADD_TO_BUDGET = (
    update(budgets)
    .where(budgets.c.dataset == bindparam("p_dataset"))
    .values(
        committed_curve=bindparam("p_committed_curve", type_=budgets.c.committed_curve.type),
        updated_at=bindparam("p_updated_at", type_=budgets.c.updated_at.type),
    )
)


def commit_charge(bind: Bind, charge: Charge, check: ChargeCheck | None = None) -> None:
    """Write one iteration's charge: from the job's reservation if it covers it, else admitted on its own
    by the dataset's budget and `check` (a retried attempt once the reservation is used up, a charge after
    the job's refund). Raises BudgetExceeded (or `check`'s refusal) or DuplicateCharge writing nothing."""
    accountant = configured_accountant()
    curve = accountant.cost(charge.event)
    try:
        with transaction(bind) as conn:
            # One round trip: lock the budget row and read the job's reservation beside it.
            row = conn.execute(
                _LOCK_WITH_RESERVATION, {"p_job_id": charge.job_id, "p_dataset": charge.dataset}
            ).one_or_none()
            if row is None:
                raise UnknownDataset(f"dataset {charge.dataset!r} has no budget")
            if not _current(row):  # another accountant priced this ledger: re-price, then read again
                reprice(conn, row)
                row = conn.execute(
                    _LOCK_WITH_RESERVATION, {"p_job_id": charge.job_id, "p_dataset": charge.dataset}
                ).one()
            covered = (
                row.open is not None
                and bool(row.open)
                and row.committed < row.iterations
                and _curve(row.per_iteration_curve) == curve
            )
            writes: list[Executable] = []
            if covered:
                writes.append(_COMMIT_FROM_RESERVATION)
            else:
                status, after = _check(row, conn, curve)
                if status.epsilon_budget is not None and not after <= status.epsilon_budget:
                    raise _refuse(status, after)
                if check is not None:
                    check(conn, charge, curve, row.delta)
            now = _now()
            params = {
                "p_dataset": charge.dataset,
                "p_job_id": charge.job_id,
                "p_iteration": charge.iteration,
                "p_attempt": charge.attempt,
                "p_event": event_to_dict(charge.event),
                "p_curve": _json_curve(curve),
                "p_accountant": accountant.version,
                "p_created_at": now,
                "p_committed_curve": _json_curve(_curve(row.committed_curve) + curve),
                "p_updated_at": now,
            }
            run_writes(conn, *writes, _INSERT_CHARGE, _ADD_TO_BUDGET, parameters=params)
    except IntegrityError as exc:
        raise DuplicateCharge(
            f"iteration {charge.iteration} (attempt {charge.attempt}) of job {charge.job_id} "
            "is already charged"
        ) from exc


def withdraw_charge(bind: Bind, charge: Charge) -> bool:
    """Remove one charge whose release never left the wall (Ledger.withdraw); returns whether it was there.

    The job's reservation covers the iteration again when the charge was paid from it: charges are paid
    from the reservation until it is used up and only then admitted on their own, so the job's latest
    charge was covered exactly when every charge of the job was (count = committed). The dataset's
    committed cost is recomputed from the remaining charges."""
    with transaction(bind) as conn:
        row = _lock_budget(conn, charge.dataset)
        of_job = charges.c.job_id == charge.job_id
        charged = int(conn.execute(select(func.count()).where(of_job)).scalar_one())
        removed = conn.execute(
            delete(charges).where(
                of_job, charges.c.iteration == charge.iteration, charges.c.attempt == charge.attempt
            )
        ).rowcount
        if not removed:
            return False
        conn.execute(
            update(reservations)
            .where(
                reservations.c.job_id == charge.job_id,
                reservations.c.committed == charged,
                reservations.c.committed > 0,
            )
            .values(committed=reservations.c.committed - 1)
        )
        committed = _committed_from_events(conn, row.dataset, configured_accountant())
        conn.execute(
            update(budgets)
            .where(budgets.c.dataset == row.dataset)
            .values(committed_curve=_json_curve(committed), updated_at=_now())
        )
    return True


def charged_iterations(engine: Engine, job_id: str) -> list[tuple[int, int]]:
    """(iteration, attempt) of every charge of a job, in order."""
    with reading(engine) as conn:
        rows = conn.execute(
            select(charges.c.iteration, charges.c.attempt)
            .where(charges.c.job_id == job_id)
            .order_by(charges.c.iteration, charges.c.attempt)
        )
        return [(int(r[0]), int(r[1])) for r in rows]


def job_epsilon_spent(engine: Engine, job_id: str, delta: float) -> float:
    """Epsilon of the charges a job has committed so far, on their own, at the given delta."""
    accountant = configured_accountant()
    total = accountant.zero()
    with reading(engine) as conn:
        for (event,) in conn.execute(select(charges.c.event).where(charges.c.job_id == job_id)):
            total = total + _event_cost(event, accountant)
    return total.epsilon(delta)


def ledger_entries(
    engine: Engine, dataset: str, *, after: int | None = None, limit: int | None = None
) -> list[dict[str, Any]]:
    """The audit log of a dataset: every charge with its event, in order of its id; with `after` only the
    charges whose id is greater, with `limit` at most that many (one page)."""
    query = select(charges).where(charges.c.dataset == dataset).order_by(charges.c.id)
    if after is not None:
        query = query.where(charges.c.id > after)
    if limit is not None:
        query = query.limit(limit)
    with reading(engine) as conn:
        rows = conn.execute(query)
        return [
            {
                "id": int(r.id),
                "job_id": r.job_id,
                "iteration": r.iteration,
                "attempt": r.attempt,
                "event": r.event,
                "accountant": r.accountant,
                "created_at": r.created_at.isoformat(),
            }
            for r in rows
        ]


def charges_per_job(engine: Engine, dataset: str) -> list[dict[str, Any]]:
    """Per job with charges on the dataset, in order of its first charge: its charge count and its
    distinct charged iterations (pricing them is the accountant's business, not this count's)."""
    with reading(engine) as conn:
        rows = conn.execute(
            select(
                charges.c.job_id,
                func.count().label("charges"),
                func.count(func.distinct(charges.c.iteration)).label("iterations"),
                func.min(charges.c.id).label("first"),
            )
            .where(charges.c.dataset == dataset)
            .group_by(charges.c.job_id)
            .order_by(func.min(charges.c.id))
        ).all()
    return [{"job_id": r.job_id, "charges": int(r.charges), "iterations": int(r.iterations)} for r in rows]


def ledger_charges(conn: Connection, dataset: str) -> tuple[int, int | None, tuple[Any, ...] | None]:
    """The dataset's charge count, last charge id and that charge's (job, iteration, attempt): SQLite gives
    a new charge the id of a withdrawn last one, so count and id alone could repeat a past state."""
    count, last = conn.execute(
        select(func.count(), func.max(charges.c.id)).where(charges.c.dataset == dataset)
    ).one()
    which = None
    if last is not None:
        row = conn.execute(
            select(charges.c.job_id, charges.c.iteration, charges.c.attempt).where(charges.c.id == last)
        ).one_or_none()
        which = tuple(row) if row is not None else None
    return int(count), last, which


def count_charges(engine: Engine, dataset: str) -> int:
    with reading(engine) as conn:
        return int(conn.execute(select(func.count()).where(charges.c.dataset == dataset)).scalar_one())


@dataclass(frozen=True)
class SqlLedger:
    """The gate's Ledger protocol over the control database (a job may hold one connection for it); a
    charge beyond its job's reservation must also pass `check` (commit_charge)."""

    bind: Bind
    check: ChargeCheck | None = None

    def commit(self, charge: Charge) -> None:
        commit_charge(self.bind, charge, self.check)

    def withdraw(self, charge: Charge) -> None:
        withdraw_charge(self.bind, charge)
