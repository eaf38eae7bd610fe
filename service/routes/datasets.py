"""Datasets: their public metadata with the budget and its spend."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import APIRouter
from sqlalchemy import Engine, Row, select

from control.budgets.datasets import budget_or_none, load_dataset
from control.errors import NotFound
from control.schemas import BudgetPublic, DatasetDetail, DatasetPublic, Message
from control.store.keys import Principal
from control.store.timestamps import aware
from privacy_wall.ledger import database as ledger_db
from privacy_wall.ledger.schema import datasets
from privacy_wall.names import did_you_mean
from privacy_wall.sqlengine import reading
from service.http.auth import AUTH_RESPONSES, CurrentKey, owns_dataset, sees_dataset
from service.http.deps import EngineDep
from service.http.params import DatasetNamePath

router = APIRouter(prefix="/datasets", tags=["datasets"], responses=AUTH_RESPONSES)


def budget_public(status: ledger_db.BudgetStatus) -> BudgetPublic:
    return BudgetPublic(
        epsilon=status.epsilon_budget,
        delta=status.delta,
        epsilon_spent=status.epsilon_spent,
        epsilon_reserved=status.epsilon_reserved,
        epsilon_remaining=status.epsilon_remaining,
    )


def visible_dataset(engine: Engine, principal: Principal, name: str, *, administer: bool = False) -> Row[Any]:
    """The dataset row if this key may see (or administer) it; otherwise 404, as if it did not exist."""
    row = load_dataset(engine, name)
    allowed = owns_dataset if administer else sees_dataset
    if row is None or not allowed(principal, row):
        raise NotFound(f"dataset {name} not found{did_you_mean(name, _names(engine, principal, allowed))}")
    return row


def _names(engine: Engine, principal: Principal, allowed: Callable[[Principal, Any], bool]) -> list[str]:
    """The names of the datasets this key may see (or administer): the only ones a 404 may suggest."""
    with reading(engine) as conn:
        rows = conn.execute(select(datasets.c.name, datasets.c.owner)).all()
    return [row.name for row in rows if allowed(principal, row)]


def _public(engine: Engine, row: Row[Any]) -> dict[str, Any]:
    status = budget_or_none(engine, row.name)
    return {
        "name": row.name,
        "kind": row.kind,
        "population": row.population,
        "dimension": row.dimension,
        "public": bool(row.public),
        "created_at": aware(row.created_at),
        "budget": None if status is None else budget_public(status),
    }


@router.get("", response_model=list[DatasetPublic])
def list_datasets(engine: EngineDep, principal: CurrentKey) -> list[DatasetPublic]:
    """The datasets this key may see (custodians: their own; scoped clients: their one)."""
    with reading(engine) as conn:
        rows = conn.execute(select(datasets).order_by(datasets.c.name)).all()
    return [DatasetPublic(**_public(engine, row)) for row in rows if sees_dataset(principal, row)]


@router.get("/{name}", response_model=DatasetDetail, responses={404: {"model": Message}})
def show_dataset(name: DatasetNamePath, engine: EngineDep, principal: CurrentKey) -> DatasetDetail:
    """One dataset with its schema (column names or vocabulary) and its budget."""
    row = visible_dataset(engine, principal, name)
    return DatasetDetail(**_public(engine, row), data_schema=dict(row.schema))
