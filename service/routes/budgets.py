"""Budgets and the ledger of a dataset: its owning custodian or an admin."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.exceptions import RequestValidationError
from sqlalchemy import select

from control.budgets.charge_outcomes import charge_outcomes
from control.budgets.datasets import budget_or_none, budget_warning, finite, public_cap_refusal
from control.budgets.job_costs import epsilon_spent
from control.errors import Conflict, SpecError
from control.schemas import (
    BudgetSet,
    BudgetUpdate,
    LedgerEntry,
    LedgerJob,
    LedgerJobs,
    LedgerPublic,
    Message,
)
from control.store.keys import key_names
from control.store.models import jobs
from control.store.timestamps import aware
from privacy_wall.accounting.weak import weak_privacy_problem
from privacy_wall.ledger import database as ledger_db
from privacy_wall.ledger.delta_policy import DeltaTooLarge
from privacy_wall.sqlengine import reading
from service.http.auth import AUTH_RESPONSES, CustodianKey
from service.http.deps import EngineDep
from service.http.params import DatasetNamePath, decimal_digits
from service.routes.datasets import budget_public, visible_dataset

router = APIRouter(prefix="/datasets", tags=["budgets"], responses=AUTH_RESPONSES)

_ERRORS: dict[int | str, dict[str, Any]] = {404: {"model": Message}, 409: {"model": Message}}


@router.put("/{name}/budget", response_model=BudgetSet, responses=_ERRORS)
def set_budget(
    name: DatasetNamePath, budget: BudgetUpdate, engine: EngineDep, principal: CustodianKey
) -> BudgetSet:
    """Set the dataset's epsilon cap and delta (delta is fixed once anything was charged). A private
    dataset's delta must be below 1/N, N its record count (422 otherwise; delta << 1/N is the usual
    choice). A public dataset takes no cap (epsilon null; 422 otherwise): its sigma-0 jobs spend an
    unbounded epsilon, which any cap would refuse. A cap at or below what is already spent is accepted,
    with a `warning` that no job can be admitted. A cap above epsilon 10 needs weak_privacy_ok (422
    otherwise: privacy_wall.accounting.weak)."""
    row = visible_dataset(engine, principal, name, administer=True)
    if budget.epsilon is None and not row.public:
        raise SpecError([(("epsilon",), f"dataset {name} is private: it needs an epsilon cap (> 0)")])
    if budget.epsilon is not None and row.public:
        raise SpecError([(("epsilon",), public_cap_refusal(name))])
    weak = (
        None
        if budget.epsilon is None
        else weak_privacy_problem("a cap", budget.epsilon, budget.weak_privacy_ok)
    )
    if weak is not None:
        raise SpecError([(("weak_privacy_ok",), weak)])
    try:
        status = ledger_db.set_budget(engine, name, budget.epsilon, budget.delta)
    except DeltaTooLarge as exc:  # not below 1/N of the dataset
        raise SpecError([(("delta",), str(exc))]) from None
    except ValueError as exc:  # delta cannot change after releases were charged
        raise Conflict(f"dataset {name}: {exc}") from None
    warning = budget_warning(name, status.epsilon_budget, status.epsilon_spent)
    return BudgetSet(**budget_public(status).model_dump(), warning=warning)


def _after(cursor: str | None) -> int | None:
    """The charge id a cursor stands for (it is the last id of the previous page, opaque to clients)."""
    if cursor is None:
        return None
    after = decimal_digits(cursor)
    if after is None:
        raise RequestValidationError(
            [
                {
                    "type": "value_error",
                    "loc": ("query", "cursor"),
                    "msg": "not a cursor of this ledger: pass the next_cursor of the previous page",
                    "input": cursor,
                }
            ]
        )
    return after


@router.get("/{name}/ledger", response_model=LedgerPublic, responses={404: {"model": Message}})
def ledger(
    name: DatasetNamePath,
    engine: EngineDep,
    principal: CustodianKey,
    limit: Annotated[int, Query(ge=1, le=1000, description="entries per page")] = 100,
    cursor: Annotated[
        str | None, Query(max_length=64, description="the next_cursor of the previous page")
    ] = None,
) -> LedgerPublic:
    """The audit log, one page at a time (oldest first): every charged release with its event and whether
    the release was kept (`released`), and the budget's status (null if unset). Follow `next_cursor` until
    it is null to read every entry once."""
    visible_dataset(engine, principal, name, administer=True)
    after = _after(cursor)
    status = budget_or_none(engine, name)
    rows = ledger_db.ledger_entries(engine, name, after=after, limit=limit + 1)
    more = len(rows) > limit
    outcomes = charge_outcomes(engine, rows[:limit])
    entries = [
        LedgerEntry(
            id=e["id"],
            job_id=e["job_id"],
            iteration=e["iteration"],
            attempt=e["attempt"],
            event=e["event"],
            accountant=e["accountant"],
            created_at=aware(datetime.fromisoformat(e["created_at"])),
            released=outcomes.get(e["id"]),
        )
        for e in rows[:limit]
    ]
    return LedgerPublic(
        dataset=name,
        budget=None if status is None else budget_public(status),
        entries=entries,
        next_cursor=str(entries[-1].id) if more else None,
    )


@router.get("/{name}/ledger/jobs", response_model=LedgerJobs, responses={404: {"model": Message}})
def ledger_jobs(name: DatasetNamePath, engine: EngineDep, principal: CustodianKey) -> LedgerJobs:
    """Per job on the dataset: the name of the key that submitted it, its status, the iterations
    charged and the epsilon its charges cost on their own at the dataset's delta (the dataset's spend is
    their composition, in the budget, not their sum). Jobs with charges come first, in order of their
    first charge; then the uncharged ones."""
    visible_dataset(engine, principal, name, administer=True)
    status = budget_or_none(engine, name)
    charged = ledger_db.charges_per_job(engine, name)
    with reading(engine) as conn:
        rows = conn.execute(
            select(jobs.c.id, jobs.c.status, jobs.c.owner)
            .where(jobs.c.dataset == name)
            .order_by(jobs.c.created_at)
        ).all()
    statuses: dict[str, Any] = {row.id: row.status for row in rows}
    owners: dict[str, str] = {row.id: row.owner for row in rows}
    names = key_names(engine, owners.values())
    summary = [(c["job_id"], c["iterations"], c["charges"]) for c in charged]
    seen = {job_id for job_id, _, _ in summary}
    summary += [(row.id, 0, 0) for row in rows if row.id not in seen]
    spent = (
        {} if status is None else epsilon_spent(engine, {job_id: status.delta for job_id, _, _ in summary})
    )
    return LedgerJobs(
        dataset=name,
        delta=None if status is None else status.delta,
        jobs=[
            LedgerJob(
                job_id=job_id,
                key_name=names.get(owners.get(job_id, "")),
                status=statuses.get(job_id),
                iterations_charged=iterations,
                charges=count,
                epsilon_spent=finite(spent[job_id]) if job_id in spent else None,
            )
            for job_id, iterations, count in summary
        ],
    )
