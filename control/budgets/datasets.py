"""Datasets and their budgets as the API reads them: the dataset row, its budget status, the uncapped
budget a public dataset gets on first use, and JSON's view of an unbounded epsilon."""

from __future__ import annotations

import math
from typing import Any

from sqlalchemy import Engine, Row, select
from sqlalchemy.exc import IntegrityError

from control.errors import Conflict
from privacy_wall.ledger import database as ledger_db
from privacy_wall.ledger.schema import datasets
from privacy_wall.sqlengine import reading

#: The delta of the budget row created on a public dataset's first use (no epsilon cap).
PUBLIC_DEFAULT_DELTA = 1e-5


def finite(value: float | None) -> float | None:
    """JSON has no infinity: an unbounded epsilon (sigma 0) is reported as null."""
    return value if value is not None and math.isfinite(value) else None


def load_dataset(engine: Engine, name: str) -> Row[Any] | None:
    with reading(engine) as conn:
        return conn.execute(select(datasets).where(datasets.c.name == name)).one_or_none()


def budget_or_none(engine: Engine, name: str) -> ledger_db.BudgetStatus | None:
    try:
        return ledger_db.budget_status(engine, name)
    except ledger_db.UnknownDataset:
        return None


def ensure_budget_delta(engine: Engine, dataset: Row[Any]) -> float:
    """The delta of the dataset's budget (read without pricing its spend); a public dataset gets an
    uncapped budget on first use; a private one needs one (409)."""
    delta = ledger_db.budget_delta(engine, dataset.name)
    if delta is not None:
        return delta
    if not dataset.public:
        raise Conflict(f"the custodian has not set a budget for dataset {dataset.name}")
    try:
        return ledger_db.set_budget(engine, dataset.name, None, PUBLIC_DEFAULT_DELTA).delta
    except IntegrityError:  # a concurrent first use created it
        created = ledger_db.budget_delta(engine, dataset.name)
        assert created is not None
        return created


def exhausted(epsilon: float | None, epsilon_spent: float) -> bool:
    """Is a cap at or below what is already spent (so that no job, whatever its epsilon, can be admitted)?"""
    return epsilon is not None and epsilon_spent > 0 and epsilon <= epsilon_spent


def budget_warning(name: str, epsilon: float | None, epsilon_spent: float) -> str | None:
    """What `budget set` warns when the cap is at or below the spend (exhausted); None otherwise."""
    if not exhausted(epsilon, epsilon_spent):
        return None
    return (
        f"dataset {name}: the budget epsilon {epsilon:g} is at or below the epsilon already spent "
        f"({epsilon_spent:.4g}): no job can be admitted until the budget is raised above it"
    )


def public_cap_refusal(name: str) -> str:
    """Why a public dataset takes no epsilon cap, neither a budget's nor a key's quota (docs/design.md
    section 3, public datasets)."""
    return (
        f"dataset {name} is public: it takes no epsilon cap (budget or key quota), since its data needs no "
        "privacy and its sigma-0 jobs spend an unbounded epsilon that any cap would refuse; set only its "
        f"delta (`vips budget set {name} --delta D` without --epsilon; epsilon null in the API), or ingest "
        "the rows without --public to protect them with a budget"
    )
