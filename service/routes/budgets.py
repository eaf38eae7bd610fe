"""Budgets and the ledger of a dataset: its owning custodian or an admin."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from fastapi import APIRouter

from privacy_wall import ledger_db
from service.auth import AUTH_RESPONSES, CustodianKey
from service.deps import EngineDep
from service.jobs import Conflict, SpecError, aware, budget_or_none
from service.params import DatasetNamePath
from service.routes.datasets import budget_public, visible_dataset
from service.schemas import BudgetPublic, BudgetUpdate, LedgerEntry, LedgerPublic, Message

router = APIRouter(prefix="/datasets", tags=["budgets"], responses=AUTH_RESPONSES)

_ERRORS: dict[int | str, dict[str, Any]] = {404: {"model": Message}, 409: {"model": Message}}


@router.put("/{name}/budget", response_model=BudgetPublic, responses=_ERRORS)
def set_budget(
    name: DatasetNamePath, budget: BudgetUpdate, engine: EngineDep, principal: CustodianKey
) -> BudgetPublic:
    """Set the dataset's epsilon cap and delta (delta is fixed once anything was charged)."""
    row = visible_dataset(engine, principal, name, administer=True)
    if budget.epsilon is None and not row.public:
        raise SpecError([(("epsilon",), f"dataset {name} is private: it needs an epsilon cap (> 0)")])
    try:
        status = ledger_db.set_budget(engine, name, budget.epsilon, budget.delta)
    except ValueError as exc:  # delta cannot change after releases were charged
        raise Conflict(f"dataset {name}: {exc}") from None
    return budget_public(status)


@router.get("/{name}/ledger", response_model=LedgerPublic, responses={404: {"model": Message}})
def ledger(name: DatasetNamePath, engine: EngineDep, principal: CustodianKey) -> LedgerPublic:
    """The audit log: every charged release with its event, and the budget's status (null if unset)."""
    visible_dataset(engine, principal, name, administer=True)
    status = budget_or_none(engine, name)
    entries = [
        LedgerEntry(
            job_id=e["job_id"],
            iteration=e["iteration"],
            attempt=e["attempt"],
            event=e["event"],
            accountant=e["accountant"],
            created_at=aware(datetime.fromisoformat(e["created_at"])),
        )
        for e in ledger_db.ledger_entries(engine, name)
    ]
    return LedgerPublic(
        dataset=name, budget=None if status is None else budget_public(status), entries=entries
    )
